"""Functions over non-tensor leaves: array views, writes at an index, stack, cat, pad."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .leaves import NonTensorData, NonTensorStack, as_array
from .values import (
    _check_nested,
    _copy_nested,
    _equal,
)


def eq_mask(leaf: NonTensorData, other: Any) -> torch.Tensor:
    """Element-wise ``leaf == other`` as a bool tensor of the batch shape."""
    size = leaf.batch_size
    if type(leaf) is NonTensorData and type(other) is not NonTensorStack:
        value = other.data if isinstance(other, NonTensorData) else other
        return torch.full(size, _equal(leaf.data, value), dtype=torch.bool)
    left = leaf._array()
    right = as_array(other, size)
    try:  # shapes broadcast as a tensor comparison's do
        shape = np.broadcast_shapes(left.shape, right.shape)
    except ValueError:
        raise ValueError(
            f"eq: cannot compare non-tensor values of batch size {list(left.shape)} with "
            f"{list(right.shape)}: the shapes do not broadcast."
        ) from None
    left, right = np.broadcast_to(left, shape), np.broadcast_to(right, shape)
    out = np.empty(shape, dtype=bool)
    for position in np.ndindex(*shape):
        out[position] = _equal(left[position], right[position])
    return torch.from_numpy(out)


def is_non_tensor(value: Any) -> bool:
    """True for a non-tensor leaf (``NonTensorData`` or ``NonTensorStack``).

    Example:
        >>> is_non_tensor(NonTensorData("a")), is_non_tensor(torch.zeros(()))
        (True, False)
    """
    return isinstance(value, NonTensorData)


def stack_of_list(value: list, batch_size: torch.Size, device) -> NonTensorStack | None:
    """A ``NonTensorStack`` for a list shaped like ``batch_size`` (tensordict's rule), or None."""
    try:
        _check_nested(value, tuple(batch_size))
    except ValueError:
        return None
    return NonTensorStack._make(_copy_nested(value), batch_size, device)
