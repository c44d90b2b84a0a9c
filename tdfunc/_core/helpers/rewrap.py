"""Results in the caller's class, and the device dropped from a whole tree."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .mixin import is_tensor_collection as _collection

if TYPE_CHECKING:
    pass


def rewrap(original: Any, result):
    """``result`` (a TensorDict built from ``original``'s view) in ``original``'s class."""
    if getattr(type(original), "_is_tensordict", False):
        return result
    return type(original)._from_pytree(
        result._data, result._batch_size, result._device, result._names
    )


def drop_device(container: Any) -> Any:
    """No device at any level (the leaves live on several devices); returns ``container``."""
    view = container._to_tensordict_view()
    view._device = None
    for value in view._data.values():
        if _collection(value):
            drop_device(value)
    return container
