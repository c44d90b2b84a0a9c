"""Reductions of a container: over every element of each leaf, over batch dims, or together.

Every reduction takes the same ``dim`` forms as tensordict:

- not given: each leaf is reduced over all its elements; the result is a container
  of scalar leaves with ``batch_size=[]`` (with ``keepdim=True``, as ``torch.amax``,
  every leaf keeps its dims with size 1, and every batch dim is 1);
- an int or a tuple of ints: those batch dims are reduced in every leaf (negative
  dims count from the end of the batch dims), ``keepdim`` keeps them with size 1;
- ``"feature"``: the dims after the batch dims are reduced; the batch size stays.

``reduce=True`` reduces all the leaves together and returns one tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..helpers.dims import NO_DIM, batch_dims, one_batch_dim, single_dim
from ..helpers.leafwise import drop_names, map_leaves, no_names, non_tensor_with, tensor_leaves
from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData
from ..helpers.rewrap import rewrap
from ..helpers.sizes import normalize_dim

_ONE = torch.Size([1])
_NO_LEAD = torch.Size()


def _feature_flat(tensor: torch.Tensor, ndim: int) -> torch.Tensor:
    """``tensor`` with its dims after ``ndim`` merged into one last dim (added if none)."""
    return tensor.flatten(ndim) if tensor.dim() > ndim else tensor.unsqueeze(-1)


def _reduce(
    self: Any, api: str, op: Callable, dim: Any, keepdim: Any, reduce: Any, lead=_NO_LEAD
) -> Any:
    """Reduce as ``dim`` asks; ``op(dims, keepdim)`` gives the function of one leaf
    (``dims`` None: over every element). ``lead``: dims the op puts before the kept
    dims of every leaf (several quantiles): they lead the batch size of the result
    when batch dims are kept."""
    keep = bool(keepdim) if keepdim is not NO_DIM else False
    ndim = len(self._batch_size)
    if dim is NO_DIM or dim is None:
        if reduce:
            leaves = tensor_leaves(self)
            if not leaves:
                raise ValueError(f"TensorDict.{api}: reduce=True needs at least one tensor leaf.")
            return op(None, False)(torch.cat([t.reshape(-1) for t in leaves]))
        if keep:  # as torch's amax(keepdim=True): every dim kept, of size 1
            return _kept_tree(self, op(None, False), lead)
        return map_leaves(self, op(None, False), torch.Size(()), False, no_names)
    if dim == "feature":
        if keep:
            raise ValueError(f"TensorDict.{api}: keepdim=True is not allowed with dim='feature'.")
        if reduce:
            flat = [_feature_flat(t, ndim) for t in tensor_leaves(self)]
            return op((-1,), False)(torch.cat(flat, -1))
        return _feature_tree(self, op((-1,), False), lead)
    if reduce:
        joined, dims = _joined(self, dim, api)
        return op(dims, keep)(joined)
    dims = batch_dims(self, dim, api)
    size = self._batch_size
    if len(dims) == 1:
        (d,) = dims
        new_size = size[:d] + _ONE + size[d + 1 :] if keep else size[:d] + size[d + 1 :]
    elif keep:
        new_size = torch.Size(1 if d in dims else s for d, s in enumerate(size))
    else:
        new_size = torch.Size(s for d, s in enumerate(size) if d not in dims)
    names = drop_names(dims, keep)
    if lead:
        new_size = lead + new_size
        names = _led(names, len(lead))
    return map_leaves(self, op(dims, keep), new_size, True, names)


def _led(names: Callable, count: int) -> Callable:
    """``names`` with ``count`` unnamed dims in front."""

    def led(level: tuple | None) -> tuple | None:
        kept = names(level)
        return None if kept is None else (None,) * count + tuple(kept)

    return led


def _feature_tree(container: Any, leaf: Callable, lead=_NO_LEAD) -> Any:
    """Reduce every leaf over its feature dims: the dims after its own level's batch dims
    (``lead``: dims ``leaf`` puts in front, which lead every level's batch size)."""
    view = container._to_tensordict_view()
    ndim = len(view._batch_size)
    data = {}
    for key, value in view._data.items():
        if isinstance(value, torch.Tensor):
            data[key] = leaf(_feature_flat(value, ndim))
        elif getattr(type(value), "_is_tensor_collection", False):
            data[key] = _feature_tree(value, leaf, lead)
        elif lead and isinstance(value, NonTensorData):
            data[key] = non_tensor_with(value, lead + view._batch_size, ndim, True, key)
        else:
            data[key] = value
    if lead:
        names = view._names
        names = None if names is None else (None,) * len(lead) + tuple(names)
        result = view._like(data, lead + view._batch_size, names)
    else:
        result = view._like(data)
    return rewrap(container, result)


def _kept_tree(container: Any, leaf: Callable, lead=_NO_LEAD) -> Any:
    """Reduce every leaf over all its elements, keeping each of its dims with size 1; every
    level's batch dims become ones too (``lead``: dims ``leaf`` puts in front)."""
    view = container._to_tensordict_view()
    ndim = len(view._batch_size)
    size = lead + torch.Size([1] * ndim)
    data = {}
    for key, value in view._data.items():
        if isinstance(value, torch.Tensor):
            reduced = leaf(value)
            data[key] = reduced.reshape(reduced.shape + (1,) * value.dim())
        elif getattr(type(value), "_is_tensor_collection", False):
            data[key] = _kept_tree(value, leaf, lead)
        elif isinstance(value, NonTensorData):
            data[key] = non_tensor_with(value, size, ndim, True, key)
        else:
            data[key] = value
    names = view._names
    names = None if names is None else (None,) * len(lead) + tuple(names)
    return rewrap(container, view._like(data, size, names))


def _joined(self: Any, dim: Any, api: str) -> tuple:
    """The leaves concatenated along the first of ``dim`` (dims of the leaves), and the dims.

    With ``reduce=True`` a dim counts over the dims of each leaf (all leaves must have the
    same number of dims), as in tensordict.
    """
    leaves = tensor_leaves(self)
    ranks = sorted({t.dim() for t in leaves})
    if len(ranks) != 1:
        raise ValueError(
            f"TensorDict.{api}: reduce=True with dim={dim!r} concatenates the leaves along that "
            f"dim, so they must have the same number of dims; got {ranks}. Reduce each leaf "
            f"first (reduce=False)."
        )
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    dims = tuple(sorted({normalize_dim(d, ranks[0], f"TensorDict.{api}") for d in dims}))
    return torch.cat(leaves, dims[0]), dims


def _simple(method: str, **fixed: Any) -> Callable:
    """``op`` for a torch reduction method taking ``dim``/``keepdim`` (tuples allowed)."""
    fn = getattr(torch.Tensor, method)

    def make(dims: tuple | None, keep: bool) -> Callable:
        if dims is None:
            return (lambda t: fn(t, **fixed)) if fixed else fn
        if len(dims) == 1 and not fixed:  # an int dim, no keyword: torch's fastest call
            (d,) = dims
            return (lambda t: fn(t, d, keepdim=True)) if keep else (lambda t: fn(t, d))
        return lambda t: fn(t, dims, keepdim=keep, **fixed)

    return make


def _one_dim_at_a_time(method: str, **fixed: Any) -> Callable:
    """``op`` for a torch reduction that takes a single dim (``prod``)."""
    fn = getattr(torch.Tensor, method)

    def make(dims: tuple | None, keep: bool) -> Callable:
        if dims is None:
            return lambda t: fn(t, **fixed)
        order = sorted(dims, reverse=True)

        def leaf(t: torch.Tensor) -> torch.Tensor:
            for d in order:
                t = fn(t, d, keepdim=keep, **fixed)
            return t

        return leaf

    return make


def _std_var(method: str, correction: int) -> Callable:
    fn = getattr(torch.Tensor, method)

    def make(dims: tuple | None, keep: bool) -> Callable:
        if dims is None:
            return lambda t: fn(t, correction=correction)
        target = dims[0] if len(dims) == 1 else dims
        return lambda t: fn(t, target, correction=correction, keepdim=keep)

    return make


def _values_indices(kind: Any, values: Any, indices: Any, return_indices: bool) -> Any:
    return kind((values, indices)) if return_indices else values


class ReductionsMixin(ContainerMixin):
    """Reductions and scans of a container (``sum``, ``mean``, ``max``, ``cumsum``...).

    Example:
        >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3)}, [2])
        >>> td.sum()["a"], td.sum(0)["a"].tolist(), td.sum(reduce=True)
        (tensor(15.), [3.0, 5.0, 7.0], tensor(15.))
    """

    __slots__ = ()

    def sum(
        self,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        dtype=None,
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The sum of every leaf (see the module docstring for ``dim`` and ``reduce``).

        Example:
            >>> td = TensorDict({"a": torch.ones(2, 3), "b": {"c": torch.ones(2)}}, [2])
            >>> td.sum(0)["a"].tolist(), td.sum("feature")["a"].tolist(), td.sum(reduce=True)
            ([2.0, 2.0, 2.0], [3.0, 3.0], tensor(8.))
        """
        op = _simple("sum", dtype=dtype) if dtype is not None else _simple("sum")
        return _keyed(_reduce(self, "sum", op, dim, keepdim, reduce), key_transform)

    def nansum(
        self,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        dtype=None,
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The sum of the non-NaN elements of every leaf.

        Example:
            >>> TensorDict({"a": torch.tensor([1.0, float("nan")])}, [2]).nansum()["a"]
            tensor(1.)
        """
        op = _simple("nansum", dtype=dtype) if dtype is not None else _simple("nansum")
        return _keyed(_reduce(self, "nansum", op, dim, keepdim, reduce), key_transform)

    def mean(
        self,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        dtype=None,
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The mean of every leaf.

        Example:
            >>> td = TensorDict({"a": torch.arange(4.0).reshape(2, 2)}, [2])
            >>> td.mean()["a"], td.mean(0, keepdim=True)["a"].tolist()
            (tensor(1.5000), [[1.0, 2.0]])
            >>> list(td.mean(key_transform=lambda key: f"avg_{key}").keys())
            ['avg_a']

        ``key_transform`` (here and in ``sum``, ``nansum``, ``nanmean``, ``std``,
        ``var``, ``quantile`` and ``norm``) renames the keys of the result, at every
        level; it is not applied with ``reduce=True`` (a tensor has no keys).
        """
        op = _simple("mean", dtype=dtype) if dtype is not None else _simple("mean")
        return _keyed(_reduce(self, "mean", op, dim, keepdim, reduce), key_transform)

    def nanmean(
        self,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        dtype=None,
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The mean of the non-NaN elements of every leaf.

        Example:
            >>> TensorDict({"a": torch.tensor([1.0, float("nan")])}, [2]).nanmean()["a"]
            tensor(1.)
        """
        op = _simple("nanmean", dtype=dtype) if dtype is not None else _simple("nanmean")
        return _keyed(_reduce(self, "nanmean", op, dim, keepdim, reduce), key_transform)

    def std(
        self,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        correction: int = 1,
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The standard deviation of every leaf (``correction=1``: Bessel's).

        Example:
            >>> TensorDict({"a": torch.tensor([1.0, 3.0])}, [2]).std()["a"]
            tensor(1.4142)
        """
        out = _reduce(self, "std", _std_var("std", correction), dim, keepdim, reduce)
        return _keyed(out, key_transform)

    def var(
        self,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        correction: int = 1,
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The variance of every leaf.

        Example:
            >>> TensorDict({"a": torch.tensor([1.0, 3.0])}, [2]).var(0)["a"]
            tensor(2.)
        """
        out = _reduce(self, "var", _std_var("var", correction), dim, keepdim, reduce)
        return _keyed(out, key_transform)

    def quantile(
        self,
        q: Any,
        dim: Any = NO_DIM,
        keepdim: Any = NO_DIM,
        *,
        interpolation: str = "linear",
        reduce=None,
        key_transform: Callable | None = None,
    ):
        """The ``q``-th quantile of every leaf (``torch.quantile``; ``dim`` as for ``sum``).

        A 1-D tensor ``q`` of several quantiles adds a leading dim of its size to every
        leaf, as ``torch.quantile`` does; where batch dims are kept (``dim`` given, or
        ``"feature"``) it leads the batch size of the result too.

        Example:
            >>> td = TensorDict({"a": torch.tensor([[1.0, 2.0], [3.0, 5.0]])}, [2])
            >>> td.quantile(0.5)["a"], td.quantile(0.5, dim=0)["a"].tolist()
            (tensor(2.5000), [2.0, 3.5])
            >>> td.quantile(torch.tensor([0.0, 1.0]), dim=0).batch_size
            torch.Size([2])
        """
        if isinstance(q, (list, tuple)):
            q = torch.tensor(q)
        several = isinstance(q, torch.Tensor) and q.dim() > 0
        lead = q.shape if several else torch.Size()
        given = q

        def make(dims: tuple | None, keep: bool) -> Callable:
            def leaf(t: torch.Tensor) -> torch.Tensor:
                # integers and bools as floats (torch.quantile takes floats only); a complex
                # leaf stays complex, for torch to refuse rather than drop its imaginary part
                t = t if t.is_floating_point() or t.is_complex() else t.float()
                q = given  # torch.quantile wants q of the leaf's dtype and device
                if isinstance(q, torch.Tensor) and (q.dtype != t.dtype or q.device != t.device):
                    q = q.to(t.device, t.dtype)
                if dims is None:
                    return torch.quantile(t.reshape(-1), q, interpolation=interpolation)
                if len(dims) == 1:
                    return torch.quantile(t, q, dims[0], keep, interpolation=interpolation)
                rank = t.dim()
                ds = [d % rank for d in dims]
                rest = [d for d in range(rank) if d not in ds]
                moved = t.permute(rest + ds).flatten(len(rest))
                out = torch.quantile(moved, q, -1, False, interpolation=interpolation)
                if keep:
                    for d in sorted(ds):
                        out = out.unsqueeze(d + len(lead))
                return out

            return leaf

        out = _reduce(self, "quantile", make, dim, keepdim, reduce, lead)
        return _keyed(out, key_transform)

    def prod(self, dim: Any = NO_DIM, keepdim: Any = NO_DIM, *, dtype=None, reduce=None):
        """The product of every leaf.

        Example:
            >>> TensorDict({"a": torch.tensor([2.0, 3.0])}, [2]).prod()["a"]
            tensor(6.)
        """
        fixed = {} if dtype is None else {"dtype": dtype}
        return _reduce(self, "prod", _one_dim_at_a_time("prod", **fixed), dim, keepdim, reduce)

    def amax(self, dim: Any = NO_DIM, keepdim: bool = False, *, reduce=None):
        """The maximum of every leaf (values only).

        Example:
            >>> TensorDict({"a": torch.tensor([2.0, 3.0])}, [2]).amax()["a"]
            tensor(3.)
        """
        return _reduce(self, "amax", _simple("amax"), dim, keepdim, reduce)

    def amin(self, dim: Any = NO_DIM, keepdim: bool = False, *, reduce=None):
        """The minimum of every leaf (values only).

        Example:
            >>> TensorDict({"a": torch.tensor([2.0, 3.0])}, [2]).amin(0)["a"]
            tensor(2.)
        """
        return _reduce(self, "amin", _simple("amin"), dim, keepdim, reduce)

    def _extremum(self, api: str, dim: Any, keepdim: bool, reduce: Any, return_indices: bool):
        kind = getattr(torch.return_types, api)
        if dim is NO_DIM or dim is None or dim == "feature":
            return _reduce(
                self, api, _simple("amax" if api == "max" else "amin"), dim, keepdim, reduce
            )
        if reduce:
            joined, (d,) = _joined(self, single_dim(dim, api), api)
            values, indices = getattr(joined, api)(d, keepdim=keepdim)
            return _values_indices(kind, values, indices, return_indices)
        d = one_batch_dim(self, dim, api)
        pairs: dict = {}

        def values_of(t: torch.Tensor) -> torch.Tensor:
            result = getattr(t, api)(d, keepdim=keepdim)
            pairs[id(result.values)] = result.indices
            return result.values

        size = self._batch_size
        new_size = size[:d] + ((1,) if keepdim else ()) + size[d + 1 :]
        values = map_leaves(self, values_of, torch.Size(new_size), True, drop_names((d,), keepdim))
        if not return_indices:
            return values
        indices = map_leaves(values, lambda v: pairs[id(v)], None, True, None)
        return kind((values, indices))

    def max(self, dim: Any = NO_DIM, keepdim: bool = False, *, reduce=None, return_indices=True):
        """The maximum of every leaf; with ``dim``, a ``(values, indices)`` named tuple.

        Example:
            >>> td = TensorDict({"a": torch.tensor([2.0, 5.0, 1.0])}, [3])
            >>> td.max()["a"], td.max(0).indices["a"]
            (tensor(5.), tensor(1))
        """
        return self._extremum("max", dim, keepdim, reduce, return_indices)

    def min(self, dim: Any = NO_DIM, keepdim: bool = False, *, reduce=None, return_indices=True):
        """The minimum of every leaf; with ``dim``, a ``(values, indices)`` named tuple.

        Example:
            >>> td = TensorDict({"a": torch.tensor([2.0, 5.0, 1.0])}, [3])
            >>> td.min(0).values["a"], td.min(0).indices["a"]
            (tensor(1.), tensor(2))
        """
        return self._extremum("min", dim, keepdim, reduce, return_indices)

    def _scan_pair(self, api: str, dim: Any, reduce: Any, return_indices: bool):
        kind = getattr(torch.return_types, api)
        if reduce:
            joined, (d,) = _joined(self, single_dim(dim, api), api)
            values, indices = getattr(joined, api)(d)
            return _values_indices(kind, values, indices, return_indices)
        d = one_batch_dim(self, dim, api)
        pairs: dict = {}

        def values_of(t: torch.Tensor) -> torch.Tensor:
            result = getattr(t, api)(d)
            pairs[id(result.values)] = result.indices
            return result.values

        values = map_leaves(self, values_of, None, True, None)
        if not return_indices:
            return values
        return kind((values, map_leaves(values, lambda v: pairs[id(v)], None, True, None)))

    def cummax(self, dim: int, *, reduce=None, return_indices: bool = True):
        """The cumulative maximum along batch dim ``dim``: ``(values, indices)``.

        Example:
            >>> TensorDict({"a": torch.tensor([1.0, 3.0, 2.0])}, [3]).cummax(0).values["a"]
            tensor([1., 3., 3.])
        """
        return self._scan_pair("cummax", dim, reduce, return_indices)

    def cummin(self, dim: int, *, reduce=None, return_indices: bool = True):
        """The cumulative minimum along batch dim ``dim``: ``(values, indices)``.

        Example:
            >>> TensorDict({"a": torch.tensor([3.0, 1.0, 2.0])}, [3]).cummin(0).indices["a"]
            tensor([0, 1, 1])
        """
        return self._scan_pair("cummin", dim, reduce, return_indices)

    def cumsum(self, dim: int, *, dtype=None):
        """The cumulative sum along batch dim ``dim``.

        Example:
            >>> TensorDict({"a": torch.ones(3)}, [3]).cumsum(0)["a"]
            tensor([1., 2., 3.])
        """
        d = one_batch_dim(self, dim, "cumsum")
        return map_leaves(self, lambda t: t.cumsum(d, dtype=dtype), None, True, None, moves=True)

    def cumprod(self, dim: int, *, dtype=None):
        """The cumulative product along batch dim ``dim``.

        Example:
            >>> TensorDict({"a": torch.tensor([1.0, 2.0, 3.0])}, [3]).cumprod(0)["a"]
            tensor([1., 2., 6.])
        """
        d = one_batch_dim(self, dim, "cumprod")
        return map_leaves(self, lambda t: t.cumprod(d, dtype=dtype), None, True, None, moves=True)

    def logsumexp(self, dim: Any = None, keepdim: bool = False, *, out=None):
        """The log of summed exponentials along batch dims (all of them without ``dim``).

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).logsumexp()["a"]
            tensor([0.6931, 0.6931, 0.6931])
        """
        ndim = len(self._batch_size)
        target = tuple(range(ndim)) if dim is None else dim
        if dim is None and not ndim:
            result = map_leaves(self, torch.Tensor.clone, None, True, None)
        else:
            result = _reduce(self, "logsumexp", _simple("logsumexp"), target, keepdim, None)
        if out is not None:
            out.update(result, inplace=True)
            return out
        return result

    def softmax(self, dim: int, dtype=None):
        """``torch.softmax`` of every leaf along batch dim ``dim``.

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).softmax(0)["a"][0]
            tensor([0.5000, 0.5000, 0.5000])
        """
        d = one_batch_dim(self, dim, "softmax")
        return map_leaves(self, lambda t: torch.softmax(t, d, dtype=dtype), None, True, None)

    def log_softmax(self, dim: int, dtype=None):
        """``torch.log_softmax`` of every leaf along batch dim ``dim``.

        Example:
            >>> TensorDict({"a": torch.zeros(2)}, [2]).log_softmax(0)["a"]
            tensor([-0.6931, -0.6931])
        """
        d = one_batch_dim(self, dim, "log_softmax")
        return map_leaves(self, lambda t: torch.log_softmax(t, d, dtype=dtype), None, True, None)

    def all(self, dim: Any = None):
        """True when every element of every leaf is true; with ``dim``, a container of bools.

        Example:
            >>> td = TensorDict({"a": torch.tensor([[True, False], [True, True]])}, [2, 2])
            >>> td.all(), td.all(1)["a"].tolist()
            (False, [False, True])
        """
        if dim is None:
            return all(bool(t.all()) for t in tensor_leaves(self))
        return _reduce(self, "all", _simple("all"), dim, False, None)

    def any(self, dim: Any = None):
        """True when some element of some leaf is true; with ``dim``, a container of bools.

        Example:
            >>> td = TensorDict({"a": torch.tensor([[True, False], [False, False]])}, [2, 2])
            >>> td.any(), td.any(1)["a"].tolist()
            (True, [True, False])
        """
        if dim is None:
            return any(bool(t.any()) for t in tensor_leaves(self))
        return _reduce(self, "any", _simple("any"), dim, False, None)

    def norm(self, *, out=None, dtype=None, key_transform: Callable | None = None):
        """A container with the 2-norm of each leaf (over all its elements), ``batch_size=[]``.

        Example:
            >>> td = TensorDict({"a": torch.full((3, 4), 2.0), "b": {"c": torch.ones(3)}}, [3])
            >>> norms = td.norm()
            >>> norms["a"], norms["b", "c"], norms.batch_size
            (tensor(6.9282), tensor(1.7321), torch.Size([]))
        """

        def leaf_norm(t: torch.Tensor) -> torch.Tensor:
            return torch.linalg.vector_norm(t if dtype is None else t.to(dtype))

        result = map_leaves(self, leaf_norm, torch.Size(()), False, no_names)
        if key_transform is not None:
            result = _rename_keys(result, key_transform)
        if out is not None:
            out.update(result, inplace=True)
            return out
        return result


def _keyed(result: Any, key_transform: Callable | None) -> Any:
    """``result`` with its keys renamed level by level (a reduced tensor is kept as is)."""
    if key_transform is None or isinstance(result, torch.Tensor):
        return result
    return _rename_keys(result, key_transform)


def _rename_keys(td: Any, key_transform: Callable) -> Any:
    from ..helpers.leafwise import is_collection
    from ..helpers.rewrap import rewrap

    data = {}
    for key, value in td._data.items():
        if is_collection(value):
            value = rewrap(value, _rename_keys(value._to_tensordict_view(), key_transform))
        data[key_transform(key)] = value
    return td._like(data)
