"""Indexing a container: ``td[index]`` and ``td[index] = value`` over every value.

Values are tensors, nested containers and non-tensor leaves, each indexed in its
leading (batch) dims; the index is validated and the new batch size computed once.
A write is planned for every leaf and checked before the first one is performed.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Number
from typing import Any

import torch

from ..helpers.fastpath import is_tensor_kind, node_kind
from ..helpers.frozen import FROZEN, refuse_frozen_inside
from ..helpers.indexing import Take, plan, prepare
from ..helpers.leaf_errors import note_key
from ..helpers.mixin import ContainerMixin
from ..helpers.mixin import is_tensor_collection as _collection
from ..helpers.nested_keys import unravel_key
from ..helpers.nontensor import NonTensorData, write_at, written
from ..helpers.reshape import _clean, resolve_ragged
from ..helpers.rewrap import rewrap
from ..helpers.sizes import (
    BatchSizeMismatchError,
    _simple_index_size,
    expand_ellipsis,
    index_batch_size,
)
from ..helpers.writes import assign_at, check_copy_target, check_fits, writable_view


class ItemMixin(ContainerMixin):
    """``td[index]`` and ``td[index] = value`` (methods of ``TensorDict``)."""

    __slots__ = ()

    def _leaf_index(self, index):
        """(index to apply to each value, new batch size or None for advanced indexing)."""
        size = self._batch_size
        kind = type(index)
        if kind is int:
            if not size:
                raise IndexError("TensorDict: cannot index a TensorDict with batch_size=[].")
            if not -size[0] <= index < size[0]:
                raise IndexError(
                    f"TensorDict: index {index} is out of range for batch dim 0 of size {size[0]}."
                )
            return index, size[1:]
        if kind is slice:
            if not size:
                raise IndexError("TensorDict: cannot slice a TensorDict with batch_size=[].")
            return index, _simple_index_size(size, (index,))
        if kind is list and any(isinstance(item, str) for item in index):
            raise TypeError(
                f"TensorDict: indexing with a list of keys ({index!r}) is not supported: a list "
                f"indexes the batch dims, as for a tensor. Hint: td.select(*keys) gives the "
                f"sub-TensorDict of those keys; [td[key] for key in keys] gives their values."
            )
        if kind is not tuple:
            index = (index,)
        elif str in map(type, index):
            unravel_key(index, "TensorDict.__getitem__")  # raises the TypeError for the bad part
        index = expand_ellipsis(index, len(size))
        return index, _simple_index_size(size, index)

    def _index(self, index):
        leaf_index, new_size = self._leaf_index(index)
        if new_size is not None:
            return self._index_trusted(leaf_index, new_size)
        # tensors, masks, lists: prepared once (one nonzero per mask), then used for each leaf
        leaf_index, new_size, take = plan(self, leaf_index)
        return self._index_trusted(leaf_index, new_size, take)

    def _index_trusted(self, leaf_index, new_size: torch.Size, take: Take | None = None):
        """Index every value with a validated ``leaf_index``; ``new_size`` is the result's.

        ``take`` (advanced indexing, see ``indexing.plan``) indexes the tensor leaves.
        """
        ndim = len(self._batch_size)
        data = {}
        key = None
        try:
            for key, value in self._data.items():
                kind = type(value)
                if kind is torch.Tensor or is_tensor_kind[kind]:
                    data[key] = value[leaf_index] if take is None else take.take(value, leaf_index)
                elif kind is NonTensorData and len(value.batch_size) == ndim:
                    # before the class lookup: a compiled function that indexes a batch
                    # with a non-tensor field then reads no cache that eager code may grow
                    data[key] = NonTensorData._make(value.data, new_size, value.device)
                elif node_kind[kind] == 1:  # a nested TensorDict
                    inner = value._batch_size
                    inner_size = new_size if len(inner) == ndim else new_size + inner[ndim:]
                    data[key] = value._index_trusted(leaf_index, inner_size, take)
                else:
                    data[key] = value[leaf_index]
        except Exception as error:
            note_key(error, key)
            raise
        names = self._names
        if names is not None:
            names = _index_names(names, leaf_index, len(new_size))
        if -1 in new_size:  # ragged: the indexed leaves may be dense now
            new_size = resolve_ragged(new_size, data)
        return self._like(data, new_size, names)

    def _set_at_index(self, index, value: Any) -> None:
        """``td[index] = value``: validate every write first, then perform them."""
        self._check_mutable("__setitem__")
        leaf_index, target = self._leaf_index(index)
        if target is None:  # masks become nonzero() indices once, not once per leaf
            leaf_index = prepare(leaf_index, self._batch_size)[0]
            target = index_batch_size(self._batch_size, leaf_index)
        if self._is_locked == FROZEN:  # frozen levels below refuse in writable_view, planning
            refuse_frozen_inside(self, "__setitem__")
        fields = getattr(type(self), "_tc_field_names", None)
        if (
            fields is not None
            and type(value) is not type(self)
            and (_collection(value) or isinstance(value, Mapping))
        ):
            _check_compatible_class(self, value, fields)
        plan: list = []
        self._plan_index_write(leaf_index, target, value, plan, ())
        for operation, *args in plan:  # nothing is written unless every write can be
            if operation is assign_at:
                check_copy_target(args[0], args[2], "<index>", "__setitem__")
        for operation, *args in plan:
            operation(*args)

    def _plan_index_write(
        self, leaf_index, target, value, plan: list, prefix: tuple, missing: int | None = None
    ) -> None:
        """Validate ``self[leaf_index] = value`` and append the writes to ``plan``.

        ``target`` is the batch size the index selects in ``self``. ``missing`` is how
        many leading batch dims the written container lacks compared with the top-level
        target (it broadcasts over them); None at the top level.
        """
        ndim = len(self._batch_size)
        if isinstance(value, Mapping) and not _collection(value):
            value = self._plain_tensordict()(value, batch_size=target, device=self._device)
        if not _collection(value):
            # one value broadcast into every tensor leaf
            if isinstance(value, Number):
                # kept a Python number: torch writes it exactly into each leaf's dtype
                # (0.1 as a float32 tensor would round before reaching a float64 leaf)
                shape = torch.Size()
            elif isinstance(value, torch.Tensor):
                shape = value.shape
            else:
                try:
                    value = torch.as_tensor(value)
                except (TypeError, ValueError, RuntimeError):
                    raise TypeError(
                        f"TensorDict.__setitem__: cannot write a {type(value).__name__} at an "
                        f"index; expected a TensorDict, a mapping, a tensor or a number."
                    ) from None
                shape = value.shape
            for key, item in self._data.items():
                if isinstance(item, torch.Tensor):
                    check_fits(shape, target + item.shape[ndim:], prefix + (key,), "__setitem__")
                    plan.append((assign_at, item, leaf_index, value))
                elif _collection(item):
                    item = writable_view(item, "__setitem__", prefix + (key,))
                    inner = target + item._batch_size[ndim:]
                    item._plan_index_write(leaf_index, inner, value, plan, prefix + (key,), 0)
            return
        source = value._to_tensordict_view()
        if missing is None:
            source_size = source._batch_size
            if not _broadcastable(source_size, target):
                raise BatchSizeMismatchError(
                    f"TensorDict.__setitem__: batch dimension mismatch: cannot write a "
                    f"{type(value).__name__} with batch size {list(source_size)} at an index "
                    f"that selects a batch of size {list(target)}."
                )
            missing = len(target) - len(source_size)
        skip = len(target) - missing  # leading dims of a written leaf that are batch dims
        for key, sub in source._data.items():
            existing = self._data.get(key)
            full = prefix + (key,)
            if existing is None:
                self._check_writable("__setitem__", full[0] if len(full) == 1 else full)
                plan.append((_preallocate, self, key, sub, skip, leaf_index))
            elif isinstance(existing, torch.Tensor):
                if not isinstance(sub, torch.Tensor):
                    raise TypeError(
                        f"TensorDict.__setitem__: cannot write a {type(sub).__name__} into the "
                        f"tensor at key {full!r}."
                    )
                check_fits(sub.shape, target + existing.shape[ndim:], full, "__setitem__")
                plan.append((assign_at, existing, leaf_index, sub))
            elif _collection(existing):
                view = writable_view(existing, "__setitem__", full)  # frozen: its error first
                fields = getattr(type(existing), "_tc_field_names", None)
                if fields is not None and _collection(sub) and type(sub) is not type(existing):
                    _check_compatible_class(existing, sub, fields)  # a nested TensorClass
                existing = view
                inner = target + existing._batch_size[ndim:]
                existing._plan_index_write(leaf_index, inner, sub, plan, full, missing)
            else:
                plan.append((_write_non_tensor, self._data, key, leaf_index, sub))


def _broadcastable(source: torch.Size, target: torch.Size) -> bool:
    if len(source) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(source), reversed(target)))


def _zeros_tree(view, new_size: torch.Size, device):
    """A container shaped like ``view`` with batch size ``new_size``, zero-filled."""
    ndim = len(view._batch_size)
    data: dict[str, Any] = {}
    for key, value in view._data.items():
        if isinstance(value, torch.Tensor):
            data[key] = value.new_zeros(
                new_size + value.shape[ndim:], device=device or value.device
            )
        elif _collection(value):
            inner = value._to_tensordict_view()
            zeros = _zeros_tree(inner, new_size + inner._batch_size[ndim:], device)
            data[key] = rewrap(value, zeros)
        elif isinstance(value, NonTensorData):
            fill = value.data if type(value) is NonTensorData else None
            data[key] = NonTensorData._make(fill, new_size + value.batch_size[ndim:], device)
    out = view._like(data, new_size, None)
    if device is not None:
        out._device = device
    return out


def _preallocate(td, key: str, template: Any, skip: int, index) -> None:
    """Lazy preallocation: a zero-filled entry with the full batch size, then the write."""
    full = td._batch_size
    device = td._device
    value: Any
    if isinstance(template, torch.Tensor):
        value = template.new_zeros(full + template.shape[skip:], device=device or template.device)
        value[index] = template
    elif isinstance(template, NonTensorData):
        fill = template.data if type(template) is NonTensorData else None
        value = write_at(
            NonTensorData._make(fill, full + template.batch_size[skip:], device), index, template
        )
    else:
        view = template._to_tensordict_view()
        zeros = _zeros_tree(view, full + view._batch_size[skip:], device)
        zeros._set_at_index(index, view)
        value = rewrap(template, zeros)
    td._data[key] = value


def _check_compatible_class(target: Any, value: Any, fields) -> None:
    """Writing ``value`` into a TensorClass at an index must not add a key that is not a field."""
    extra = sorted(k for k in value.keys() if k not in fields)  # noqa: SIM118 (iterating a container walks its batch)
    if extra:
        raise ValueError(
            f"{type(target).__name__}.__setitem__ is only allowed for same-class or compatible "
            f"class (fields of {type(target).__name__}) assignment: the "
            f"{type(value).__name__} written has {extra}, which are not fields of "
            f"{type(target).__name__} (fields: {sorted(fields)})."
        )


def _write_non_tensor(data: dict, key: str, index, value: Any) -> None:
    existing = data[key]
    if "_view_of" not in existing.__dict__:
        data[key] = written(existing, index, value)
        return
    # an element read from a stack (``td[1:]`` of a container holding one): the write
    # reaches the stack, as it reaches the parent's tensors through their views
    existing._refresh()
    new = write_at(existing, index, value)
    if new is not existing:
        existing._set_value(new.data)


def _index_names(names: tuple, index, new_ndim: int):
    """Names after ``index``: ints, slices, None and at most one tensor index; else None.

    As in torch, a single tensor index takes the place of the dim it indexes (no
    move), and each dim it gives keeps that dim's name (a batch of a named dataset
    read with ``td[indices]`` keeps its names).
    """
    if type(index) is int:
        return _clean(names[1:])
    if type(index) is slice:
        return names
    out: list = []
    dim = 0
    advanced = 0
    for item in index:
        if item is None:
            out.append(None)
        elif type(item) is int:
            dim += 1
        elif type(item) is slice:
            out.append(names[dim])
            dim += 1
        elif isinstance(item, torch.Tensor) and not item.is_floating_point() and not advanced:
            if item.dtype is torch.bool:  # masks are prepared as indices: not expected here
                return None
            advanced = 1
            out.extend([names[dim]] * item.dim())
            dim += 1
        else:
            return None
    out.extend(names[dim:])
    return _clean(tuple(out)) if len(out) == new_ndim else None
