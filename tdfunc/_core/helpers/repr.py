"""Printing containers in the form tensordict's documentation shows, and reading it back
(``parse_tensor_dict_string``)."""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

import torch

from .hooks import HOOKS
from .nontensor import is_non_tensor
from .options import PRINT
from .sizes import leaf_shape


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
        if PRINT["plain"]:
            summary = _summary(value)
            if summary is not None:
                parts.append(summary)
        return f"{kind}({', '.join(parts)})"
    return repr(value)


def _summary(tensor: torch.Tensor) -> str | None:
    """``mean=..., std=...`` (floating, complex), ``min=..., max=...`` (integers, bools),
    ``[]`` when empty: the ``plain`` print option. ``None`` where the values cannot be
    read without changing anything (meta, fake or batched tensors, other layouts)."""
    if tensor.numel() == 0:
        return "[]"
    try:
        if tensor.is_meta or tensor.is_nested or tensor.layout != torch.strided:
            return None
        with torch.no_grad():
            if tensor.is_floating_point() or tensor.is_complex():
                # in double precision: a half or bfloat16 sum would round the summary
                wide = tensor.to(torch.complex128 if tensor.is_complex() else torch.float64)
                std = wide.std().item() if wide.numel() > 1 else float("nan")
                return f"mean={wide.mean().item():.4g}, std={std:.4g}"
            return f"min={tensor.min().item()}, max={tensor.max().item()}"
    except Exception:  # a tensor whose values are not there to read (fake, batched)
        return None


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
    order = PRINT["sort_keys"]
    if callable(order):
        items.sort(key=lambda item: order(item[0]))
    elif order == "alphabetical":
        items.sort(key=lambda item: item[0])
    # an empty block closes at the indent of ``fields={``, as tensordict prints it
    fields = "fields={\n" + (fields_block(items) if items else "") + "}"
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


# ---------------------------------------------------------------- reading a repr back
_CALL = re.compile(r"\s*([\w.]+)\((.*)\)\s*", re.S)
_SIZE = re.compile(r"torch\.Size\(\[([\d,\s]*)\]\)")
_CONTAINER_TAIL = ("batch_size", "device", "names", "is_shared")
_OPEN, _CLOSE = "([{", ")]}"


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside any brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def _size(text: str, where: str) -> torch.Size:
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"parse_tensor_dict_string: expected torch.Size([...]) at {where}, got {text!r}."
        )
    return torch.Size(int(n) for n in match.group(1).split(",") if n.strip())


def _device(text: str) -> torch.device | None:
    return None if text.strip() == "None" else torch.device(text.strip())


def _leaf(kind: str, attributes: dict, where: str) -> torch.Tensor:
    dtype = getattr(torch, attributes.get("dtype", "torch.float32").replace("torch.", ""), None)
    if "shape" not in attributes or not isinstance(dtype, torch.dtype):
        raise ValueError(
            f"parse_tensor_dict_string: the {kind} at {where} needs shape= and dtype=; print "
            f"with the default options (set_printoptions(verbose=True))."
        )
    device = _device(attributes.get("device", "cpu"))
    return torch.zeros(_size(attributes["shape"], where), dtype=dtype, device=device)


def _parse(text: str, path: tuple) -> Any:
    """The container or zero tensor that ``text`` (the value printed at ``path``) describes."""
    where = f"key {path[0] if len(path) == 1 else path!r}" if path else "the top level"
    match = _CALL.fullmatch(text)
    if match is None:
        raise ValueError(f"parse_tensor_dict_string: cannot read the value at {where}: {text!r}.")
    kind, inner = match.groups()
    attributes = {}
    for part in _split_top(inner):
        label, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"parse_tensor_dict_string: cannot read {part!r} at {where}.")
        attributes[label.strip()] = value.strip()
    if kind.endswith("Tensor") or kind in ("Parameter", "Buffer"):
        return _leaf(kind, attributes, where)
    if kind in ("NonTensorData", "NonTensorStack", "MetaData"):
        raise ValueError(
            f"parse_tensor_dict_string: the non-tensor value at {where} cannot be rebuilt from "
            f"its printed form; remove that entry from the text."
        )
    if "fields" in attributes:  # a TensorDict: fields={name: value, ...}
        body = attributes["fields"].strip()
        entries = [e.partition(": ") for e in _split_top(body[1:-1])]
    else:  # a TensorClass: name=value, ... before its batch size
        entries = [(k, "", v) for k, v in attributes.items() if k not in _CONTAINER_TAIL]
    data = {}
    for name, _, value in entries:
        if value.strip() == "None":
            continue  # an unset TensorClass field
        data[name.strip()] = _parse(value, (*path, name.strip()))
    batch_size = _size(attributes.get("batch_size", "torch.Size([])"), where)
    names = ast.literal_eval(attributes["names"]) if "names" in attributes else None
    plain = HOOKS.tensordict
    device = _device(attributes.get("device", "None"))
    return plain(data, batch_size=batch_size, device=device, names=names)


def parse_tensor_dict_string(text: str) -> Any:
    """A TensorDict rebuilt from its printed form, every tensor zero-filled.

    For debugging: it rebuilds the keys, nesting, batch sizes, devices and dtypes
    of a container printed in a log (a TensorClass comes back as a TensorDict of its
    fields). Non-tensor values cannot be rebuilt and are an error; the text must be
    printed with the default print options.

    Example:
        >>> labels = torch.ones(4, dtype=torch.int64)
        >>> td = TensorDict({"image": torch.ones(4, 3), "n": {"label": labels}}, [4])
        >>> again = parse_tensor_dict_string(str(td))
        >>> again["n", "label"].dtype, again["image"].shape, again.batch_size
        (torch.int64, torch.Size([4, 3]), torch.Size([4]))
    """
    if not isinstance(text, str):
        raise TypeError(
            f"parse_tensor_dict_string: expected the printed text (a str), got "
            f"{type(text).__name__}."
        )
    return _parse(text, ())
