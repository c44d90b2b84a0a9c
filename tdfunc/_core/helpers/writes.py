"""The write engine of TensorDict: validation, conversion and atomic writes.

``set``, ``update``, ``update_``, ``__setitem__`` with keys, ``rename_key_`` and
the public constructor all go through :func:`write`. A write is atomic: every
structural change is recorded in an undo log and rolled back when a later entry
fails; copies into existing tensors (in-place writes) are validated first and
performed only once every entry has been checked.

Its fast twin, ``fastpath.set_fast`` (a tensor under existing, unlocked levels),
skips this engine; ``tests/core/test_fastpath_differential.py`` holds the two to the
same results.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from . import options
from .fastpath import is_tensor_kind
from .frozen import FROZEN
from .mixin import is_tensor_collection
from .nested_keys import MISSING, key_parts, unravel_key
from .nontensor import NonTensorData, NonTensorStack, stack_of_list
from .parents import hand_out
from .sizes import BatchSizeMismatchError, EntryShapeError, checked_names, leaf_shape
from .tracing import dynamo_compiling as _dynamo_compiling

_NO_DEFAULT = MISSING
_SCALARS = (bool, int, float, complex, np.generic)
_Tensor = torch.Tensor
# dynamo cannot trace the inference and internal-overlap queries (see _overlaps)


_new = object.__new__


def writable_view(container: Any, api: str, key: Any):
    """The TensorDict to write into for ``container``; frozen data refuses."""
    if getattr(type(container), "_tc_frozen", False):
        raise RuntimeError(
            f"TensorDict.{api}: cannot write key {key!r}: it is inside a frozen "
            f"{type(container).__name__}, which refuses every write."
        )
    view = container._to_tensordict_view()
    if view._is_locked == FROZEN:
        raise RuntimeError(
            f"TensorDict.{api}: cannot write key {key!r}: it is inside a TensorDict that "
            f"belongs to a frozen TensorClass, which refuses every write."
        )
    return view


def build_fast(cls, source: dict, size: torch.Size, ndim: int, first: int, second: int):
    """The data of a dict of ``str`` -> tensor / dict, or None when it needs the full path.

    The public constructor's fast path (``cls`` is the class being built): nested
    dicts become plain TensorDicts (``cls._plain_tensordict()``);
    tensors of any class (``nn.Parameter`` too) are stored as they are.
    ``first`` and ``second`` are ``size[0]`` and ``size[1]`` (when they exist): the
    leading-dims test below is ``value.shape[:ndim] == size`` without building a Size.
    """
    data = dict(source)
    for key, value in source.items():
        kind = type(value)
        if kind is _Tensor or (kind is not dict and is_tensor_kind[kind]):  # Parameter too
            if type(key) is not str:
                return None
            if ndim:
                try:  # a strided nested tensor has no .shape: the full path checks it
                    shape = value.shape
                except RuntimeError:
                    return None
                try:  # a value with fewer dims than the batch raises IndexError
                    if ndim == 2:
                        if shape[0] != first or shape[1] != second:
                            return None
                    elif ndim == 1:
                        if shape[0] != first:
                            return None
                    elif shape[:ndim] != size:
                        return None
                except IndexError:
                    return None
        elif kind is dict:
            if type(key) is not str:
                return None
            inner = build_fast(cls, value, size, ndim, first, second)
            if inner is None:
                return None
            node = _new(cls._plain_tensordict())
            node._data = inner
            node._batch_size = size
            node._device = None
            node._names = None
            node._is_locked = False
            data[key] = node
        else:
            return None
    return data


def items_of(other: Any, api: str) -> list:
    """The ``(key, value)`` pairs of a mapping or a container."""
    if getattr(type(other), "_is_tensordict", False):
        return list(other._data.items())
    if is_tensor_collection(other):
        return list(other._to_tensordict_view()._data.items())
    if isinstance(other, Mapping):
        return list(other.items())
    raise TypeError(
        f"TensorDict.{api}: expected a mapping (dict, TensorDict, ...), got {type(other).__name__}."
    )


def rollback(undo: list) -> None:
    """Undo structural writes: ``undo`` holds ``(dict, key, previous value or MISSING)``."""
    for data, key, old in reversed(undo):
        if old is _NO_DEFAULT:
            data.pop(key, None)
        else:
            data[key] = old


def convert(td, key, value: Any, batch_size: torch.Size, api: str = "set") -> Any:
    """Validate one new value against ``batch_size`` and return what is stored."""
    stored = _convert(td, key, value, batch_size, api)
    if td._names is not None and isinstance(stored, NonTensorData) and stored is not value:
        # a new leaf carries the container's dim names, as in tensordict
        own = stored.names[len(td._names) :]
        stored._names = checked_names([*td._names, *own], stored.batch_size, f"TensorDict.{api}")
    return stored


def _convert(td, key, value: Any, batch_size: torch.Size, api: str) -> Any:
    ndim = len(batch_size)
    if isinstance(value, _Tensor):
        check_batch_dims(api, key, leaf_shape(value), batch_size)
        if td._device is not None and value.device != td._device:
            value = value.to(td._device)
        return value
    if is_tensor_collection(value):
        if value.batch_size[:ndim] != batch_size:
            extended = _extended(value, batch_size)
            if extended is not None:
                return _convert(td, key, extended, batch_size, api)
            raise ValueError(
                f"TensorDict.{api}: the {type(value).__name__} at key {key!r} has batch "
                f"size {list(value.batch_size)}, which does not start with the batch size "
                f"{list(batch_size)}."
            )
        if td._device is not None and value.device != td._device:
            value = value.to(td._device)
        if td._names is not None:
            value = _named_like(td, key, value, api)
        elif ndim and value._names is not None and any(n is not None for n in value._names[:ndim]):
            # an unnamed container takes the names of a named level written into it
            td.names = list(value.names[:ndim])
        return value
    if isinstance(value, NonTensorData):
        if type(value) is NonTensorData:
            return NonTensorData._make(value.data, batch_size, td._device)
        if value.batch_size[:ndim] != batch_size:
            raise shape_error(api, key, value.batch_size, batch_size)
        return NonTensorStack._make(value.data, value.batch_size, td._device)
    if isinstance(value, Mapping):
        sub = td._plain_tensordict()._new_unsafe({}, batch_size, td._device, td._names)
        write(sub, items_of(value, api), False, True, api, key_parts(key))
        return sub
    if isinstance(value, _SCALARS) or (
        isinstance(value, np.ndarray) and value.dtype != np.dtype(object)
    ):
        tensor = torch.as_tensor(value, device=td._device)
        check_batch_dims(api, key, tensor.shape, batch_size, scalar=True)
        return tensor
    if isinstance(value, (list, tuple)):
        tensor = stacked_tensors(value)
        if tensor is not None:  # tensordict: a list of tensors of one shape is their stack
            if td._device is not None:
                tensor = tensor.to(td._device)
            check_batch_dims(api, key, tensor.shape, batch_size)
            return tensor
        # tensordict: in a list, tensors mixed with other values (numbers included) are
        # values, one per element; torch.as_tensor would turn 0-d tensors and numbers into
        # one tensor (a tuple still does, in both libraries)
        if type(value) is not list or not _holds_tensor(value):
            try:
                tensor = torch.as_tensor(value, device=td._device)
            except (TypeError, ValueError, RuntimeError):
                pass  # not numbers: kept as a Python value
            else:
                check_batch_dims(api, key, tensor.shape, batch_size)
                return tensor
        stack = stacked_list(value, batch_size, td._device, f"TensorDict.{api}", key)
        if stack is not None:
            return stack
    return NonTensorData._make(value, batch_size, td._device)


def _named_like(td, key, value: Any, api: str) -> Any:
    """``value`` with ``td``'s dim names on the batch dims they share.

    A nested level's leading dims are its parent's, so they carry the parent's
    names; the caller's object is left as it was (a shallow copy is named).
    """
    names = list(td._names)
    ndim = len(names)
    given = list(value.names)
    if given[:ndim] == names:
        return value
    clash = [(a, b) for a, b in zip(given, names) if a is not None and a != b]
    if clash:
        raise RuntimeError(
            f"TensorDict.{api}: the {type(value).__name__} at key {key!r} names its "
            f"leading batch dims {given[:ndim]}, which differ from the container's names "
            f"{names}."
        )
    value = value.clone(False)
    value._set_names([*names, *given[ndim:]], f"TensorDict.{api}")  # a frozen copy too
    return value


def _holds_tensor(value: list) -> bool:
    # a walk with its own stack: a list may nest deeper than Python's recursion limit
    # (the save path refuses such a value with a clear error, after this)
    # and may hold itself
    pending, seen = [value], {id(value)}
    while pending:
        for item in pending.pop():
            if isinstance(item, torch.Tensor):
                return True
            if type(item) is list and id(item) not in seen:
                seen.add(id(item))
                pending.append(item)
    return False


def stacked_tensors(value: list | tuple) -> torch.Tensor | None:
    """The stack of a (nested) list or tuple of tensors of one shape, their dtypes promoted
    as ``torch.cat`` does; None when anything else is inside or the shapes differ.

    Example:
        >>> stacked_tensors([torch.zeros(2), torch.ones(2, dtype=torch.int64)])
        tensor([[0., 0.],
                [1., 1.]])
    """
    first = value
    while type(first) in (list, tuple) and first:
        first = first[0]
    if not isinstance(first, torch.Tensor):  # numbers, strings, empty lists: not this rule
        return None
    return _stack_level(value)


def _stack_level(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        # nested tensors do not stack along a new dim: such a list stays a list of values
        return None if value.is_nested else value
    if type(value) not in (list, tuple) or not value:
        return None
    parts = []
    for item in value:
        part = _stack_level(item)
        if part is None or (parts and part.shape != parts[0].shape):
            return None
        parts.append(part)
    dtype = functools.reduce(torch.promote_types, [part.dtype for part in parts])
    return torch.stack([part.to(dtype) for part in parts])


def stacked_list(value: Any, batch_size, device, api: str, key) -> NonTensorStack | None:
    """Under ``set_list_to_stack(True)``, a list written with batch dims holds one item per
    element: its ``NonTensorStack``, or a ``BatchSizeMismatchError`` when its nesting does
    not start with the batch size (tensordict's rule). None when the rule does not apply.
    """
    if not (batch_size and type(value) is list and options.list_to_stack()):
        return None
    stack = stack_of_list(value, batch_size, device)
    if stack is None:
        raise BatchSizeMismatchError(
            f"{api}: batch dimension mismatch for the list at key {key!r}: its nesting "
            f"{_list_shape(value)} does not start with the batch size {list(batch_size)}. "
            f"Store it as one value with td.set_non_tensor(key, value), or under "
            f"set_list_to_stack(False)."
        )
    return stack


def _list_shape(value: Any) -> list[int]:
    shape = []
    while type(value) is list:
        shape.append(len(value))
        value = value[0] if value else None
    return shape


def _extended(value: Any, batch_size: torch.Size) -> Any:
    """A shallow copy of ``value`` with ``batch_size`` when its batch size is a strict
    prefix of ``batch_size`` and every entry fits it (as tensordict does); else None."""
    size = value.batch_size
    if len(size) >= len(batch_size) or batch_size[: len(size)] != size:
        return None
    extended = value.clone(False)
    try:
        extended.batch_size = batch_size
    except (ValueError, RuntimeError):
        return None
    return extended


def write(td, items, inplace, merge: bool, api: str, prefix: tuple = ()) -> None:
    """Write ``(key, value)`` pairs atomically.

    ``inplace``: False (replace), True (copy into existing tensors, create the
    rest) or ``"strict"`` (every key must exist). ``merge``: mappings merge into
    existing sub-TensorDicts instead of replacing them (``update``); a callable
    ``merge(value)`` decides per value (``update(is_leaf=...)``).
    """
    undo: list = []
    copies: list = []
    try:
        for key, value in items:
            write_path(
                td,
                key_parts(key, f"TensorDict.{api}"),
                value,
                inplace,
                merge,
                api,
                undo,
                copies,
                prefix,
            )
        for target, source, key in copies:
            check_copy_target(target, source, key, api)
    except BaseException:
        rollback(undo)
        raise
    done = 0
    try:
        for target, source, _ in copies:
            if isinstance(target, NonTensorData):
                target.update(source, inplace=True)
            else:
                target.copy_(source)
            done += 1
    except BaseException:
        if done:  # not foreseen by check_copy_target: the earlier copies stay written
            raise
        rollback(undo)
        raise


def assign_at(target: torch.Tensor, index, value) -> None:
    """``target[index] = value``, ``value`` cast to ``target``'s dtype.

    A write casts to the entry's dtype, as copy_ (and so a write at an int or a
    slice) does; torch's index_put_ (a tensor or mask index) refuses another dtype,
    after the entries before it in the plan were written. It refuses before writing
    anything, so the cast is made then, and the write done again (no dtype is read
    on the common path).
    """
    try:
        target[index] = value
    except RuntimeError:
        if not isinstance(value, torch.Tensor) or value.dtype == target.dtype:
            raise
        target[index] = value.to(target.dtype)


def check_fits(shape: torch.Size, expected: torch.Size, key, api: str) -> None:
    """``shape`` must broadcast to ``expected`` (the shape of the indexed entry)."""
    if shape == expected or not shape:  # a 0-dim value (a number) fits any entry
        return
    # torch drops leading size-1 dims of the value: x[0] = torch.ones(1, 28, 28)
    # writes a [28, 28] row
    while len(shape) > len(expected) and shape[0] == 1:
        shape = shape[1:]
    # broadcasts to ``expected`` itself: each dim, aligned on the right, is 1 or the
    # entry's (torch.broadcast_shapes is Python code several times slower than this)
    ok = len(shape) <= len(expected) and all(
        size == 1 or size == target for size, target in zip(reversed(shape), reversed(expected))
    )
    if not ok:
        shown = key[0] if len(key) == 1 else key
        raise EntryShapeError(
            f"TensorDict.{api}: cannot write a value of shape {list(shape)} at key "
            f"{shown!r}: the indexed entry has shape {list(expected)}."
        )


def _has_storage(existing: Any) -> bool:
    """Whether the non-tensor leaf ``existing`` is stored somewhere a write must reach:
    elements of a stack read through an index, or a leaf written to a file (``memmap``)."""
    return isinstance(existing, NonTensorData) and (
        "_view_of" in existing.__dict__ or "_write_back" in existing.__dict__
    )


def _overlaps(target: torch.Tensor, compiling: bool) -> bool:
    """Whether several elements of ``target`` share memory (an expanded tensor)."""
    if compiling:  # the exact query is not traceable; expanding is the usual cause
        return any(s == 0 and n > 1 for s, n in zip(target.stride(), target.shape))
    return torch._debug_has_internal_overlap(target) == 1


def check_copy_target(target: Any, source: Any, key, api: str) -> None:
    """Raise now what ``target.copy_(source)`` would raise, before any entry is written."""
    if isinstance(target, NonTensorData):
        stored = "_write_back" in target.__dict__
        if stored and type(target) is NonTensorData and type(source) is NonTensorStack:
            raise ValueError(
                f"TensorDict.{api}: cannot write the NonTensorStack at key {key!r} in place "
                f"into the memory-mapped NonTensorData there: a NonTensorData holds one value "
                f"for its whole batch, and its file has room for one. Nothing was written. "
                f"Hint: write one value, or save the container again with the stack."
            )
        return  # elements of a stack: any value fits
    problem = None
    compiling = _dynamo_compiling()
    if torch.is_grad_enabled() and target.requires_grad:
        base = target._base if target._is_view() else target
        if base is not None and base.is_leaf:
            problem = "it is a leaf tensor that requires grad (write under torch.no_grad())"
    elif compiling:
        pass
    elif target.is_inference() and not torch.is_inference_mode_enabled():
        problem = "it is an inference tensor (write inside torch.inference_mode())"
    if problem is None and target.is_nested:
        # a nested tensor is never expanded; its components must match one for one
        given = source.unbind(0) if isinstance(source, torch.Tensor) and source.is_nested else ()
        if [t.shape for t in target.unbind(0)] != [t.shape for t in given]:
            problem = "a nested tensor takes a nested tensor of the same component shapes"
    elif problem is None and _overlaps(target, compiling):
        problem = "several of its elements share memory (an expanded tensor: clone it first)"
    if problem is not None:
        raise RuntimeError(
            f"TensorDict.{api}: cannot write in place into the tensor at key {key!r}: "
            f"{problem}. Nothing was written."
        )


def _strict_missing(td, parts, api, prefix) -> KeyError:
    """The error of an in-place write to a key that does not exist (with a hint to add it)."""
    message = td._missing(parts, api, prefix).args[0]
    return KeyError(
        f"{message} {api} writes into existing entries only and this key was not found; "
        f"use {'set' if api == 'set_' else 'update'} to add it."
    )


def write_path(td, parts, value, inplace, merge, api, undo, copies, prefix) -> None:
    node = td
    last = len(parts) - 1
    for depth in range(last):
        part = parts[depth]
        inner = node._data.get(part, _NO_DEFAULT)
        if inner is _NO_DEFAULT:
            # create the missing sub-TensorDicts, with the batch size of their parent
            if inplace == "strict":
                raise _strict_missing(td, parts, api, prefix)
            node._check_writable(api, full_key(prefix, parts))
            size = node._batch_size
            leaf = convert(node, full_key(prefix, parts), value, size, api)
            for name in reversed(parts[depth + 1 :]):
                leaf = node._plain_tensordict()._new_unsafe({name: leaf}, size, node._device)
            undo.append((node._data, part, _NO_DEFAULT))
            node._data[part] = leaf
            return
        if not getattr(type(inner), "_is_tensordict", False):
            if not is_tensor_collection(inner):
                raise KeyError(
                    f"TensorDict.{api}: cannot write key {full_key(prefix, parts)!r}: "
                    f"{full_key(prefix, parts[: depth + 1])!r} holds a {type(inner).__name__}, "
                    f"not a TensorDict."
                )
            view = writable_view(inner, api, full_key(prefix, parts))  # frozen: its error first
            check_field(inner, parts[depth + 1], api)
            inner = view
        node = inner
    key = parts[last]
    full = full_key(prefix, parts)
    existing = node._data.get(key, _NO_DEFAULT)
    if existing is _NO_DEFAULT:
        if inplace == "strict":
            raise _strict_missing(td, parts, api, prefix)
        node._check_writable(api, full)
    elif inplace or (merge and is_tensor_collection(existing) and (merge is True or merge(value))):
        if isinstance(existing, _Tensor):
            if node._is_locked == FROZEN:
                writable_view(node, api, full)
            source = inplace_source(existing, value, full, api, node._batch_size)
            copies.append((existing, source, full))
            return
        if is_tensor_collection(existing):
            if isinstance(value, Mapping) or is_tensor_collection(value):
                inner = writable_view(existing, api, full)
                for sub_key, sub_value in items_of(value, api):
                    check_field(existing, key_parts(sub_key, f"TensorDict.{api}")[0], api)
                    write_path(
                        inner,
                        key_parts(sub_key, f"TensorDict.{api}"),
                        sub_value,
                        inplace,
                        merge,
                        api,
                        undo,
                        copies,
                        prefix + parts,
                    )
                return
            if inplace:
                raise TypeError(
                    f"TensorDict.{api}: cannot write a {type(value).__name__} in place into "
                    f"the {type(existing).__name__} at key {full!r}; pass a mapping."
                )
    new = convert(node, full, value, node._batch_size, api)
    if inplace and _has_storage(existing) and isinstance(new, NonTensorData):
        if node._is_locked == FROZEN:
            writable_view(node, api, full)
        # elements of a stack read through an index (td[0], td[1:]), or a leaf saved by
        # memmap: written in place, as a tensor view or a mapped tensor is, the new value
        # reaches the stack or the file (with the tensor copies); replacing the leaf
        # would leave them holding the old value
        copies.append((existing, new, full))
        return
    if existing is not _NO_DEFAULT and node._is_locked:
        # Replacing an entry is structural; a bad value is reported first, as by set. A
        # non-tensor value has no storage to copy into: written in place, it is replaced.
        swaps_value = inplace and isinstance(existing, NonTensorData)
        if not (swaps_value and isinstance(new, NonTensorData)) or node._is_locked == FROZEN:
            node._check_writable(api, full)
    undo.append((node._data, key, existing))
    node._data[key] = new
    if is_tensor_collection(new):
        hand_out(node, new)  # the caller may hold it: its batch size now answers to node's


def rename_key(td, old_key, new_key, safe: bool = False) -> None:
    """Rename ``old_key`` to ``new_key`` in ``td`` (atomic); see ``TensorDict.rename_key_``."""
    old_parts = key_parts(old_key, "TensorDict.rename_key_")
    new_parts = key_parts(new_key, "TensorDict.rename_key_")
    check_field(td, new_parts[0], "rename_key_")
    value = td._get_leaf(old_parts, "rename_key_")
    if old_parts == new_parts:
        return
    if new_parts[: len(old_parts)] == old_parts:
        raise ValueError(
            f"TensorDict.rename_key_: cannot move key {unravel_key(old_key)!r} inside itself "
            f"({unravel_key(new_key)!r})."
        )
    if safe and new_key in td:
        raise KeyError(
            f"TensorDict.rename_key_: key {unravel_key(new_key)!r} already present in "
            f"TensorDict; pass safe=False to replace it."
        )
    owner = td._get_leaf(old_parts[:-1]) if len(old_parts) > 1 else td
    owner = writable_view(owner, "rename_key_", unravel_key(old_key))
    owner._check_writable("rename_key_", unravel_key(old_key))
    # validate the destination before anything moves
    node: Any = td
    for depth, part in enumerate(new_parts[:-1]):
        inner = node._data.get(part, _NO_DEFAULT)
        if inner is _NO_DEFAULT:
            node._check_writable("rename_key_", unravel_key(new_key))
            break
        if not is_tensor_collection(inner):
            raise KeyError(
                f"TensorDict.rename_key_: cannot write key {unravel_key(new_key)!r}: "
                f"{new_parts[: depth + 1]!r} holds a {type(inner).__name__}, not a TensorDict."
            )
        node = writable_view(inner, "rename_key_", unravel_key(new_key))
        check_field(inner, new_parts[depth + 1], "rename_key_")
    else:
        if new_parts[-1] in node._data:
            node._check_writable("rename_key_", unravel_key(new_key))
    convert(node, unravel_key(new_key), value, node._batch_size, "rename_key_")
    undo: list = []
    order = list(owner._data)
    try:
        undo.append((owner._data, old_parts[-1], owner._data.pop(old_parts[-1])))
        write_path(td, new_parts, value, False, False, "rename_key_", undo, [], ())
    except BaseException:
        rollback(undo)
        if list(owner._data) != order:  # the popped key goes back to its place
            entries = dict(owner._data)
            owner._data.clear()
            owner._data.update((k, entries[k]) for k in order)
        raise


def check_field(owner: Any, name: str, api: str) -> None:
    """A TensorClass takes only its fields as keys, written directly or through a parent.

    The check runs before anything is written (its ``set`` raises the same error).
    """
    fields = getattr(type(owner), "_tc_field_names", None)
    if fields is not None and name not in fields and name not in owner._data:
        cls = type(owner).__name__
        raise AttributeError(
            f"{cls}.{api}: {name!r} is not a field of {cls}; the fields are {sorted(fields)}. "
            f"Nothing was written."
        )


def full_key(prefix: tuple, parts: tuple):
    """The key to show in messages: a ``str`` or a flat tuple."""
    full = prefix + parts
    return full[0] if len(full) == 1 else full


def check_batch_dims(api: str, key, shape, batch_size, scalar: bool = False) -> None:
    """The one shape rule of every write (``set``, ``set_``, locked and in-place writes,
    ``apply_``): a value's leading dims equal the batch size; never broadcast into it."""
    ndim = len(batch_size)
    if ndim and shape[:ndim] != batch_size:
        raise shape_error(api, key, shape, batch_size, scalar)


def shape_error(api: str, key, shape, batch_size, scalar: bool = False) -> ValueError:
    # both a ValueError (a bad value) and the RuntimeError tensordict raises there
    hint = (
        " Python scalars are stored as 0-dim tensors: expand the value to the batch size "
        "(torch.full(batch_size, value)) or wrap it in NonTensorData."
        if scalar
        else " The leading dims of every value must equal the batch size."
    )
    return BatchSizeMismatchError(
        f"TensorDict.{api}: the value at key {key!r} has shape {list(shape)}, which does not "
        f"start with the batch size {list(batch_size)}.{hint}"
    )


def inplace_source(existing: torch.Tensor, value: Any, key, api: str, batch_size) -> torch.Tensor:
    """Check that ``value`` can be copied into ``existing``; return it as a tensor.

    The value passes the same batch-size check as a new value (``set``): written in
    place into a locked or memory-mapped container, a scalar or a single row must
    not silently fill every row. Only the feature dims may broadcast, as ``copy_``
    does.
    """
    scalar = not isinstance(value, _Tensor)
    if scalar:
        if isinstance(value, (Mapping, NonTensorData)) or is_tensor_collection(value):
            raise TypeError(
                f"TensorDict.{api}: cannot write a {type(value).__name__} in place into the "
                f"tensor at key {key!r}."
            )
        try:
            value = torch.as_tensor(value, device=existing.device)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"TensorDict.{api}: cannot write a {type(value).__name__} in place into the "
                f"tensor at key {key!r}."
            ) from None
    shape, target = leaf_shape(value), leaf_shape(existing)  # -1 at ragged dims
    check_batch_dims(api, key, shape, batch_size, scalar)
    if shape != target:
        try:  # nested tensors never broadcast
            ok = not (value.is_nested or existing.is_nested) and (
                torch.broadcast_shapes(shape, target) == target
            )
        except RuntimeError:
            ok = False
        if not ok:
            raise EntryShapeError(
                f"TensorDict.{api}: cannot write a value of shape {list(shape)} in place "
                f"into key {key!r} of shape {list(target)} (an in-place write keeps "
                f"the entry's shape; unlock the container and use set to replace it)."
            )
    return value
