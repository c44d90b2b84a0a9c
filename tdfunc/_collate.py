"""``torch.utils.data`` support: ``DataLoader`` batches containers with its default collate.

``default_collate`` looks the type of a sample up in
``torch.utils.data._utils.collate.default_collate_fn_map`` (its documented way to
extend collation) before treating it as a mapping; registering the container bases
there once, at import, makes a batch of samples one stacked container. The dataset
side is ``__getitems__`` (a batch of indices read as one indexing), so a
``DataLoader`` over a TensorDict reads each batch with a single ``td[indices]``.

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"x": torch.arange(6.0)}, [6])
    >>> [batch["x"].tolist() for batch in DataLoader(td, batch_size=4)]
    [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from ._assembly import TensorClass, TensorDict
from ._core.helpers.mixin import is_tensor_collection


def collate_containers(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """Stack a list of containers into one; a container (already a batch) is returned as is."""
    if is_tensor_collection(batch):  # __getitems__ gave the batch already
        return batch
    return torch.stack(list(batch), 0)


for _cls in (TensorDict, TensorClass):
    default_collate_fn_map.setdefault(_cls, collate_containers)
