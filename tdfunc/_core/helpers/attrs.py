"""Whether a container holds attrs instances, and the attrs class of a value."""

from __future__ import annotations

from typing import Any

from .hooks import HOOKS
from .mixin import is_tensor_collection as _collection


def _attrs_class() -> type:
    return HOOKS.tensor_attrs


def holds_attrs(obj: Any) -> bool:
    """True when the container ``obj`` is (or holds, at any level) ``TensorAttrs``."""
    kind = _attrs_class()
    if isinstance(obj, kind):
        return True
    view = obj._to_tensordict_view()
    return any(
        isinstance(value, kind) or (_collection(value) and holds_attrs(value))
        for value in view._data.values()
    )
