"""The container methods for non-tensor entries (``set_non_tensor`` and friends)."""

from __future__ import annotations

from typing import Any

import torch

from ..helpers.nested_keys import MISSING, key_parts
from ..helpers.nontensor.leaves import NonTensorData


class NonTensorMixin:
    """``set_non_tensor`` / ``get_non_tensor`` / ``is_non_tensor`` / ``non_tensor_items``.

    Reads state only through ``get``, ``_iter_items`` and ``_write`` of the
    container, so a TensorClass can take it as it is.

    Example:
        >>> td = TensorDict({}, [2]).set_non_tensor(("nested", "label"), "cat")
        >>> td.get_non_tensor(("nested", "label")), td["nested", "label"]
        ('cat', 'cat')
        >>> td.get(("nested", "label")).data
        'cat'
    """

    __slots__ = ()

    def set_non_tensor(self, key, value: Any):
        """Store ``value`` (numbers too) as non-tensor data at ``key``; returns self."""
        if not isinstance(value, NonTensorData):
            value = NonTensorData._make(value, torch.Size(), None)
        self._write(((key, value),), False, False, "set_non_tensor")  # type: ignore[attr-defined]
        return self

    def get_non_tensor(self, key, default: Any = MISSING) -> Any:
        """The Python value of the non-tensor entry at ``key`` (other entries as they are)."""
        value = self._get_nested(key_parts(key, "get_non_tensor"))  # type: ignore[attr-defined]
        if value is MISSING:
            if default is MISSING:
                raise self._missing(key, "get_non_tensor")  # type: ignore[attr-defined]
            return default
        return value._value() if isinstance(value, NonTensorData) else value

    def is_non_tensor(self, key) -> bool:
        """Whether the entry stored at ``key`` is non-tensor data (``KeyError`` if missing)."""
        value = self._get_nested(key_parts(key, "is_non_tensor"))  # type: ignore[attr-defined]
        if value is MISSING:
            raise self._missing(key, "is_non_tensor")  # type: ignore[attr-defined]
        return isinstance(value, NonTensorData)

    def non_tensor_items(self, include_nested: bool = False) -> tuple:
        """``(key, NonTensorData)`` pairs of the non-tensor entries."""
        return tuple(
            (key, value)
            for key, value in self._iter_items((), include_nested, True)  # type: ignore[attr-defined]
            if isinstance(value, NonTensorData)
        )
