"""Printing containers in the form the seed documents show."""

from __future__ import annotations

import textwrap
from typing import Any

import torch

from .nontensor import NonTensorData


def leaf_repr(value: Any) -> str:
    """``Tensor(shape=..., device=..., dtype=..., is_shared=...)`` for one leaf."""
    if isinstance(value, torch.Tensor):
        kind = type(value).__name__
        if kind in ("Parameter", "Buffer"):
            kind = "Tensor"
        shared = _is_shared(value)
        return (
            f"{kind}(shape={value.shape}, device={value.device}, dtype={value.dtype}, "
            f"is_shared={shared})"
        )
    if isinstance(value, NonTensorData):
        return repr(value)
    return repr(value)


def _is_shared(tensor: torch.Tensor) -> bool:
    try:
        return bool(tensor.is_shared()) and tensor.device.type == "cpu"
    except Exception:  # fake / functional tensors have no storage to ask
        return False


def is_shared(td) -> bool:
    leaves = [v for v in td.values(True, True) if isinstance(v, torch.Tensor)]
    return bool(leaves) and all(_is_shared(v) for v in leaves)


def fields_block(items: list[tuple[str, str]], separator: str = ": ") -> str:
    lines = ",\n".join(f"{name}{separator}{text}" for name, text in items)
    return textwrap.indent(lines, "    ")


def td_repr(td) -> str:
    items = sorted(((k, leaf_repr(v)) for k, v in td._data.items()), key=lambda item: item[0])
    fields = "fields={\n" + fields_block(items) + "}"
    if not items:
        fields = "fields={\n    }"
    tail = [fields, f"batch_size={td.batch_size}", f"device={td.device}"]
    if td._names is not None:
        tail.append(f"names={list(td._names)}")
    tail.append(f"is_shared={is_shared(td)}")
    body = textwrap.indent(",\n".join(tail), "    ")
    return f"{type(td).__name__}(\n{body})"
