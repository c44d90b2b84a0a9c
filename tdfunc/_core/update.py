"""Keyword forms of writes: ``update(clone=, keys_to_update=)`` and ``non_blocking=``.

``update_items`` turns the source of an update into the ``(key, value)`` pairs
the write engine takes (the engine keeps the update atomic); ``send_for_set``
and ``moved`` send tensors to their device without blocking before a write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .keys import MISSING, key_parts
from .mixin import is_tensor_collection
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


def update_items(
    source: Any, clone: bool, keys_to_update, non_blocking: bool, device, api: str = "update"
) -> list:
    """The pairs to write for ``td.update(source, clone=..., keys_to_update=...)``."""
    if source is None:
        return []
    if keys_to_update is None and not clone and not (non_blocking and device is not None):
        return items_of(source, api)
    wanted = None
    if keys_to_update is not None:
        wanted = [key_parts(key, f"TensorDict.{api}") for key in keys_to_update]
    items = []
    for parts, value in _leaves(source, ()):
        if wanted is not None and not any(parts[: len(w)] == w for w in wanted):
            continue
        if isinstance(value, torch.Tensor):
            if clone:
                value = value.clone()
            if non_blocking and device is not None and value.device != device:
                value = value.to(device, non_blocking=True)
        elif clone and is_tensor_collection(value):
            value = value.clone()
        items.append((parts, value))
    return items


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
