"""The base of the shared method mixins: what they may use of the container.

Each mixin (shape ops, apply, arithmetic, access, ...) lives in its own module and
reads the container only through the state declared here. ``TensorDict`` keeps
that state in slots; a ``TensorClass`` instance forwards it to its inner
TensorDict. Results are built with ``self._like(data, batch_size, names)`` (a
container of the same kind as ``self``), structural writes are checked with
``self._check_writable(api, key)`` and value writes with ``self._check_mutable(api)``
(a frozen TensorClass refuses both).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .nontensor import NonTensorData


def is_tensor_collection(obj: object) -> bool:
    """True for a ``TensorDict`` or a ``TensorClass`` instance.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict
        >>> is_tensor_collection(TensorDict()), is_tensor_collection({})
        (True, False)
    """
    return getattr(type(obj), "_is_tensor_collection", False)


def read_value(value: Any) -> Any:
    """What reading a stored value returns: non-tensor leaves give their Python value."""
    if isinstance(value, NonTensorData):
        return value.tolist()
    return value


class ContainerMixin:
    """Declarations shared by the mixins of ``TensorDict`` and ``TensorClass``."""

    __slots__ = ()

    _batch_size: torch.Size
    _data: dict
    _device: torch.device | None
    _names: tuple | None
    _is_locked: bool

    def _check_mutable(self, api: str) -> None:
        """Refuse a write of values in place (a frozen TensorClass); a TensorDict accepts."""

    if TYPE_CHECKING:

        def _like(
            self, data: dict, batch_size: torch.Size | None = ..., names: Any = ...
        ) -> Any: ...
        def _check_writable(self, api: str, key: Any) -> None: ...
        def _get_leaf(self, key: Any, api: str = ...) -> Any: ...
        def _shallow_copy(self) -> Any: ...
        def _apply_tree(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...
        def _tensor_leaves(self) -> Any: ...
        def _to_tensordict_view(self) -> Any: ...
        def _missing(self, key: Any, api: str = ..., prefix: tuple = ...) -> KeyError: ...
