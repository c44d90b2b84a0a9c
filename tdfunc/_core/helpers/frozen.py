"""Frozen is deep: the TensorDicts inside a frozen TensorClass refuse every write.

A frozen TensorClass's own TensorDict, and every TensorDict nested in it, have
``_is_locked == FROZEN`` (truthy, so every "locked" check refuses structural
changes too). In-place methods of a container call :func:`refuse_frozen_inside`
first, so that a write through a *parent* (``parent.apply_``,
``parent.load_memmap_``, ``parent.memmap_``, ``parent.zero_`` ...) never reaches
a frozen child: the whole write is refused before anything changes.
"""

from __future__ import annotations

from typing import Any

from .mixin import FROZEN as FROZEN
from .mixin import is_tensor_collection as _collection


def freeze(td: Any) -> None:
    """Mark ``td`` (the TensorDict of a frozen TensorClass) and everything below frozen."""
    td._is_locked = FROZEN
    for value in td._data.values():
        if _collection(value):
            inner = value._to_tensordict_view()
            if inner._is_locked != FROZEN:
                freeze(inner)


def is_frozen(container: Any) -> bool:
    """True for a frozen TensorClass instance and the TensorDicts inside one."""
    if getattr(type(container), "_tc_frozen", False):
        return True
    return getattr(container, "_is_locked", False) == FROZEN


def find_frozen(container: Any, at: tuple = ()) -> tuple[tuple, Any] | None:
    """(key path, container) of the first frozen container in ``container`` (itself: ``()``)."""
    if is_frozen(container):
        return at, container
    for key, value in container._to_tensordict_view()._data.items():
        if _collection(value):
            found = find_frozen(value, at + (key,))
            if found is not None:
                return found
    return None


def refuse_frozen_inside(container: Any, api: str) -> None:
    """Raise before an in-place write of ``container`` that would reach frozen data."""
    found = find_frozen(container)
    if found is None:
        return
    at, frozen = found
    if getattr(type(frozen), "_tc_frozen", False):
        what = f"a frozen {type(frozen).__name__}"
    else:
        what = "a TensorDict of a frozen TensorClass"
    where = f"the entry at key {at[0] if len(at) == 1 else at!r}" if at else "this container"
    raise RuntimeError(
        f"TensorDict.{api}: cannot write: {where} is inside {what}, which refuses every "
        f"write; nothing was written. Build new values out of place instead (apply, +, ...)."
    )
