"""Which directory a container mirrors: set by ``memmap``/``load_memmap``, read by
``saved_path`` and by a later save that may reuse the files.

Keyed on ``id`` with a weak reference, so the record goes with the object and a new
object at a recycled address is never taken for the old one.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

_SAVED: dict[int, tuple[weakref.ref, str]] = {}


def remember_path(obj: Any, directory: str) -> None:
    """Record that ``obj`` mirrors ``directory`` (read back by ``saved_path``)."""
    key = id(obj)

    def forget(ref, key=key):
        if _SAVED.get(key, (None,))[0] is ref:
            del _SAVED[key]

    with contextlib.suppress(TypeError):  # no weak references: nothing to remember
        _SAVED[key] = (weakref.ref(obj, forget), directory)


def saved_path_of(obj: Any) -> str | None:
    entry = _SAVED.get(id(obj))
    if entry is None or entry[0]() is not obj:
        return None
    return entry[1]
