"""Shape rules shared by the shape mixins and padding (new contents, batch checks, ragged dims)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .mixin import ContainerMixin
from .parents import check_parent_batch
from .pieces import take_contents

if TYPE_CHECKING:
    pass
from typing import TYPE_CHECKING

from .nontensor import NonTensorData
from .sizes import leaf_shape
from .writes import check_batch_dims

if TYPE_CHECKING:
    pass
from .mixin import is_tensor_collection

if TYPE_CHECKING:
    pass


def _become(self: Any, out: Any, api: str) -> Any:
    """``inplace=True``: ``self`` takes the leaves and batch size of ``out``."""
    self._check_writable(api, list(self._data))
    check_parent_batch(self, out._batch_size, f"TensorDict.{api}")
    take_contents(self, out)
    return self


def _check_batch(
    container, batch_size: torch.Size, prefix: tuple, api: str = "_check_batch_size"
) -> None:
    for key, item in container._data.items():
        path = prefix + (key,)
        shown = path[0] if len(path) == 1 else path
        shape = item.batch_size if isinstance(item, (ContainerMixin, NonTensorData)) else None
        if isinstance(item, torch.Tensor):
            shape = leaf_shape(item)
        elif shape is None:
            shape = getattr(item, "shape", None)
        if shape is None:
            continue
        check_batch_dims(api, shown, torch.Size(shape), batch_size)
        if isinstance(item, ContainerMixin):
            _check_batch(item, item._batch_size, path, api)


def _clean(names: tuple | None) -> tuple | None:
    """Names as stored: None when no dim is named."""
    if names is None or all(n is None for n in names):
        return None
    return names


def _level_sizes(data: dict, dim: int) -> set:
    """The lengths the tensors and nested containers of one level give batch dim ``dim``."""
    seen = set()
    for value in data.values():
        if isinstance(value, torch.Tensor):
            seen.add(leaf_shape(value)[dim])
        elif is_tensor_collection(value) and not isinstance(value, NonTensorData):
            seen.add(value._to_tensordict_view()._batch_size[dim])
    return seen


def resolve_ragged(size: torch.Size, data: dict) -> torch.Size:
    """``size`` with each ragged dim (-1) replaced by the length the leaves agree on.

    Indexing a nested tensor's outer dim gives a dense tensor, so a piece of a ragged
    container may be dense; a dim where a leaf is still ragged, or that no leaf
    constrains, stays -1.
    """
    out = list(size)
    for dim, length in enumerate(size):
        if length == -1:
            seen = _level_sizes(data, dim)
            if len(seen) == 1:
                out[dim] = seen.pop()
    return torch.Size(out)
