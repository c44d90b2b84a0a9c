"""Leaf-level helpers of the shape ops: splitting a leaf, and an in-place result taking
over a container while its nested containers keep their identity.

Example:
    >>> t = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    >>> [p.size(0) for p in split_leaf(t, [1, 1], 0)]
    [1, 1]
"""

from __future__ import annotations

from typing import Any

import torch


def split_leaf(value: Any, lengths: list, dim: int) -> tuple:
    """``value.split(lengths, dim)``; a nested tensor (which cannot be split along its
    outer dim) is regrouped from its components, keeping its layout."""
    if dim or not isinstance(value, torch.Tensor) or not value.is_nested:
        return value.split(lengths, dim)
    parts = value.unbind(0)
    out, start = [], 0
    for n in lengths:
        out.append(
            torch.nested.as_nested_tensor(list(parts[start : start + n]), layout=value.layout)
        )
        start += n
    return tuple(out)


def take_contents(self: Any, out: Any) -> None:
    """``self`` takes the contents of ``out``; nested TensorDicts keep their identity (a
    reference held to ``td["nested"]`` sees the in-place result too)."""
    data = out._data
    for key, new in data.items():
        old = self._data.get(key)
        if (
            old is not None
            and old is not new
            and getattr(type(old), "_is_tensordict", False)
            and type(new) is type(old)
        ):
            take_contents(old, new)
            data[key] = old
    self._data = data
    self._batch_size = out._batch_size
    self._names = out._names
