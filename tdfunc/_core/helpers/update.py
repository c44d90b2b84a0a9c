"""Keyword forms of writes: ``update(clone=, keys_to_update=, is_leaf=,
update_batch_size=)`` and ``non_blocking=``.

``update_items`` turns the source of an update into the ``(key, value)`` pairs
the write engine takes (the engine keeps the update atomic); ``send_for_set``
and ``moved`` send tensors to their device without blocking before a write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .mixin import is_tensor_collection
from .nested_keys import MISSING, key_parts
from .nontensor import NonTensorData
from .parents import check_parent_batch
from .sizes import BatchSizeMismatchError
from .writes import items_of


def _leaves(source: Any, prefix: tuple):
    """``(key path, value)`` for every leaf below ``source`` (a mapping or a container)."""
    for key, value in items_of(source, "update"):
        parts = prefix + key_parts(key, "TensorDict.update")
        if isinstance(value, Mapping) or is_tensor_collection(value):
            inner = list(_leaves(value, parts))
            yield from inner if inner else [(parts, value)]
        else:
            yield parts, value


def _selected(parts: tuple, wanted: list, dest: Any) -> bool:
    """Is the source leaf at ``parts`` written by an update limited to ``wanted`` keys?

    It is when it lies under a wanted key. As in tensordict, a wanted key whose level
    ``dest`` (the container updated, or None) does not have yet brings the source's
    whole level: updating ``("a", "b")`` into a container without ``"a"`` writes all
    of the source's ``"a"``.
    """
    for w in wanted:
        if parts[: len(w)] == w:
            return True
        if dest is None:
            continue
        for depth in range(1, min(len(w), len(parts))):
            if parts[depth - 1] != w[depth - 1]:
                break
            if dest._get_nested(parts[:depth]) is MISSING:
                return True
    return False


def update_items(
    source: Any,
    clone: bool,
    keys_to_update,
    non_blocking: bool,
    device,
    api: str = "update",
    dest: Any = None,
) -> list:
    """The pairs to write for ``td.update(source, clone=..., keys_to_update=...)``.

    ``dest`` is the container updated, when levels it lacks come whole (``update``).
    """
    if source is None:
        return []
    if keys_to_update is None and not clone and not (non_blocking and device is not None):
        return items_of(source, api)
    wanted = None
    if keys_to_update is not None:
        wanted = [key_parts(key, f"TensorDict.{api}") for key in keys_to_update]
    if wanted is not None and dest is not None:
        pairs = _limited(items_of(source, api), wanted, dest, ())
    else:
        pairs = (
            (parts, value)
            for parts, value in _leaves(source, ())
            if wanted is None or _selected(parts, wanted, dest)
        )
    items = []
    for parts, value in pairs:
        if isinstance(value, torch.Tensor):
            if clone:
                value = value.clone()
            if non_blocking and device is not None and value.device != device:
                value = value.to(device, non_blocking=True)
        elif clone and (is_tensor_collection(value) or isinstance(value, Mapping)):
            value = _cloned(value)
        items.append((parts, value))
    return items


def _limited(items, wanted: list, dest: Any, prefix: tuple):
    """The ``(key path, value)`` pairs that ``update(keys_to_update=wanted)`` writes into
    ``dest``.

    An entry whose first key starts no wanted key is skipped. One that meets a nested
    container of ``dest`` goes into it, limited to the wanted keys below that level
    (all of what it holds when the level itself is wanted). Anything else (a level
    ``dest`` lacks, a leaf in the way) is written whole at its key, as ``update``
    without ``keys_to_update`` writes it: so limiting an update never turns a write it
    would do into an error.
    """
    for key, value in items:
        parts = key_parts(key, "TensorDict.update")
        first, rest = parts[0], parts[1:]
        if not any(w[0] == first for w in wanted):
            continue
        target = dest._to_tensordict_view()._data.get(first, MISSING)
        nested = isinstance(value, Mapping) or is_tensor_collection(value)
        if (first,) in wanted or not is_tensor_collection(target) or not (rest or nested):
            yield prefix + parts, value
            continue
        inner = [w[1:] for w in wanted if w[0] == first and len(w) > 1]
        inner_items = [(rest, value)] if rest else items_of(value, "update")
        yield from _limited(inner_items, inner, target, prefix + (first,))


def _cloned(value: Any) -> Any:
    """A copy of ``value`` whose tensors are cloned (mappings and containers at any depth)."""
    if isinstance(value, torch.Tensor) or is_tensor_collection(value):
        return value.clone()
    if isinstance(value, Mapping):
        return {k: _cloned(v) for k, v in value.items()}
    return value


def send_for_set(td, key, value: torch.Tensor, inplace: bool) -> torch.Tensor:
    """``value`` sent without blocking to where ``td.set(key, value)`` will store it."""
    copied = (inplace or td._is_locked) and td._data
    existing = td._get_nested(key_parts(key)) if copied else MISSING
    device = existing.device if isinstance(existing, torch.Tensor) else td._device
    if device is None or value.device == device:
        return value
    return value.to(device, non_blocking=True)


def moved(source: Mapping, device: torch.device) -> dict:
    """``source`` with its tensors already sent to ``device`` without blocking."""
    return {
        k: v.to(device, non_blocking=True)
        if isinstance(v, torch.Tensor)
        else (moved(v, device) if type(v) is dict else v)
        for k, v in source.items()
    }


def merge_rule(is_leaf, plain: type):
    """``merge`` for the write engine: ``True``, or a callable when ``is_leaf`` is given.

    ``is_leaf(type)`` true for the type of a nested value means the value is
    written whole (replacing the existing container) instead of merged into it.
    A plain mapping is asked about as a ``TensorDict`` (tensordict converts it first).
    """
    if is_leaf is None:
        return True

    def merges(value: Any) -> bool:
        kind = type(value) if is_tensor_collection(value) else plain
        return not is_leaf(kind)

    return merges


def _fits(value: Any, size: torch.Size) -> bool:
    """Whether ``value`` can stay in a container whose batch size becomes ``size``."""
    if type(value) is NonTensorData:
        return True  # takes any batch size
    if isinstance(value, torch.Tensor):
        shape = value.shape
    else:
        shape = getattr(value, "batch_size", None)
    return shape is None or tuple(shape[: len(size)]) == tuple(size)


def resize_plan(td, source: Any, merges, api: str = "update") -> list:
    """``(container, new batch size)`` for ``update(update_batch_size=True)``.

    ``td`` takes ``source``'s batch size, and so does every nested container of
    ``td`` that ``source`` merges into. Raises before anything changes when an
    entry that the update keeps would not fit its container's new batch size.
    """
    if not is_tensor_collection(source):
        return []
    node = td._to_tensordict_view() if not getattr(type(td), "_is_tensordict", False) else td
    size = source.batch_size
    plan = [(node, size)]
    incoming = dict(items_of(source, api))
    for key, value in node._data.items():
        new = incoming.get(key, MISSING)
        if new is MISSING:
            if not _fits(value, size):
                raise ValueError(
                    f"TensorDict.{api}(update_batch_size=True): the entry at key {key!r} is "
                    f"kept and does not fit the new batch size {list(size)}. Nothing was written."
                )
            continue
        merged = (
            is_tensor_collection(value)
            and is_tensor_collection(new)
            and (merges is True or merges(new))
        )
        if merged:
            plan.extend(resize_plan(value, new, merges, api))
    return plan


def check_batch_sizes(td, source: Any, update_batch_size: bool, inplace: bool) -> None:
    """Refuse ``td.update(source)`` when the two containers' batch sizes clearly differ
    (their common leading dims disagree) and ``update_batch_size`` is not set, and a
    resizing update asked to be in place."""
    if not is_tensor_collection(source):
        return
    mine, theirs = tuple(td.batch_size), tuple(source.batch_size)
    if update_batch_size:
        if inplace and mine != theirs:
            raise BatchSizeMismatchError(
                f"TensorDict.update: update_batch_size=True changes the batch size from "
                f"{list(mine)} to {list(theirs)}, which replaces the entries: it cannot be "
                f"done with inplace=True. Nothing was written."
            )
        return
    if mine[: len(theirs)] != theirs[: len(mine)]:
        raise BatchSizeMismatchError(
            f"TensorDict.update: the source has batch size {list(theirs)}, which does not "
            f"match this container's {list(mine)}. Pass update_batch_size=True to take the "
            f"source's batch size. Nothing was written."
        )


def levels_of(td):
    """``td`` and every nested TensorDict below it."""
    yield td
    for value in td._data.values():
        if getattr(type(value), "_is_tensordict", False):
            yield from levels_of(value)


def write_through_lock(td, items, inplace, merge) -> None:
    """``update(..., ignore_lock=True)`` of a locked ``td``: the write with every lock
    lifted; then the levels locked before are locked again, and so are those the write
    added (a locked tree stays locked at every level)."""
    locked = [node for node in levels_of(td) if node._is_locked]
    for node in locked:
        node._is_locked = False
    try:
        td._write(items, inplace, merge, "update")
    except BaseException:
        for node in locked:
            node._is_locked = True
        raise
    for node in levels_of(td):
        node._is_locked = True


def resized(td, plan: list, items, inplace, merge, ignore_lock: bool):
    """``td.update(..., update_batch_size=True)``: resize the planned containers, then write.

    The sizes are restored when the write fails, so the update stays atomic.
    """
    changed = [(node, size) for node, size in plan if node._batch_size != size]
    if changed and changed[0][0] is plan[0][0]:  # the level update was called on
        check_parent_batch(td, changed[0][1], "TensorDict.update(update_batch_size=True)")
    for node, _ in changed:
        if node._is_locked and not ignore_lock:
            raise RuntimeError(
                "TensorDict.update(update_batch_size=True): cannot change the batch size of a "
                "locked TensorDict. Nothing was written."
            )
    saved = [(node, node._batch_size, node._names) for node, _ in changed]
    for node, size in changed:
        if node._names is not None and len(node._names) != len(size):
            node._names = None
        node._batch_size = size
    try:
        if ignore_lock and td._is_locked:
            write_through_lock(td, items, inplace, merge)
        else:
            td._write(items, inplace, merge, "update")
    except BaseException:
        for node, size, names in saved:
            node._batch_size = size
            node._names = names
        raise
    for node, size in reversed(changed):
        node.batch_size = size  # refreshes non-tensor data to the new size
    return td
