"""The entries of a non-tensor leaf seen as a tensor collection: there are none.

tensordict counts a non-tensor leaf as a tensor collection (``is_tensor_collection``
is true for it), so code that walks a container level by level (``values()`` of every
value for which ``is_tensor_collection`` holds) steps into the leaf: it finds no keys,
and so never takes the leaf for a tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class _NoEntries:
    """``keys``, ``values`` and ``items`` of ``NonTensorData`` and ``NonTensorStack``:
    empty, whatever the arguments (the value is data, not a key)."""

    __slots__ = ()

    def keys(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable | None = None,
        *,
        sort: bool = False,
    ) -> Iterator[Any]:
        """No keys.

        Example:
            >>> list(NonTensorData("a", batch_size=[2]).keys())
            []
        """
        return iter(())

    def values(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable | None = None,
        *,
        sort: bool = False,
    ) -> Iterator[Any]:
        """No values (the leaf's value is its ``data``)."""
        return iter(())

    def items(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf: Callable | None = None,
        *,
        sort: bool = False,
    ) -> Iterator[tuple]:
        """No items."""
        return iter(())
