"""A tensor operand that fits the batch size meets leaves with more dims than the batch.

tensordict aligns such a tensor with the batch dims of every leaf (``td * w`` with ``w`` of
shape ``[4]`` and batch size ``[3, 4]`` multiplies ``leaf[i, j, ...]`` by ``w[j]``); torch
broadcasting, which tdfunc's leaf-by-leaf operations follow, aligns it with a leaf's last
dims. The two readings give different numbers whenever a leaf has dims beyond the batch
size, or one of them fails where the other runs; which one the user meant cannot be told
from the shapes. Code written for either library must not get the other's answer without
a word, so these operations refuse and say how to ask for each reading.

Example:
    >>> td = TensorDict(a=torch.ones(3, 4), b=torch.ones(3, 4, 4), batch_size=[3, 4])
    >>> td * torch.arange(4.0)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ValueError: TensorDict.__mul__: ...
    >>> w = torch.arange(4.0)
    >>> out = td.apply(lambda x: x * w.reshape(*w.shape, *[1] * (x.ndim - td.batch_dims)))
    >>> out["b"][0, 1].tolist(), out["a"][0].tolist()  # the batch dims' reading
    ([1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 3.0])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _fits_batch(shape: tuple, batch: torch.Size) -> bool:
    if len(shape) > len(batch):
        return False
    return all(s == 1 or s == b for s, b in zip(reversed(shape), reversed(batch)))


def _leaves_beyond(node: Any, depth: int, prefix: tuple = ()):
    """The first tensor leaf (key, shape) with more than ``depth`` dims, or None."""
    for key, value in node._data.items():
        if isinstance(value, torch.Tensor):
            if value.ndim > depth:
                return (*prefix, key), value.shape
        elif hasattr(value, "_to_tensordict_view"):
            found = _leaves_beyond(value._to_tensordict_view(), depth, (*prefix, key))
            if found is not None:
                return found
    return None


def check_batch_aligned_operand(self: Any, other: Any, api: str) -> None:
    """Refuse a tensor ``other`` whose shape fits ``self``'s batch size (and is not one
    element) when a tensor leaf has dims beyond the batch size."""
    if not isinstance(other, (torch.Tensor, np.ndarray)) or other.ndim == 0:
        return
    shape = tuple(other.shape)
    batch = self._batch_size
    if not batch or all(s == 1 for s in shape) or not _fits_batch(shape, batch):
        return
    view = self._to_tensordict_view() if hasattr(self, "_to_tensordict_view") else self
    found = _leaves_beyond(view, len(batch))
    if found is None:
        return
    key, leaf_shape = found
    extra = len(leaf_shape) - len(batch)
    name = key[0] if len(key) == 1 else key
    raise ValueError(
        f"{type(self).__name__}.{api}: the tensor operand of shape {list(shape)} fits the "
        f"batch size {list(batch)}, and the leaf {name!r} of shape {list(leaf_shape)} has "
        f"{extra} dim(s) beyond it. tensordict aligns such a tensor with the batch dims, "
        f"torch's broadcasting with the leaf's last dims: they give different numbers. Say "
        f"which: td.apply(lambda x: <op>(x, w.reshape(*w.shape, *[1] * (x.ndim - "
        f"td.batch_dims)))) for the batch dims, td.apply(lambda x: <op>(x, w)) for torch's."
    )
