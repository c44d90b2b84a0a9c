"""Non-tensor leaves: a Python object carried along a batch.

``NonTensorData`` holds one Python value for every element of its batch; shape
operations change its batch size and keep the value. Reading it from a
``TensorDict`` returns the value itself.
"""

from __future__ import annotations

from typing import Any

import torch

from ._shapes import index_batch_size, resolve_shape

_NOTHING = object()


class NonTensorData:
    """One Python value shared by every element of a batch.

    Example:
        >>> leaf = NonTensorData("a string!", batch_size=[3])
        >>> leaf[0].data
        'a string!'
    """

    __slots__ = ("batch_size", "data", "device")

    def __init__(self, data: Any, batch_size=(), device=None) -> None:
        self.data = data
        self.batch_size = torch.Size(batch_size)
        self.device = None if device is None else torch.device(device)

    @classmethod
    def _make(cls, data: Any, batch_size: torch.Size, device) -> NonTensorData:
        self = object.__new__(cls)
        self.data = data
        self.batch_size = batch_size
        self.device = device
        return self

    # Tensor-like surface used by the container's shape operations.
    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    def dim(self) -> int:
        return len(self.batch_size)

    ndim = property(dim)

    def _with(self, batch_size) -> NonTensorData:
        return NonTensorData._make(self.data, torch.Size(batch_size), self.device)

    def __getitem__(self, index) -> NonTensorData:
        return self._with(index_batch_size(self.batch_size, index))

    def reshape(self, *shape) -> NonTensorData:
        return self._with(resolve_shape(self.batch_size, shape))

    view = reshape

    def unsqueeze(self, dim: int) -> NonTensorData:
        size = list(self.batch_size)
        size.insert(dim if dim >= 0 else dim + len(size) + 1, 1)
        return self._with(size)

    def squeeze(self, dim=None) -> NonTensorData:
        size = list(self.batch_size)
        if dim is None:
            return self._with([s for s in size if s != 1])
        if size[dim] == 1:
            del size[dim]
        return self._with(size)

    def permute(self, *dims) -> NonTensorData:
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = tuple(dims[0])
        return self._with([self.batch_size[d] for d in dims])

    def transpose(self, dim0: int, dim1: int) -> NonTensorData:
        size = list(self.batch_size)
        size[dim0], size[dim1] = size[dim1], size[dim0]
        return self._with(size)

    def expand(self, *shape) -> NonTensorData:
        if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
            shape = tuple(shape[0])
        return self._with(shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> NonTensorData:
        shape = torch.empty(self.batch_size, device="meta").flatten(start_dim, end_dim).shape
        return self._with(shape)

    def unflatten(self, dim: int, sizes) -> NonTensorData:
        shape = torch.empty(self.batch_size, device="meta").unflatten(dim, sizes).shape
        return self._with(shape)

    def unbind(self, dim: int = 0) -> tuple[NonTensorData, ...]:
        size = list(self.batch_size)
        n = size.pop(dim)
        return tuple(self._with(size) for _ in range(n))

    def split(self, split_size, dim: int = 0) -> tuple[NonTensorData, ...]:
        pieces = torch.empty(self.batch_size, device="meta").split(split_size, dim)
        return tuple(self._with(p.shape) for p in pieces)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[NonTensorData, ...]:
        pieces = torch.empty(self.batch_size, device="meta").chunk(chunks, dim)
        return tuple(self._with(p.shape) for p in pieces)

    def to(self, *args, **kwargs) -> NonTensorData:
        device = kwargs.get("device", args[0] if args else None)
        if isinstance(device, (str, torch.device)):
            return NonTensorData._make(self.data, self.batch_size, torch.device(device))
        return self

    def clone(self, *args, **kwargs) -> NonTensorData:
        return self._with(self.batch_size)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NonTensorData):
            return self.data == other.data
        return self.data == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NonTensorData(data={self.data}, batch_size={self.batch_size}, device={self.device})"
        )


class NonTensorStack(NonTensorData):
    """Different Python values stacked along a batch dimension (a list of values)."""

    __slots__ = ()

    def __getitem__(self, index):
        if type(index) is int:
            return self.data[index]
        if type(index) is slice:
            return NonTensorStack._make(
                self.data[index], index_batch_size(self.batch_size, index), self.device
            )
        return NonTensorData.__getitem__(self, index)

    def unbind(self, dim: int = 0):
        if dim != 0:
            return NonTensorData.unbind(self, dim)
        size = self.batch_size[1:]
        return tuple(_as_leaf(item, size, self.device) for item in self.data)


def _as_leaf(item: Any, batch_size: torch.Size, device) -> NonTensorData:
    if isinstance(item, NonTensorData):
        return item
    return NonTensorData._make(item, batch_size, device)


def stack_non_tensor(leaves: list[NonTensorData], dim: int) -> NonTensorData:
    """Stack non-tensor leaves: equal values stay one value, others become a stack."""
    first = leaves[0]
    size = list(first.batch_size)
    size.insert(dim, len(leaves))
    if all(type(leaf) is NonTensorData for leaf in leaves):
        try:
            same = all(leaf.data == first.data for leaf in leaves[1:])
        except Exception:  # values whose == is not a bool (arrays, ...)
            same = False
        if same is True:
            return NonTensorData._make(first.data, torch.Size(size), first.device)
    if dim != 0:
        raise ValueError(
            "tdfunc: stacking different non-tensor values is only supported along dim 0."
        )
    return NonTensorStack._make(
        [leaf.data if type(leaf) is NonTensorData else leaf for leaf in leaves],
        torch.Size(size),
        first.device,
    )


def cat_non_tensor(leaves: list[NonTensorData], dim: int) -> NonTensorData:
    first = leaves[0]
    size = list(first.batch_size)
    size[dim] = sum(leaf.batch_size[dim] for leaf in leaves)
    if all(type(leaf) is NonTensorData and leaf.data == first.data for leaf in leaves):
        return NonTensorData._make(first.data, torch.Size(size), first.device)
    raise ValueError("tdfunc: cannot concatenate different non-tensor values.")
