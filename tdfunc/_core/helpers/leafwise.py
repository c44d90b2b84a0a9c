"""The engine of the tensor-like methods: one function mapped over every tensor leaf.

Reductions, pointwise math and the extra shape ops all do the same thing: call a
tensor function on each leaf (nested containers included), give the result a new
batch size and names, and rebuild a container of the same class. The methods read
the container only through ``_data``, ``_batch_size`` and ``_names`` and build
results with ``_like``, so TensorDict and every TensorClass share them.

Example:
    >>> td = TensorDict({"a": torch.ones(2, 3), "n": {"b": torch.ones(2)}}, [2])
    >>> out = map_leaves(td, lambda t: t.sum(0), torch.Size([]), False, None)
    >>> out["a"].tolist(), out["n", "b"].item(), out.batch_size
    ([2.0, 2.0, 2.0], 2.0, torch.Size([]))
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .frozen import is_frozen, refuse_frozen_inside
from .leaf_errors import each_leaf, note_key
from .nontensor import NonTensorData, from_array
from .operand import check_batch_aligned_operand
from .rewrap import rewrap
from .tracing import dynamo_compiling as _dynamo_compiling

_Tensor = torch.Tensor
_SCALARS = frozenset((int, float, bool, complex))


def is_collection(value: Any) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


def map_leaves(
    self: Any,
    fn: Callable,
    new_size: torch.Size | None,
    tail: bool,
    names: Any,
    *,
    keep_non_tensor: bool = True,
    moves: bool = False,
) -> Any:
    """``fn`` on every tensor leaf; a container of ``self``'s class with ``new_size``.

    ``new_size`` None keeps the batch size (and, with ``names`` None, the names).
    ``tail``: nested containers keep their batch dims beyond ``self``'s after
    ``new_size`` (batch-dim ops); otherwise their batch size is ``new_size``.
    ``names`` is a function of a level's names giving the new names, or None.
    ``moves``: the op moves elements along the batch dims (flip, roll...), which a
    ``NonTensorStack`` (one value per element) cannot follow.
    """
    data = self._data
    out: dict[str, Any] = {}
    key = None
    if new_size is None and not moves:
        try:
            for key, value in data.items():
                if type(value) is _Tensor or isinstance(value, _Tensor):
                    out[key] = fn(value)
                elif is_collection(value):
                    view = value._to_tensordict_view()
                    sub = map_leaves(view, fn, None, tail, names, keep_non_tensor=keep_non_tensor)
                    out[key] = rewrap(value, sub)
                elif isinstance(value, NonTensorData):
                    if keep_non_tensor:  # the result's own leaf: its tensors are new too
                        out[key] = value._fresh()
                else:
                    out[key] = value
        except Exception as error:
            note_key(error, key)
            raise
        if names is None:
            return self._like(out)
        return self._like(out, None, names(self._names))
    ndim = len(self._batch_size)
    size = self._batch_size if new_size is None else new_size
    try:
        for key, value in data.items():
            if type(value) is _Tensor or isinstance(value, _Tensor):
                out[key] = fn(value)
            elif is_collection(value):
                view = value._to_tensordict_view()
                if new_size is None:  # the level keeps its batch size, so its names too
                    inner = None
                else:
                    inner = new_size + view._batch_size[ndim:] if tail else new_size
                sub = map_leaves(
                    view, fn, inner, tail, names, keep_non_tensor=keep_non_tensor, moves=moves
                )
                out[key] = rewrap(value, sub)
            elif isinstance(value, NonTensorData):
                if keep_non_tensor and moves and type(value) is not NonTensorData:
                    out[key] = moved_stack(value, fn)
                elif keep_non_tensor:
                    out[key] = non_tensor_with(value, size, ndim, tail, key)
            else:
                out[key] = value
    except Exception as error:
        note_key(error, key)
        raise
    if new_size is None:
        return self._like(out) if names is None else self._like(out, None, names(self._names))
    level_names = None if names is None else names(self._names)
    return self._like(out, new_size, level_names)


def moved_stack(value: Any, fn: Callable) -> Any:
    """A ``NonTensorStack`` after an op that only selects or moves elements (``moves``).

    ``fn`` runs on the positions of the elements (an integer tensor of the stack's
    batch shape); the values are then taken at the positions it returns.
    """
    array = value._array()
    positions = torch.arange(array.size).reshape(array.shape)
    moved = fn(positions)
    flat = moved.reshape(-1).numpy()
    out = np.empty(len(flat), dtype=object)
    out[:] = array.reshape(-1)[flat]
    return from_array(out.reshape(tuple(moved.shape)), value.device)


def non_tensor_with(value: NonTensorData, new_size: torch.Size, ndim: int, tail: bool, key: Any):
    """A non-tensor leaf given the batch size of its container after an op."""
    size = new_size + value.batch_size[ndim:] if tail else new_size
    if type(value) is NonTensorData:
        return NonTensorData._make(value.data, size, value.device)
    raise TypeError(
        f"TensorDict: the entry {key!r} holds one non-tensor value per batch element (a "
        f"NonTensorStack), which this operation cannot reorder, reduce or resize. Drop the "
        f"non-tensor entries first (td.filter_non_tensor_data()) or exclude that key."
    )


def tensor_leaves(self: Any) -> list:
    """Every tensor leaf, depth first, in key order."""
    leaves = []
    for value in self._data.values():
        if isinstance(value, _Tensor):
            leaves.append(value)
        elif is_collection(value):
            leaves.extend(tensor_leaves(value._to_tensordict_view()))
    return leaves


def leaf_items(self: Any, prefix: tuple = ()) -> list:
    """``(key tuple, tensor)`` for every tensor leaf."""
    items = []
    for key, value in self._data.items():
        if isinstance(value, _Tensor):
            items.append((prefix + (key,), value))
        elif is_collection(value):
            items.extend(leaf_items(value._to_tensordict_view(), prefix + (key,)))
    return items


def inplace_leaves(self: Any, api: str, fn: Callable) -> None:
    """``fn`` on every tensor leaf, in place; a frozen TensorClass refuses (locks allow
    it). An error names the key of the leaf it was raised at."""
    check_in_place_write(self, api)
    each_leaf(self, fn)


def check_in_place_write(self: Any, api: str) -> None:
    """Raise before an in-place write that would reach frozen data (here or nested).

    A frozen TensorClass raises its own ``FrozenInstanceError``; a frozen instance
    anywhere below refuses through :func:`tdfunc._core.helpers.frozen.refuse_frozen_inside`.
    """
    self._check_mutable(api)
    refuse_frozen_inside(self, api)


def drop_names(dims: tuple, keepdim: bool) -> Callable:
    """The names after reducing batch ``dims`` (kept, unchanged, with ``keepdim``)."""

    def names(level: tuple | None):
        if level is None or keepdim:
            return level
        kept = tuple(n for d, n in enumerate(level) if d not in dims)
        return kept if any(n is not None for n in kept) else None

    return names


def no_names(level: tuple | None) -> None:
    return None


def keep_names(level: tuple | None):
    return level


def others_data(other: Any, self: Any, api: str) -> dict | None:
    """The data of ``other`` when it is a container with ``self``'s keys, else None."""
    if not is_collection(other):
        return None
    data = other._to_tensordict_view()._data
    if data.keys() != self._data.keys():
        diff = sorted(set(self._data) ^ set(data))
        raise KeyError(
            f"TensorDict.{api}: both containers must have the same keys; these keys are only "
            f"in one of them: {diff}."
        )
    return data


def map_pairs(self: Any, other: Any, fn: Callable, api: str, *, elementwise: bool = True) -> Any:
    """``fn(leaf, other_leaf)`` over two containers with the same keys (or a tensor/number).

    ``elementwise``: ``fn`` broadcasts its operands as torch does (``+``, ``maximum``...),
    so a result whose leaves outgrow the batch size takes the broadcast batch size or
    raises (see :func:`like_pair`); False for functions that reshape (reductions).
    """
    data = others_data(other, self, api)
    if data is None:
        if elementwise:
            check_batch_aligned_operand(self, other, api)
        out = map_leaves(self, lambda t: fn(t, other), None, True, None)
        if elementwise and may_grow(self, other):
            check_grown(out, other, api)
        return out
    out: dict[str, Any] = {}
    for key, value in self._data.items():
        rhs = data[key]
        if isinstance(value, _Tensor):
            out[key] = fn(value, rhs)
        elif is_collection(value):
            view = value._to_tensordict_view()
            out[key] = rewrap(value, map_pairs(view, rhs, fn, api, elementwise=elementwise))
        else:
            out[key] = value._fresh() if isinstance(value, NonTensorData) else value
    return like_pair(self, other, out, api) if elementwise else self._like(out)


def may_grow(self: Any, other: Any) -> bool:
    """Whether ``other`` (an operand of a leaf-by-leaf op) can broadcast leaves to more elements."""
    if type(other) in _SCALARS:
        return False
    if isinstance(other, (_Tensor, np.ndarray)):
        return other.ndim > 0
    if is_collection(other):
        return other.batch_size != self._batch_size
    return isinstance(other, Mapping)


def like_pair(self: Any, other: Any, data: dict, api: str) -> Any:
    """The container of ``data``, the leaves of a leaf-by-leaf op of ``self`` and ``other``.

    Its batch size is ``self``'s. When ``other`` is a container whose batch size grows the
    leaves, as torch broadcasts ``self``'s batch size with it (``[1, 4]`` and ``[3, 4]``
    give ``[3, 4]``), the result takes the broadcast batch size; a result whose leaves the
    batch size does not describe is an error, never a container that misreports its shape.
    """
    if not may_grow(self, other):
        return self._like(data)
    size = self._batch_size
    if is_collection(other) and not _describes(data, size, False):
        try:
            grown = torch.broadcast_shapes(size, other.batch_size)
        except RuntimeError:
            grown = size
        if grown != size:
            data = _broadcast_rest(data, size, grown)
        if _describes(data, grown, False):
            names = self._names
            if names is not None:
                names = [None] * (len(grown) - len(size)) + list(names)
            return self._like(data, grown, names)
    result = self._like(data)
    check_grown(result, other, api, deep=False)  # nested levels were checked by their op
    return result


def _broadcast_rest(data: dict, size: torch.Size, grown: torch.Size) -> dict:
    """``data`` with the values torch did not broadcast (non-tensor leaves, their masks)
    given the broadcast batch size ``grown`` in place of ``size``."""
    out = {}
    for key, value in data.items():
        if isinstance(value, NonTensorData) and value.batch_size[: len(grown)] != grown:
            value = non_tensor_with(value, grown, len(size), True, key)
        elif isinstance(value, _Tensor) and value.shape[: len(grown)] != grown:
            rest = value.shape[len(size) :]
            if value.shape[: len(size)] == size and grown == torch.broadcast_shapes(size, grown):
                value = value.expand(*grown, *rest)
        out[key] = value
    return out


def _describes(data: dict, size: torch.Size, deep: bool, reach: int | None = None) -> bool:
    """Whether every leaf and nested level of ``data`` starts with the batch size ``size``.

    ``reach``: the number of dims of the tensor operand that made the leaves; a leaf
    with at least that many dims after the batch dims cannot have grown (fast path).
    """
    count = len(size)
    for value in data.values():
        if isinstance(value, _Tensor):
            if reach is not None and value.ndim - count >= reach:
                continue
            if value.shape[:count] != size:
                return False
        elif isinstance(value, NonTensorData):
            if value.batch_size[:count] != size:
                return False
        elif is_collection(value):
            if value.batch_size[:count] != size:
                return False
            if deep:
                nested = value._to_tensordict_view()
                if not _describes(nested._data, nested._batch_size, True, reach):
                    return False
    return True


def check_grown(result: Any, other: Any, api: str, deep: bool = True) -> None:
    """Raise when ``other`` broadcast a leaf of ``result`` beyond its level's batch size
    (``deep``: at every level; else at the top level only)."""
    view = result._to_tensordict_view() if hasattr(result, "_to_tensordict_view") else result
    reach = other.ndim if isinstance(other, (_Tensor, np.ndarray)) else None
    if _describes(view._data, view._batch_size, deep, reach):
        return
    if is_collection(other):
        described = f"a {type(other).__name__} with batch size {list(other.batch_size)}"
    elif hasattr(other, "shape"):
        described = f"a {type(other).__name__} of shape {list(other.shape)}"
    else:
        described = f"a {type(other).__name__}"
    for key, leaf in leaf_items(view):
        size = view.get(key[:-1]).batch_size if len(key) > 1 else view.batch_size
        if leaf.shape[: len(size)] != size:
            raise ValueError(
                f"{type(result).__name__}.{api}: the other operand ({described}) broadcasts the "
                f"leaf {key if len(key) > 1 else key[0]!r} to shape {list(leaf.shape)}, which "
                f"does not start with the batch size {list(size)}. A tensor broadcasts against "
                f"each leaf aligned on the right: give it the batch shape followed by ones "
                f"(w.reshape(*w.shape, 1, ...)), or expand the container first "
                f"(td.expand(...))."
            )
    raise ValueError(  # a non-tensor entry the op could not give the new batch size
        f"{type(result).__name__}.{api}: the other operand ({described}) does not broadcast "
        f"against the batch size {list(view.batch_size)} of every entry; expand the "
        f"containers to one batch size first (td.expand(...))."
    )


_KIND_NAMES = ("bool", "integer", "floating-point", "complex")


def _dtype_kind(dtype: torch.dtype) -> int:
    """0 bool, 1 integer, 2 floating point, 3 complex (the order of ``torch.can_cast``)."""
    kind = _KINDS.get(dtype)
    return _kind_of(dtype) if kind is None else kind


def _kind_of(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 0 if dtype == torch.bool else 1


# every dtype of torch, filled once at import: a table that never changes after it
# (torch.compile guards on what a traced function reads; a growing cache would
# make eager code between two calls force a recompile)
_KINDS = {
    value: _kind_of(value)
    for value in (getattr(torch, name, None) for name in dir(torch))
    if isinstance(value, torch.dtype)
}


def in_place_write(self: Any, other: Any, method: Callable, api: str, *args: Any) -> None:
    """``method(leaf, operand, *args)`` for every tensor leaf, or for none of them.

    ``other`` is a container with the same keys (its leaf is the operand) or one
    operand for every leaf. Every pair is checked first (:func:`check_in_place`:
    keys, shapes, dtypes): a failure part-way (a Polyak update ``target.mul_(1 - tau)``
    reaching an integer buffer) would leave half an update behind. An error torch
    raises on a leaf names its key.
    """
    self._check_mutable(api)
    if not is_collection(other):
        check_batch_aligned_operand(self, other, api)
    pairs: list = []
    refused: list = []  # what the walk met: frozen levels, then levels whose keys differ
    _in_place_pairs(self, other, api, (), pairs, refused)
    if refused:
        refuse_frozen_inside(self, api)  # a frozen level anywhere is the error to report
        raise refused[0]
    _check_all_in_place(type(self).__name__, api, pairs)
    path = key = None
    try:
        for path, key, value, rhs in pairs:  # noqa: B007 (path and key name an error's leaf)
            method(value, rhs, *args)
    except Exception as error:
        if key is not None:
            for part in reversed((*path, key)):
                note_key(error, part)
        raise


def _in_place_pairs(node: Any, other: Any, api: str, path: tuple, out: list, refused: list):
    """``(level path, key, tensor leaf, operand)`` of every tensor leaf of ``node``, into
    ``out``; a frozen level or one whose keys differ from ``other``'s, into ``refused``
    (the walk that finds the pairs is the walk that checks them)."""
    if is_frozen(node):
        refused.append(None)
        return
    keyed = is_collection(other)
    if keyed:
        other_data = other._to_tensordict_view()._data
        if other_data.keys() != node._data.keys():
            missing = sorted(set(node._data) ^ set(other_data))
            where = f" under {path[0] if len(path) == 1 else path!r}" if path else ""
            refused.append(
                KeyError(
                    f"{type(node).__name__}.{api}: both operands must have the same keys; "
                    f"these keys{where} are only in one of them: {missing}."
                )
            )
            return
    for key, value in node._data.items():
        rhs = other_data[key] if keyed else other
        if isinstance(value, _Tensor):
            out.append((path, key, value, rhs))
        elif is_collection(value):
            _in_place_pairs(value._to_tensordict_view(), rhs, api, (*path, key), out, refused)


def _check_all_in_place(name: str, method: str, pairs: list) -> None:
    """:func:`check_in_place` for every ``(level path, key, leaf, operand)`` of ``pairs``,
    with its verdict taken inline for the common operands (one comparison per leaf; the
    full check only for a leaf that fails it, to raise its error):

    - one Python number for every leaf (``params.mul_(0.99)``): the leaf's dtype kind;
    - a tensor of the entry's own shape (``target.lerp_(source, tau)``): two dtype kinds.
    """
    if pairs and method != "lerp_":
        rhs = pairs[0][3]
        rhs_kind = _SCALAR_KINDS.get(type(rhs))  # a Python number (not a numpy scalar)
        if rhs_kind is not None and all(pair[3] is rhs for pair in pairs):
            floor = max(rhs_kind, 2) if method == "div_" else rhs_kind
            for path, key, value, _ in pairs:
                if _dtype_kind(value.dtype) < floor:
                    check_in_place(name, method, (*path, key), value, rhs)
            return
    lerp = method == "lerp_"
    floor = 2 if method == "div_" else 0
    kinds = _KINDS
    for path, key, value, rhs in pairs:
        if isinstance(rhs, _Tensor) and rhs.shape == value.shape:
            dtype = value.dtype
            kind = kinds.get(dtype, -1)  # -1: a dtype met after import, for the full check
            if (
                (kind >= 2 and rhs.dtype == dtype)
                if lerp
                else max(kinds.get(rhs.dtype, 4), floor) <= kind
            ):
                continue
        check_in_place(name, method, (*path, key), value, rhs)


_SCALAR_KINDS = {bool: 0, int: 1, float: 2, complex: 3}


def check_in_place(name: str, method: str, path: tuple, value: torch.Tensor, rhs: Any) -> None:
    """Raise what ``value.<method>(rhs)`` would raise for its dtype or shape, naming the key.

    An in-place operation over a container checks every leaf with this before it
    changes the first one: a failure part-way (a Polyak update ``target.mul_(1 - tau)``
    reaching an integer buffer) would leave half an update behind.
    """
    key = path[0] if len(path) == 1 else path
    if isinstance(rhs, torch.Tensor) and rhs.shape != value.shape:  # equal: it fits
        try:  # (broadcast_shapes is Python code: only for the shapes that differ)
            fits = torch.broadcast_shapes(value.shape, rhs.shape) == value.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise RuntimeError(
                f"{name}.{method}: the operand at key {key!r} has shape {list(rhs.shape)}, "
                f"which does not broadcast to the entry's shape {list(value.shape)}; no "
                f"entry was changed."
            )
    if method == "lerp_":
        ok = value.dtype.is_floating_point or value.dtype.is_complex
        ok = ok and (not isinstance(rhs, torch.Tensor) or rhs.dtype == value.dtype)
        reason = "lerp_ interpolates floating-point entries of the same dtype"
    elif isinstance(rhs, (torch.Tensor, numbers.Number)) and not isinstance(rhs, torch.SymInt):
        # decided by dtype kind (bool < integer < floating < complex), which is what
        # ``torch.can_cast`` compares: ``torch.result_type``/``can_cast`` return no
        # tensor, so torch.compile cannot trace them and would split the graph; a split
        # before the failing leaf would run the earlier updates and leave half of them
        if isinstance(rhs, torch.Tensor):
            rhs_kind = _dtype_kind(rhs.dtype)
        elif isinstance(rhs, (bool, int, float, complex)):
            rhs_kind = 0 if isinstance(rhs, bool) else 1 if isinstance(rhs, int) else 2
            rhs_kind = 3 if isinstance(rhs, complex) else rhs_kind
        elif _dynamo_compiling():  # another scalar type (numpy's): the op decides
            return
        else:  # numpy scalars promote their own way (np.bool_ as a float): ask torch
            try:
                rhs_kind = _dtype_kind(torch.result_type(value, rhs))
            except TypeError:  # a scalar type torch does not promote here: the op decides
                return
        result = max(_dtype_kind(value.dtype), rhs_kind, 2 if method == "div_" else 0)
        ok = result <= _dtype_kind(value.dtype)
        reason = f"the result ({_KIND_NAMES[result]}) cannot be stored in place"
    else:
        return
    if not ok:
        rhs_kind = rhs.dtype if isinstance(rhs, torch.Tensor) else type(rhs).__name__
        raise RuntimeError(
            f"{name}.{method}: cannot update the {value.dtype} entry at key {key!r} with a "
            f"{rhs_kind} operand: {reason}; no entry was changed. Hint: select the entries "
            f"to update first (it shares their tensors), e.g. "
            f"td.select(*[k for k, v in td.items(True, True) if v.is_floating_point()])."
        )
