"""Printing containers in the form the seed documents show."""

from __future__ import annotations

import textwrap
from typing import Any

import torch

from .nontensor import is_non_tensor
from .options import PRINT
from .shape.sizes import leaf_shape


def leaf_repr(value: Any) -> str:
    """``Tensor(shape=..., device=..., dtype=..., is_shared=...)`` for one leaf.

    What is shown follows :func:`~tdfunc.set_printoptions`; a ``Parameter`` prints
    as ``Parameter`` and a buffer as ``Tensor``.
    """
    if isinstance(value, torch.Tensor):
        kind = type(value).__name__
        if kind == "Buffer":
            kind = "Tensor"
        parts = [f"{label}={read(value)}" for option, label, read in _FIELDS if PRINT[option]]
        return f"{kind}({', '.join(parts)})"
    return repr(value)


def _storage_size(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # fake / functional tensors have no storage
        return None


def _is_shared(tensor: torch.Tensor) -> bool:
    try:
        return bool(tensor.is_shared()) and tensor.device.type == "cpu"
    except Exception:  # fake / functional tensors have no storage to ask
        return False


def is_shared(td) -> bool:
    values = [v for _, v in td._iter_items((), True, True)]  # non-tensor data included
    leaves = [v for v in values if isinstance(v, torch.Tensor)]
    if not leaves:  # only non-tensor data: shared when its share_memory_() marked it so
        marks = [getattr(v, "_is_shared", False) for v in values if is_non_tensor(v)]
        return bool(marks) and all(marks)
    return all(_is_shared(v) for v in leaves)


def fields_block(items: list[tuple[str, str]], separator: str = ": ") -> str:
    lines = ",\n".join(f"{name}{separator}{text}" for name, text in items)
    return textwrap.indent(lines, "    ")


def td_repr(td) -> str:
    items = [(k, leaf_repr(v)) for k, v in td._data.items()]
    if PRINT["sort_keys"] == "alphabetical":
        items.sort(key=lambda item: item[0])
    fields = "fields={\n" + fields_block(items) + "}"
    if not items:
        fields = "fields={\n    }"
    tail = [fields]
    if PRINT["show_batch_size"]:
        tail.append(f"batch_size={td.batch_size}")
    if PRINT["show_device"]:
        tail.append(f"device={td.device}")
    if td._names is not None:
        tail.append(f"names={list(td._names)}")
    if PRINT["show_is_shared"]:
        tail.append(f"is_shared={is_shared(td)}")
    body = textwrap.indent(",\n".join(tail), "    ")
    return f"{type(td).__name__}(\n{body})"


# (print option, label, how to read it): the order of a tensor's description
_FIELDS = (
    ("show_shape", "shape", leaf_shape),
    ("show_field_device", "device", lambda t: t.device),
    ("show_dtype", "dtype", lambda t: t.dtype),
    ("show_field_is_shared", "is_shared", _is_shared),
    ("show_grad", "requires_grad", lambda t: t.requires_grad),
    ("show_is_contiguous", "is_contiguous", lambda t: t.is_contiguous()),
    ("show_is_view", "is_view", lambda t: t._base is not None),
    ("show_storage_size", "storage_size", _storage_size),
)
