"""``state_dict`` / ``load_state_dict`` for TensorDict: dotted keys plus ``_metadata``.

Tensor leaves appear under their dotted key (``"a.b.c"``), like a module's
state dict. ``_metadata`` holds what is needed to rebuild the structure: the
batch size, device and names, the batch size of every nested TensorDict,
non-tensor values, and the key path of any key whose parts contain a dot.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from .nontensor import NonTensorData, NonTensorStack
from .registry import class_name, lookup_class

METADATA = "_metadata"


def _dotted(parts: tuple) -> str:
    return ".".join(parts)


def td_state_dict(td, destination=None, prefix: str = "", keep_vars: bool = False):
    """See ``TensorDict.state_dict``."""
    out = OrderedDict() if destination is None else destination
    non_tensor: dict[str, Any] = {}
    nested: dict[str, dict] = {}
    key_paths: dict[str, list[str]] = {}
    seen: dict[str, tuple] = {}
    order: list[str] = []
    for key, value in td._iter_items((), True, False):
        parts = (key,) if type(key) is str else key
        name = _dotted(parts)
        if name in seen or (not prefix and name == METADATA):
            raise ValueError(
                f"TensorDict.state_dict: keys {seen.get(name, parts)!r} and {parts!r} both map "
                f"to the state-dict key {name!r}; rename one of them."
            )
        seen[name] = parts
        order.append(name)
        if any("." in part for part in parts):
            key_paths[name] = list(parts)
        if getattr(type(value), "_is_tensor_collection", False):
            nested[name] = {"batch_size": list(value.batch_size), "class": class_name(type(value))}
        elif isinstance(value, NonTensorData):
            non_tensor[name] = {
                "data": value.tolist(),
                "stack": isinstance(value, NonTensorStack),
                "batch_size": list(value.batch_size),
            }
        elif isinstance(value, torch.Tensor):
            out[prefix + name] = value if keep_vars else value.detach()
    out[prefix + METADATA] = {
        "batch_size": list(td.batch_size),
        "device": None if td.device is None else str(td.device),
        "names": None if td._names is None else list(td._names),
        "nested": nested,
        "non_tensor": non_tensor,
        "key_paths": key_paths,
        "order": order,
    }
    return out


def td_load_state_dict(td, state_dict: Mapping, strict: bool, assign: bool):
    """See ``TensorDict.load_state_dict``; atomic (nothing is loaded when it fails)."""
    meta = state_dict.get(METADATA) or {}
    key_paths = meta.get("key_paths", {})

    def parts_of(name: str) -> tuple:
        return tuple(key_paths[name]) if name in key_paths else tuple(name.split("."))

    tensors = {parts_of(k): v for k, v in state_dict.items() if k != METADATA}
    expected = {
        (key,) if type(key) is str else key
        for key, value in td._iter_items((), True, True)
        if isinstance(value, torch.Tensor)
    }
    empty = not td._data
    if strict and not empty:
        missing = sorted(_dotted(p) for p in expected - set(tensors))
        unexpected = sorted(_dotted(p) for p in set(tensors) - expected)
        if missing or unexpected:
            raise RuntimeError(
                f"TensorDict.load_state_dict: missing keys {missing}, unexpected keys "
                f"{unexpected}. Pass strict=False to load the keys that match."
            )
    if empty:
        return _rebuild(td, tensors, meta)
    if not strict:
        tensors = {parts: value for parts, value in tensors.items() if parts in expected}
    items: list = list(tensors.items())
    for name, entry in meta.get("non_tensor", {}).items():
        parts = parts_of(name)
        if strict or parts in td:
            items.append((parts, _non_tensor(entry)))
    td._write(items, not assign, False, "load_state_dict")
    return td


def _non_tensor(entry: Any) -> Any:
    if not isinstance(entry, Mapping) or "data" not in entry:
        return entry  # a bare value
    if entry.get("stack"):
        return NonTensorStack(entry["data"], entry["batch_size"])
    return NonTensorData(entry["data"])


def _rebuild(td, tensors: dict, meta: Mapping):
    """Load into an empty TensorDict: take the recorded batch size and nested structure."""
    from .container import TensorDict

    key_paths = meta.get("key_paths", {})
    batch_size = torch.Size(meta.get("batch_size", list(td.batch_size)))
    device = td.device
    if meta.get("device") is not None and device is None:
        device = torch.device(meta["device"])
    staged = TensorDict({}, batch_size=batch_size, device=device)
    nested = meta.get("nested", {})
    non_tensor = meta.get("non_tensor", {})
    by_name = {_dotted(parts): (parts, value) for parts, value in tensors.items()}
    names = list(meta.get("order", [])) or [*nested, *by_name, *non_tensor]
    names += [name for name in by_name if name not in names]
    items: list = []
    for name in names:
        parts = tuple(key_paths[name]) if name in key_paths else tuple(name.split("."))
        if name in nested:
            items.append((parts, TensorDict({}, batch_size=nested[name]["batch_size"])))
        elif name in non_tensor:
            items.append((parts, _non_tensor(non_tensor[name])))
        elif name in by_name:
            items.append(by_name[name])
    staged._write(items, False, True, "load_state_dict")
    _restore_classes(staged, nested, key_paths)
    if td.is_locked:
        td._check_writable("load_state_dict", list(staged.keys()))
    td._batch_size = staged._batch_size
    td._device = staged._device
    td._data = staged._data
    dim_names = meta.get("names")
    if dim_names is not None and len(dim_names) == len(td._batch_size):
        td.names = dim_names
    return td


def _restore_classes(staged, nested: Mapping, key_paths: Mapping) -> None:
    """Turn nested TensorDicts back into their recorded classes (TensorClass), deepest first."""
    tensordict_name = class_name(type(staged))
    for name in sorted(nested, key=lambda n: -len(key_paths.get(n, n.split(".")))):
        recorded = nested[name].get("class", tensordict_name)
        if recorded == tensordict_name:
            continue
        cls: Any = lookup_class(recorded)  # only classes known to tdfunc, never an import
        parts = tuple(key_paths[name]) if name in key_paths else tuple(name.split("."))
        parent = staged._get_leaf(parts[:-1])._to_tensordict_view() if len(parts) > 1 else staged
        node = parent._data[parts[-1]]
        parent._data[parts[-1]] = cls._from_pytree(
            node._data, node._batch_size, node._device, node._names
        )
