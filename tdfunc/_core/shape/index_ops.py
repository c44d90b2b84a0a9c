"""More indexing and shape ops over the batch dims: gather, where, masks, flips, tiles, pads.

Every op acts on the batch dims of each leaf (the feature dims follow along) and
gives the result the batch size and names torch would give a tensor of the batch
shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..helpers.dims import batch_dims, one_batch_dim
from ..helpers.leafwise import (
    check_grown,
    inplace_leaves,
    is_collection,
    keep_names,
    like_pair,
    map_leaves,
    may_grow,
    no_names,
)
from ..helpers.mixin import ContainerMixin
from ..helpers.nested_keys import key_parts
from ..helpers.nontensor import NonTensorData
from ..helpers.padding import pad_container
from ..helpers.reshape import _become
from ..helpers.rewrap import rewrap
from ..helpers.sizes import MaskShapeError, normalize_dim

_Tensor = torch.Tensor


def _align(mask: _Tensor, leaf: _Tensor) -> _Tensor:
    """``mask`` (over the leading dims) viewed with trailing size-1 dims to match ``leaf``."""
    extra = leaf.dim() - mask.dim()
    return mask.reshape(mask.shape + (1,) * extra) if extra > 0 else mask


def _check_mask(self: Any, mask: Any, api: str) -> _Tensor:
    if not isinstance(mask, _Tensor):
        raise TypeError(f"TensorDict.{api}: mask must be a tensor, got {type(mask).__name__}.")
    size = self._batch_size
    if mask.shape != size[: mask.dim()]:
        raise MaskShapeError(
            f"TensorDict.{api}: the mask has shape {list(mask.shape)}, which is not a leading "
            f"part of the batch size {list(size)}."
        )
    return mask


def _meta(size: torch.Size) -> _Tensor:
    return torch.empty(size, device="meta")


def _permuted(names: tuple | None, order: Sequence[int]) -> tuple | None:
    return None if names is None else tuple(names[d] for d in order)


class IndexOpsMixin(ContainerMixin):
    """``gather``, ``where``, ``masked_fill``, ``flip``, ``roll``, ``tile``, ``pad``, ...

    Example:
        >>> td = TensorDict({"a": torch.arange(3.0)}, [3])
        >>> td.flip(0)["a"].tolist(), td.roll(1, 0)["a"].tolist()
        ([2.0, 1.0, 0.0], [2.0, 0.0, 1.0])
    """

    __slots__ = ()

    # ------------------------------------------------------------------ selection
    def gather(self, dim: int, index: _Tensor, out: Any = None, *, inplace: bool = False):
        """``torch.gather`` along batch dim ``dim``; ``index`` has batch dims only.

        Example:
            >>> td = TensorDict({"a": torch.arange(6.0).reshape(2, 3, 1)}, [2, 3])
            >>> td.gather(1, torch.tensor([[2], [0]]))["a"].squeeze(-1).tolist()
            [[2.0], [3.0]]
        """
        if inplace and out is not None:
            raise ValueError(
                f"{type(self).__name__}.gather: out= and inplace=True are mutually exclusive "
                f"(inplace writes the result into this container)."
            )
        ndim = len(self._batch_size)
        d = one_batch_dim(self, dim, "gather")
        if index.dim() != ndim and inplace:
            raise NotImplementedError(
                f"{type(self).__name__}.gather(inplace=True): index.ndim ({index.dim()}) must "
                f"equal the batch dims ({ndim}); an in-place gather keeps the container's "
                f"rank. Call gather without inplace."
            )
        if index.dim() != ndim:
            raise ValueError(
                f"TensorDict.gather: index must have as many dims as the batch size "
                f"{list(self._batch_size)}, got shape {list(index.shape)}."
            )

        def gather(leaf: _Tensor) -> _Tensor:
            extra = leaf.shape[ndim:]
            full = index.reshape(index.shape + (1,) * len(extra)).expand(index.shape + extra)
            return torch.gather(leaf, d, full)

        result = map_leaves(self, gather, index.shape, True, keep_names, moves=True)
        if inplace:
            return _become(self, result, "gather")
        if out is not None:
            out.update(result, inplace=True)
            return out
        return result

    def where(self, condition: _Tensor, other: Any, *, out: Any = None, pad: Any = None):
        """``torch.where(condition, self, other)`` leaf by leaf (``condition`` over batch dims).

        ``other`` is a container (paired key by key), a tensor or a number. With
        ``pad``, a key present in only one of ``self`` and ``other`` is kept, with
        ``pad`` standing in for the missing side.

        Example:
            >>> td = TensorDict({"a": torch.ones(3, 2)}, [3])
            >>> td.where(torch.tensor([True, False, True]), 0.0)["a"][:, 0].tolist()
            [1.0, 0.0, 1.0]
        """
        condition = _check_mask(self, condition, "where")
        result = _where(self, condition, other, pad)
        if out is not None:
            out.update(result, inplace=True)
            return out
        return result

    def masked_fill(self, mask: _Tensor, value: Any):
        """A copy with ``value`` written where ``mask`` (over the batch dims) is true.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3, 2)}, [3])
            >>> td.masked_fill(torch.tensor([True, False, False]), 1.0)["a"][:, 0].tolist()
            [1.0, 0.0, 0.0]
        """
        mask = _check_mask(self, mask, "masked_fill")
        return map_leaves(self, lambda t: t.masked_fill(_align(mask, t), value), None, True, None)

    def masked_fill_(self, mask: _Tensor, value: Any):
        """Write ``value`` where ``mask`` is true, in place; returns self.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> td.masked_fill_(torch.tensor([False, True]), 5.0)["a"].tolist()
            [0.0, 5.0]
        """
        mask = _check_mask(self, mask, "masked_fill_")
        inplace_leaves(
            self, "masked_fill_", lambda leaf: leaf.masked_fill_(_align(mask, leaf), value)
        )
        return self

    def masked_select(self, mask: _Tensor, *, inplace: bool = False):
        """The elements where ``mask`` (over the leading batch dims) is true, in one batch dim.

        ``inplace=True`` makes this container the selection (its batch size changes) and
        returns it.

        Example:
            >>> td = TensorDict({"a": torch.arange(3.0)}, [3])
            >>> td.masked_select(torch.tensor([True, False, True]))["a"].tolist()
            [0.0, 2.0]
        """
        mask = _check_mask(self, mask, "masked_select")
        size = self._batch_size
        new_size = torch.Size([int(mask.sum())]) + size[mask.dim() :]
        # a selection: a NonTensorStack follows it, value by value
        result = map_leaves(self, lambda t: t[mask], new_size, True, no_names, moves=True)
        return _become(self, result, "masked_select") if inplace else result

    # ------------------------------------------------------------------ reordering
    def movedim(self, source: Any, destination: Any):
        """Move batch dims ``source`` to ``destination`` (like ``torch.movedim``).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2, 3, 4, 5)}, [2, 3, 4])
            >>> td.movedim(0, 2)["a"].shape
            torch.Size([3, 4, 2, 5])
        """
        ndim = len(self._batch_size)
        api = "TensorDict.movedim"
        sources = [source] if isinstance(source, int) else list(source)
        targets = [destination] if isinstance(destination, int) else list(destination)
        if len(sources) != len(targets):
            raise ValueError(
                f"{api}: source and destination must have the same number of elements, got "
                f"{sources} and {targets}."
            )
        sources = [normalize_dim(d, ndim, api) for d in sources]
        targets = [normalize_dim(d, ndim, api) for d in targets]
        for name, dims in (("source", sources), ("destination", targets)):
            if len(set(dims)) != len(dims):  # RuntimeError, as torch.movedim
                raise RuntimeError(f"{api}: repeated dim in {name} {dims}.")
        order: list = [None] * ndim
        for src, dst in zip(sources, targets):
            order[dst] = src
        rest = iter(d for d in range(ndim) if d not in sources)
        order = [next(rest) if d is None else d for d in order]
        if order == list(range(ndim)):
            return self  # nothing moves: the container itself, as tensordict returns
        return self.permute(*order) if ndim else self._shallow_copy()

    moveaxis = movedim

    def swapaxes(self, axis0: int, axis1: int):
        """Swap two batch dims (``transpose``).

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).swapaxes(0, 1).batch_size
            torch.Size([3, 2])
        """
        return self.transpose(axis0, axis1)

    swapdims = swapaxes

    def narrow(self, dim: int, start: int, length: int):
        """The slice ``start:start + length`` of batch dim ``dim`` (a view).

        Example:
            >>> TensorDict({"a": torch.arange(5.0)}, [5]).narrow(0, 1, 2)["a"].tolist()
            [1.0, 2.0]
        """
        d = one_batch_dim(self, dim, "narrow")
        size = list(self._batch_size)
        size[d] = length
        return map_leaves(
            self,
            lambda t: t.narrow(d, start, length),
            torch.Size(size),
            True,
            keep_names,
            moves=True,  # a selection: a NonTensorStack follows it
        )

    def flip(self, *dims):
        """Reverse the order along batch ``dims``.

        Example:
            >>> TensorDict({"a": torch.arange(3.0)}, [3]).flip(0)["a"].tolist()
            [2.0, 1.0, 0.0]
        """
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = tuple(dims[0])
        flipped = batch_dims(self, dims, "flip")
        return map_leaves(self, lambda t: t.flip(flipped), None, True, None, moves=True)

    def fliplr(self):
        """Reverse batch dim 1 (needs at least 2 batch dims).

        Example:
            >>> TensorDict({"a": torch.arange(4.0).reshape(2, 2)}, [2, 2]).fliplr()["a"].tolist()
            [[1.0, 0.0], [3.0, 2.0]]
        """
        if len(self._batch_size) < 2:  # RuntimeError, as torch.fliplr of a 1-d tensor
            raise RuntimeError(
                f"TensorDict.fliplr: requires at least 2 batch dims, got batch size "
                f"{list(self._batch_size)}."
            )
        return self.flip(1)

    def flipud(self):
        """Reverse batch dim 0 (needs at least 1 batch dim).

        Example:
            >>> TensorDict({"a": torch.arange(2.0)}, [2]).flipud()["a"].tolist()
            [1.0, 0.0]
        """
        if not self._batch_size:  # RuntimeError, as torch.flipud of a 0-d tensor
            raise RuntimeError("TensorDict.flipud: requires at least 1 batch dim, got none.")
        return self.flip(0)

    def roll(self, shifts: Any, dims: Any, *, inplace: bool = False):
        """Roll the elements along batch ``dims`` by ``shifts`` (like ``torch.roll``).

        Example:
            >>> TensorDict({"a": torch.arange(3.0)}, [3]).roll(1, 0)["a"].tolist()
            [2.0, 0.0, 1.0]
        """
        ndim = len(self._batch_size)
        if isinstance(dims, int):
            dims = normalize_dim(dims, ndim, "TensorDict.roll")
        else:
            dims = tuple(normalize_dim(d, ndim, "TensorDict.roll") for d in dims)
        result = map_leaves(self, lambda t: t.roll(shifts, dims), None, True, None, moves=True)
        return _become(self, result, "roll") if inplace else result

    def rot90(self, k: int = 1, dims: Sequence[int] = (0, 1)):
        """Rotate by 90 degrees ``k`` times in the plane of batch ``dims``.

        Example:
            >>> td = TensorDict({"a": torch.arange(4.0).reshape(2, 2)}, [2, 2])
            >>> td.rot90()["a"].tolist()
            [[1.0, 3.0], [0.0, 2.0]]
        """
        ndim = len(self._batch_size)
        if ndim < 2:  # RuntimeError, as torch.rot90 of a 1-d tensor
            raise RuntimeError(
                f"TensorDict.rot90: requires at least 2 batch dims, got batch size "
                f"{list(self._batch_size)}."
            )
        d0, d1 = (normalize_dim(d, ndim, "TensorDict.rot90") for d in dims)
        new_size = torch.rot90(_meta(self._batch_size), k, (d0, d1)).shape
        names = keep_names
        if k % 2:

            def names(level):
                if level is None:
                    return None
                swapped = list(level)
                swapped[d0], swapped[d1] = swapped[d1], swapped[d0]
                return tuple(swapped)

        return map_leaves(
            self, lambda t: torch.rot90(t, k, (d0, d1)), new_size, True, names, moves=True
        )

    # ------------------------------------------------------------------ growing
    def _reps(self, reps: tuple, api: str) -> tuple:
        if len(reps) == 1 and isinstance(reps[0], (list, tuple, torch.Size)):
            reps = tuple(reps[0])
        ndim = len(self._batch_size)
        if api == "repeat" and len(reps) < ndim:
            raise ValueError(
                f"TensorDict.repeat: expected at least {ndim} repeats for batch size "
                f"{list(self._batch_size)}, got {list(reps)}."
            )
        return (1,) * (ndim - len(reps)) + tuple(reps)

    def _tile(self, reps: tuple, api: str, inplace: bool = False):
        ndim = len(self._batch_size)
        new_size = _meta(self._batch_size).repeat(reps).shape
        offset = len(reps) - ndim

        def names(level):
            return None if level is None else (None,) * offset + level

        result = map_leaves(
            self,
            lambda t: t.repeat(reps + (1,) * (t.dim() - ndim)),
            new_size,
            True,
            names,
            moves=True,
        )
        return _become(self, result, api) if inplace else result

    def tile(self, *reps):
        """Repeat the batch dims ``reps`` times (``torch.tile`` on the batch shape).

        Example:
            >>> TensorDict({"a": torch.arange(2.0)}, [2]).tile(2)["a"].tolist()
            [0.0, 1.0, 0.0, 1.0]
        """
        return self._tile(self._reps(reps, "tile"), "tile")

    def repeat(self, *repeats, inplace: bool = False):
        """Repeat the batch dims (``Tensor.repeat`` on the batch shape).

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).repeat(2, 2)["a"].shape
            torch.Size([2, 4, 3])
        """
        return self._tile(self._reps(repeats, "repeat"), "repeat", inplace)

    def repeat_interleave(
        self, repeats: Any, dim: int | None = None, *, output_size=None, inplace: bool = False
    ):
        """Repeat each element of batch dim ``dim`` ``repeats`` times.

        Example:
            >>> td = TensorDict({"a": torch.arange(2.0)}, [2])
            >>> td.repeat_interleave(2, 0)["a"].tolist()
            [0.0, 0.0, 1.0, 1.0]
        """
        ndim = len(self._batch_size)
        if dim is None:  # as torch: over the flattened batch dims
            if ndim != 1:
                flat = self.reshape(-1)  # type: ignore[attr-defined]
                out = flat.repeat_interleave(repeats, 0, output_size=output_size)
                return _become(self, out, "repeat_interleave") if inplace else out
            dim = 0
        d = one_batch_dim(self, dim, "repeat_interleave")
        size = list(self._batch_size)
        if isinstance(repeats, _Tensor) and repeats.numel() != 1:  # one count per element
            size[d] = int(repeats.sum())  # (none for an empty dim)
        else:
            size[d] = size[d] * int(repeats)

        def op(t: _Tensor) -> _Tensor:
            return t.repeat_interleave(repeats, d, output_size=output_size)

        result = map_leaves(self, op, torch.Size(size), True, keep_names, moves=True)
        return _become(self, result, "repeat_interleave") if inplace else result

    def broadcast_to(self, shape: Any):
        """Broadcast the batch dims to ``shape`` (``expand``).

        Example:
            >>> TensorDict({"a": torch.zeros(1, 3)}, [1]).broadcast_to([4])["a"].shape
            torch.Size([4, 3])
        """
        return self.expand(shape)

    def _atleast(self, n: int):
        # Leading dims of size 1, as tensordict documents (``[3]`` -> ``[1, 1, 3]``);
        # torch.atleast_3d would give ``[1, 3, 1]`` for a tensor.
        out = self
        for _ in range(n - len(self._batch_size)):
            out = out.unsqueeze(0)
        return out

    def atleast_1d(self):
        """At least 1 batch dim: ``self`` if it has one, else a leading dim of size 1.

        Example:
            >>> TensorDict({"a": torch.zeros(3)}, []).atleast_1d()["a"].shape
            torch.Size([1, 3])
        """
        return self._atleast(1)

    def atleast_2d(self):
        """At least 2 batch dims: ``self`` if it has them, else leading dims of size 1.

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).atleast_2d().batch_size
            torch.Size([1, 2])
        """
        return self._atleast(2)

    def atleast_3d(self):
        """At least 3 batch dims: ``self`` if it has them, else leading dims of size 1.

        Unlike ``torch.atleast_3d`` on a tensor (``[3]`` -> ``[1, 3, 1]``), the new
        dims always lead, so the existing batch dims stay last, in order.

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2]).atleast_3d().batch_size
            torch.Size([1, 1, 2])
        """
        return self._atleast(3)

    def pad(
        self,
        pad_size: Sequence[int],
        value: float = 0.0,
        *,
        inplace: bool = False,
        safe: bool = True,
    ):
        """Pad the batch dims with ``value``: ``(dim0_left, dim0_right, dim1_left, ...)``.

        Negative sizes crop. Non-tensor entries hold ``None`` in the new slots. With
        ``inplace=True`` the container (and its nested containers and
        ``NonTensorStack`` entries) keeps its identity. The new batch size is checked
        before any leaf is padded, and nothing changes when a leaf fails, whatever
        ``safe`` says (it is accepted for compatibility).

        Example:
            >>> td = TensorDict({"a": torch.ones(3, 4, 1)}, [3, 4])
            >>> td.pad([0, 1, 0, 2]).batch_size
            torch.Size([4, 6])
        """
        return pad_container(self, pad_size, value, inplace)

    # ------------------------------------------------------------------ splitting
    def tensor_split(self, indices_or_sections: Any, dim: int = 0):
        """Split along batch dim ``dim`` like ``torch.tensor_split`` (views).

        Example:
            >>> parts = TensorDict({"a": torch.arange(5.0)}, [5]).tensor_split(2)
            >>> [p["a"].tolist() for p in parts]
            [[0.0, 1.0, 2.0], [3.0, 4.0]]
        """
        d = one_batch_dim(self, dim, "tensor_split")
        metas = torch.tensor_split(_meta(self._batch_size), indices_or_sections, d)
        count = len(metas)
        return tuple(
            map_leaves(
                self,
                lambda t, i=i: torch.tensor_split(t, indices_or_sections, d)[i],
                meta.shape,
                True,
                keep_names,
                moves=True,  # a selection: a NonTensorStack follows it
            )
            for i, meta in enumerate(metas[:count])
        )

    def split_keys(self, *key_sets, inplace: bool = False, default_key: Any = None, strict=True):
        """Split by keys: one container per key set, then one with the keys left over.

        A key set is a list of keys, or a function ``fn(key, value) -> bool`` that takes
        every tensor leaf no earlier set took and for which it returns True (``key`` is
        the leaf's key as a tuple of str; it is not called on nested containers or
        non-tensor data).

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": torch.zeros(()), "c": torch.zeros(())})
            >>> [sorted(part.keys()) for part in td.split_keys(["a"], ["b"])]
            [['a'], ['b'], ['c']]
            >>> [sorted(part.keys()) for part in td.split_keys(lambda key, value: key < ("b",))]
            [['a'], ['b', 'c']]
        """
        parts = []
        used: list = []
        for keys in key_sets:
            if callable(keys):
                keys = _chosen_leaves(self, keys, used)
            keys = [keys] if isinstance(keys, str) else list(keys)
            parts.append(self.select(*keys, strict=strict))
            used.extend(keys)
        rest = self.exclude(*used, inplace=inplace)
        _drop_emptied(rest, used)
        if default_key is not None:
            rest = rest.select(default_key, strict=False)
        return (*parts, rest)


def _chosen_leaves(self: Any, choose: Any, used: list) -> list:
    """The tensor leaves that no earlier key set took and ``choose(key, value)`` accepts."""
    taken = [key_parts(key, "split_keys") for key in used]
    chosen = []
    for key, value in self.items(True, True):
        parts = key if type(key) is tuple else (key,)
        if not isinstance(value, _Tensor) or any(parts[: len(t)] == t for t in taken):
            continue
        if choose(parts, value):
            chosen.append(key)
    return chosen


def _drop_emptied(rest: Any, moved: list) -> None:
    """Delete from ``rest`` the nested levels that ``moved`` keys left without entries."""
    parents = set()
    for key in moved:
        if isinstance(key, tuple):
            parents.update(key[:end] for end in range(1, len(key)))
    for parent in sorted(parents, key=len, reverse=True):  # deepest first
        level = rest.get(parent, None)
        if is_collection(level) and not list(level.keys()):
            del rest[parent]


def _where(self: Any, condition: _Tensor, other: Any, pad: Any) -> Any:
    if not is_collection(other):
        result = map_leaves(
            self, lambda t: torch.where(_align(condition, t), t, other), None, True, None
        )
        if may_grow(self, other):
            check_grown(result, other, "where")
        return result
    other_data = other._to_tensordict_view()._data
    if pad is None and other_data.keys() != self._data.keys():
        diff = sorted(set(self._data) ^ set(other_data))
        raise KeyError(
            f"TensorDict.where: both containers must have the same keys; these keys are only in "
            f"one of them: {diff} (not found and no pad value provided). Pass pad=<value> to "
            f"fill the missing side."
        )
    out: dict[str, Any] = {}
    for key, value in self._data.items():
        rhs = other_data.get(key, _MISSING)
        if isinstance(value, _Tensor):
            if rhs is _MISSING:
                out[key] = torch.where(_align(condition, value), value, pad)
            else:
                out[key] = torch.where(_align(condition, value), value, rhs)
        elif is_collection(value):
            view = value._to_tensordict_view()
            if rhs is _MISSING:
                sub = map_leaves(
                    view, lambda t: torch.where(_align(condition, t), t, pad), None, True, None
                )
            else:
                sub = _where(view, condition, rhs, pad)
            out[key] = rewrap(value, sub)
        elif isinstance(value, NonTensorData) and isinstance(rhs, NonTensorData):
            # values, element by element, as for tensors (not self's value everywhere)
            mask = condition.reshape(
                condition.shape + (1,) * (len(value.batch_size) - condition.dim())
            )
            out[key] = value.where(mask, rhs)
        else:
            out[key] = value
    for key, rhs in other_data.items():
        if key in self._data:
            continue
        if isinstance(rhs, _Tensor):
            out[key] = torch.where(_align(condition, rhs), pad, rhs)
        elif is_collection(rhs):
            view = rhs._to_tensordict_view()
            sub = map_leaves(
                view, lambda t: torch.where(_align(condition, t), pad, t), None, True, None
            )
            out[key] = rewrap(rhs, sub)
    result = like_pair(self, other, out, "where")
    if may_grow(self, pad):
        check_grown(result, pad, "where")
    return result


_MISSING = object()
