"""Whether a container holds attrs instances, and the attrs class of a value."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .class_names import lookup_class
from .mixin import is_tensor_collection as _collection

if TYPE_CHECKING:
    pass


def _attrs_class() -> type:
    return lookup_class("tdfunc.TensorAttrs")


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
