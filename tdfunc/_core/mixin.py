"""The base of ``TensorDict``'s method mixins: what they may use of the container.

Each mixin (shape ops, apply, arithmetic, ...) lives in its own module and calls
into the container through the attributes and methods declared here; they are
provided by ``TensorDict`` and declared only so that type checkers see them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch


class ContainerMixin:
    """Declarations shared by the mixins of ``TensorDict`` (no behaviour)."""

    __slots__ = ()

    _batch_size: torch.Size
    _data: dict
    _device: torch.device | None
    _names: tuple | None
    _is_locked: bool
    if TYPE_CHECKING:

        def _like(
            self, data: dict, batch_size: torch.Size | None = ..., names: Any = ...
        ) -> Any: ...
        def _check_writable(self, api: str, key: Any) -> None: ...
        def _get_leaf(self, key: Any, api: str = ...) -> Any: ...
        def _shallow_copy(self) -> Any: ...
        def _apply_tree(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...
        def _tensor_leaves(self) -> Any: ...
