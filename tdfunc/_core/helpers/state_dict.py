"""``state_dict`` / ``load_state_dict`` for TensorDict, in nn.Module's convention.

``td.state_dict()`` is an ``OrderedDict`` of tensor leaves under dotted keys
(``"a.b.c"``), like a module's; with ``flatten=False`` nested TensorDicts become
nested ``OrderedDict`` instances. What rebuilds the structure lives in the
``_metadata`` *attribute* of the result (never a key, so
``{k: v.to(dev) for k, v in sd.items()}`` is a plain dict of tensors), keyed by
level: ``""`` for the root, ``"n"`` for the nested TensorDict at ``"n"``. A
level records its batch size, device, names and class; the root also records
non-tensor values, the order of the keys and the key path of any key whose
parts contain a dot.

``load_state_dict`` reads that format, the nested one, a dict without
metadata (dotted keys are matched against the target's keys), and the legacy
formats: tdfunc 0.1's ``"_metadata"`` key, ``"__batch_size"`` / ``"__device"``
keys, and the tensorclass ``"_tensordict"`` / ``"_non_tensordict"`` wrappers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from .class_names import class_name, lookup_class
from .nontensor import NonTensorData, NonTensorStack

METADATA = "_metadata"
_LEGACY_KEYS = ("__batch_size", "__device")


def _dotted(parts: tuple) -> str:
    return ".".join(parts)


def _level_meta(value) -> dict:
    names = value._to_tensordict_view()._names
    return {
        "batch_size": list(value.batch_size),
        "device": None if value.device is None else str(value.device),
        "names": None if names is None else list(names),
        "class": class_name(type(value)),
    }


def _non_tensor_entry(value: NonTensorData) -> dict:
    return {
        "data": value._value(),
        "stack": isinstance(value, NonTensorStack),
        "batch_size": list(value.batch_size),
    }


def _metadata_of(out, api: str) -> dict:
    metadata = getattr(out, METADATA, None)
    if metadata is None:
        try:
            out._metadata = metadata = OrderedDict()
        except AttributeError:
            raise AttributeError(
                f"TensorDict.{api}: destination must accept a '_metadata' attribute (an "
                f"OrderedDict, as for nn.Module.state_dict); got a {type(out).__name__}."
            ) from None
    return metadata


def td_state_dict(
    td, destination=None, prefix: str = "", keep_vars: bool = False, flatten: bool = True
):
    """See ``TensorDict.state_dict``."""
    out = OrderedDict() if destination is None else destination
    if not flatten:
        return _nested_state_dict(td, out, prefix, keep_vars)
    metadata = _metadata_of(out, "state_dict")
    root_name = prefix[:-1] if prefix.endswith(".") else prefix
    non_tensor: dict[str, Any] = {}
    key_paths: dict[str, list[str]] = {}
    seen: dict[str, tuple] = {}
    order: list[str] = []
    levels: dict[str, dict] = {}
    for key, value in td._iter_items((), True, False):
        parts = (key,) if type(key) is str else key
        name = _dotted(parts)
        if name in seen:
            raise ValueError(
                f"TensorDict.state_dict: keys {seen[name]!r} and {parts!r} both map to the "
                f"state-dict key {name!r}; rename one of them, or use flatten=False."
            )
        seen[name] = parts
        order.append(name)
        if any("." in part for part in parts):
            key_paths[name] = list(parts)
        if getattr(type(value), "_is_tensor_collection", False):
            levels[name] = _level_meta(value)
        elif isinstance(value, NonTensorData):
            non_tensor[name] = _non_tensor_entry(value)
        elif isinstance(value, torch.Tensor):
            out[prefix + name] = value if keep_vars else value.detach()
    root = _level_meta(td)
    root.update(non_tensor=non_tensor, key_paths=key_paths, order=order)
    metadata[root_name] = root
    for name, level in levels.items():
        metadata[f"{root_name}.{name}" if root_name else name] = level
    # tensordict's readable view of the same metadata: per level, its class and its
    # non-tensor values by local key (loading reads tdfunc's fields above)
    root["_type"] = _type_repr(td)
    root["_non_tensor"] = {}
    for level in levels.values():
        level["_non_tensor"] = {}
    for name in non_tensor:
        parts = seen[name]
        level = root if len(parts) == 1 else levels.get(_dotted(parts[:-1]))
        if level is not None:
            level["_non_tensor"][parts[-1]] = non_tensor[name]["data"]
    for name, parts in seen.items():
        if name in levels:
            level_value = td._get_leaf(parts) if hasattr(td, "_get_leaf") else None
            if level_value is not None:
                levels[name]["_type"] = _type_repr(level_value)
    return out


def _type_repr(value: Any) -> str:
    cls = type(value)
    return f"<class '{cls.__module__}.{cls.__qualname__}'>"


def _nested_state_dict(td, out, prefix: str, keep_vars: bool):
    metadata = _metadata_of(out, "state_dict")
    non_tensor: dict[str, Any] = {}
    order: list[str] = []
    for key, value in td._data.items():
        order.append(key)
        if getattr(type(value), "_is_tensor_collection", False):
            out[prefix + key] = _nested_state_dict(
                value._to_tensordict_view(), OrderedDict(), "", keep_vars
            )
            out[prefix + key]._metadata[""]["class"] = class_name(type(value))
        elif isinstance(value, NonTensorData):
            non_tensor[key] = _non_tensor_entry(value)
        elif isinstance(value, torch.Tensor):
            out[prefix + key] = value if keep_vars else value.detach()
    root = _level_meta(td)
    root.update(non_tensor=non_tensor, order=order)
    metadata[prefix[:-1] if prefix.endswith(".") else prefix] = root
    return out


# ---------------------------------------------------------------------- reading
class _Parsed:
    """A state dict in any format, as key paths (tuples) to values and level metadata."""

    def __init__(self) -> None:
        self.tensors: dict[tuple, Any] = {}
        self.non_tensor: dict[tuple, Any] = {}
        self.levels: dict[tuple, dict] = {}
        self.order: list[tuple] = []


def _is_nested(state: Mapping) -> bool:
    return any(
        isinstance(v, Mapping) for k, v in state.items() if k != METADATA and k != "_non_tensordict"
    ) or any(k in state for k in ("_tensordict", *_LEGACY_KEYS))


def parse_state_dict(state: Mapping, target, from_flatten: bool | None = None) -> _Parsed:
    """Read ``state`` (any supported format) for loading into ``target``."""
    parsed = _Parsed()
    nested = _is_nested(state) if from_flatten is None else not from_flatten
    if nested:
        _parse_nested(state, (), parsed)
    else:
        _parse_flat(state, target, parsed)
    return parsed


def _parse_flat(state: Mapping, target, parsed: _Parsed) -> None:
    metadata = getattr(state, METADATA, None)
    if isinstance(metadata, Mapping) and "" in metadata:
        root = metadata[""]
        levels = {name: meta for name, meta in metadata.items() if name}
    else:
        root = state.get(METADATA) or {}  # tdfunc 0.1 wrote the metadata as a key
        levels = root.get("nested", {})
    key_paths = root.get("key_paths", {})
    known = {}
    if target is not None:
        for key in target._iter_keys((), True, False):
            parts = (key,) if type(key) is str else key
            known[_dotted(parts)] = parts

    def parts_of(name: str) -> tuple:
        if name in key_paths:
            return tuple(key_paths[name])
        return known.get(name) or tuple(name.split("."))

    for name, value in state.items():
        if name != METADATA:
            parsed.tensors[parts_of(name)] = value
    for name, entry in root.get("non_tensor", {}).items():
        parsed.non_tensor[parts_of(name)] = entry
    for name, meta in levels.items():
        parsed.levels[parts_of(name)] = meta
    if root:
        parsed.levels[()] = root
    parsed.order = [parts_of(name) for name in root.get("order", ())]


def _parse_nested(state: Mapping, path: tuple, parsed: _Parsed) -> None:
    if "_tensordict" in state:  # legacy tensorclass: tensors and non-tensors apart
        inner = state["_tensordict"]
        _parse_nested(inner, path, parsed)
        for key, value in (state.get("_non_tensordict") or {}).items():
            if isinstance(value, Mapping):
                _parse_nested(value, (*path, key), parsed)
            elif value is not None:
                parsed.non_tensor[(*path, key)] = value
        return
    metadata = getattr(state, METADATA, None)
    meta: dict = dict(metadata.get("", {})) if isinstance(metadata, Mapping) else {}
    if "__batch_size" in state:
        meta["batch_size"] = list(state["__batch_size"])
    if state.get("__device") is not None:
        meta["device"] = str(state["__device"])
    if meta or path:
        parsed.levels[path] = meta
    for key, entry in meta.get("non_tensor", {}).items():
        parsed.non_tensor[(*path, key)] = entry
    for key in meta.get("order", ()):
        parsed.order.append((*path, key))
    for key, value in state.items():
        if key in _LEGACY_KEYS or key == METADATA:
            continue
        if isinstance(value, Mapping):
            _parse_nested(value, (*path, key), parsed)
        else:
            parsed.tensors[(*path, key)] = value


def td_load_state_dict(td, state_dict: Mapping, strict: bool, assign: bool, from_flatten=None):
    """See ``TensorDict.load_state_dict``; atomic (nothing is loaded when it fails)."""
    parsed = parse_state_dict(state_dict, td if td._data else None, from_flatten)
    if not td._data:
        return _rebuild(td, parsed)
    tensors = parsed.tensors
    expected = {
        (key,) if type(key) is str else key
        for key, value in td._iter_items((), True, True)
        if isinstance(value, torch.Tensor)
    }
    if strict:
        missing = sorted(_dotted(p) for p in expected - set(tensors))
        unexpected = sorted(_dotted(p) for p in set(tensors) - expected)
        if missing or unexpected:
            raise RuntimeError(
                f"TensorDict.load_state_dict: missing keys {missing}, unexpected keys "
                f"{unexpected}. Pass strict=False to load the keys that match."
            )
    else:
        tensors = {parts: value for parts, value in tensors.items() if parts in expected}
    items: list = list(tensors.items())
    for parts, entry in parsed.non_tensor.items():
        if strict or parts in td:
            items.append((parts, _non_tensor(entry)))
    td._write(items, not assign, False, "load_state_dict")
    return td


def _non_tensor(entry: Any) -> Any:
    if not isinstance(entry, Mapping) or "data" not in entry:
        return entry  # a bare value (legacy tensorclass format)
    if entry.get("stack"):
        return NonTensorStack.from_list(entry["data"], batch_size=entry["batch_size"])
    return NonTensorData(entry["data"])


def _rebuild(td, parsed: _Parsed):
    """Load into an empty TensorDict: take the recorded batch sizes and nested structure."""
    plain = td._plain_tensordict()
    root = parsed.levels.get((), {})
    batch_size = torch.Size(root.get("batch_size", list(td.batch_size)))
    device = td.device
    if root.get("device") is not None and device is None:
        device = torch.device(root["device"])
    staged = plain({}, batch_size=batch_size, device=device)
    nested = {p: meta for p, meta in parsed.levels.items() if p}
    paths = list(parsed.order) + [*nested, *parsed.tensors, *parsed.non_tensor]
    items: list = []
    done: set = set()
    for parts in paths:
        if parts in done:
            continue
        done.add(parts)
        if parts in nested:
            size = nested[parts].get("batch_size")
            if size is None:  # legacy nested dict without a batch size: the parent's
                size = list(batch_size)
            items.append((parts, plain({}, batch_size=size)))
        elif parts in parsed.non_tensor:
            items.append((parts, _non_tensor(parsed.non_tensor[parts])))
        elif parts in parsed.tensors:
            items.append((parts, parsed.tensors[parts]))
    staged._write(items, False, True, "load_state_dict")
    _restore_levels(staged, nested)
    if td.is_locked:
        td._check_writable("load_state_dict", list(staged.keys()))
    td._batch_size = staged._batch_size
    td._device = staged._device
    td._data = staged._data
    dim_names = root.get("names")
    if dim_names is not None and len(dim_names) == len(td._batch_size):
        td.names = dim_names
    return td


def _restore_levels(staged, nested: Mapping) -> None:
    """Recorded names and classes (TensorClass) of nested levels, deepest first."""
    tensordict_name = class_name(type(staged))
    for parts in sorted(nested, key=lambda p: -len(p)):
        meta = nested[parts]
        parent = staged._get_leaf(parts[:-1])._to_tensordict_view() if len(parts) > 1 else staged
        node = parent._data[parts[-1]]
        names = meta.get("names")
        if names is not None and len(names) == len(node._batch_size):
            node.names = names
        recorded = meta.get("class", tensordict_name)
        if recorded == tensordict_name:
            continue
        cls: Any = lookup_class(recorded)  # only classes known to tdfunc, never an import
        parent._data[parts[-1]] = cls._from_pytree(
            node._data, node._batch_size, node._device, node._names
        )
