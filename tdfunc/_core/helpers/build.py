"""Containers built from nested Python structures: shared by constructors and interop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .nontensor import NonTensorStack

_Tensor = torch.Tensor


def _build(cls: Any, data: dict, batch_size: Any, device: Any, auto: bool, batch_dims: Any):
    """A ``cls`` (TensorDict or a TensorClass) from a nested dict of values."""
    if batch_size is not None and batch_dims is not None:
        raise ValueError(
            f"{getattr(cls, '__name__', 'TensorDict')}: cannot pass both batch_size and "
            f"batch_dims; batch_dims infers a batch size of that many dims."
        )
    plain = cls._plain_tensordict()
    values = None
    if not getattr(cls, "_is_tensordict", False):
        # a TensorClass: a field's Python value (a number, a string, None) is cast by the
        # class's rules, as its constructor casts it (nocast keeps a number a number),
        # once the batch size is known; tensors and nested dicts build the TensorDict
        fields = cls._tc_field_names
        values = {
            k: v
            for k, v in data.items()
            if k in fields and not isinstance(v, (_Tensor, Mapping, np.ndarray))
        }
        data = {k: v for k, v in data.items() if k not in values}
    td = plain(data, batch_size=[] if batch_size is None else batch_size, device=device)
    infer = batch_size is None and (auto or batch_dims is not None)
    if values is None:
        if infer:
            td.auto_batch_size_(batch_dims)
        return td
    # a TensorClass: built as its constructor builds it, then the batch size inferred
    # (a number the default rules make a 0-d tensor keeps the batch size [])
    out = cls.from_tensordict(td, values)
    if infer:
        out.auto_batch_size_(batch_dims)
    return out


def _per_element(obj: np.ndarray, depth: int) -> Any:
    """Nested lists ``depth`` deep whose items are the trailing sub-arrays as lists."""
    if depth == 0:
        return obj.tolist()
    return [_per_element(sub, depth - 1) for sub in obj]


def struct_leaf(obj: np.ndarray, batch_ndim: int | None = None) -> Any:
    """An array (or one field of a structured array) as a container value: numbers share
    its memory, strings and objects become Python values, nested dtypes dicts.

    The first ``batch_ndim`` dims (all by default) are batch dims. A string field with a
    sub-array shape (``("name", "U5", (2,))``) has more: each element's value is then
    its sub-array as a (nested) list, not one string per trailing position.
    """
    ndim = obj.ndim if batch_ndim is None else batch_ndim
    if obj.dtype.names:
        return {name: struct_leaf(obj[name], ndim) for name in obj.dtype.names}
    if obj.dtype.kind in "USO":  # strings and objects: Python values, one per element
        if ndim == 0:
            return obj.item() if obj.ndim == 0 else obj.tolist()
        return NonTensorStack(_per_element(obj, ndim), batch_size=obj.shape[:ndim])
    try:  # a field of a structured array is a strided view: keep sharing its memory
        return torch.from_numpy(obj)
    except (TypeError, ValueError, RuntimeError):
        return torch.from_numpy(np.ascontiguousarray(obj))
