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

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..apply import rewrap
from ..frozen import refuse_frozen_inside
from ..nontensor import NonTensorData, from_array

_Tensor = torch.Tensor


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
    if new_size is None and not moves:
        for key, value in data.items():
            if type(value) is _Tensor or isinstance(value, _Tensor):
                out[key] = fn(value)
            elif is_collection(value):
                view = value._to_tensordict_view()
                sub = map_leaves(view, fn, None, tail, names, keep_non_tensor=keep_non_tensor)
                out[key] = rewrap(value, sub)
            elif keep_non_tensor or not isinstance(value, NonTensorData):
                out[key] = value
        if names is None:
            return self._like(out)
        return self._like(out, None, names(self._names))
    ndim = len(self._batch_size)
    size = self._batch_size if new_size is None else new_size
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


def inplace_leaves(self: Any, api: str) -> list:
    """The tensor leaves to write in place; a frozen TensorClass refuses (locks allow it)."""
    check_in_place_write(self, api)
    return tensor_leaves(self)


def check_in_place_write(self: Any, api: str) -> None:
    """Raise before an in-place write that would reach frozen data (here or nested).

    A frozen TensorClass raises its own ``FrozenInstanceError``; a frozen instance
    anywhere below refuses through :func:`tdfunc._core.frozen.refuse_frozen_inside`.
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


def map_pairs(self: Any, other: Any, fn: Callable, api: str) -> Any:
    """``fn(leaf, other_leaf)`` over two containers with the same keys (or a tensor/number)."""
    data = others_data(other, self, api)
    if data is None:
        return map_leaves(self, lambda t: fn(t, other), None, True, None)
    out: dict[str, Any] = {}
    for key, value in self._data.items():
        rhs = data[key]
        if isinstance(value, _Tensor):
            out[key] = fn(value, rhs)
        elif is_collection(value):
            out[key] = rewrap(value, map_pairs(value._to_tensordict_view(), rhs, fn, api))
        else:
            out[key] = value
    return self._like(out)
