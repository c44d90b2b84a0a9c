"""``state_dict`` / ``load_state_dict`` for TensorDict: dotted keys and ``_metadata``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import torch

from ._nontensor import NonTensorData


def td_state_dict(td, destination=None, prefix: str = "", keep_vars: bool = False):
    out = OrderedDict() if destination is None else destination
    non_tensor = {}
    for key in td.keys(True, True):
        name = key if type(key) is str else ".".join(key)
        value = td._get_leaf(key)
        if isinstance(value, NonTensorData):
            non_tensor[name] = value.data
        elif isinstance(value, torch.Tensor):
            out[prefix + name] = value if keep_vars else value.detach()
    out[prefix + "_metadata"] = {
        "batch_size": list(td.batch_size),
        "device": None if td.device is None else str(td.device),
        "non_tensor": non_tensor,
        "nested": {
            ".".join(k) if type(k) is tuple else k: list(td._get_leaf(k).batch_size)
            for k in td.keys(True)
            if hasattr(td._get_leaf(k), "_data")
        },
    }
    return out


def td_load_state_dict(td, state_dict: Mapping, strict: bool, assign: bool):
    meta = state_dict.get("_metadata", {})
    tensors = {k: v for k, v in state_dict.items() if k != "_metadata"}
    expected = {
        (k if type(k) is str else ".".join(k))
        for k in td.keys(True, True)
        if isinstance(td._get_leaf(k), torch.Tensor)
    }
    if strict:
        missing = sorted(expected - set(tensors))
        unexpected = sorted(set(tensors) - expected) if expected else []
        if missing or unexpected:
            raise RuntimeError(
                f"TensorDict.load_state_dict: missing keys {missing}, unexpected keys "
                f"{unexpected}. Pass strict=False to load what matches."
            )
    if not expected and tensors:
        # loading into an empty TensorDict: rebuild the structure
        for name, batch_size in meta.get("nested", {}).items():
            node = td
            for part in name.split("."):
                if part not in node._data:
                    node._data[part] = type(td)._new_unsafe({}, torch.Size(batch_size), td.device)
                node = node._data[part]
            node._batch_size = torch.Size(batch_size)
    for name, value in tensors.items():
        key = tuple(name.split(".")) if "." in name else name
        if key in td and not assign:
            td.set_(key, value)
        else:
            td.set(key, value)
    for name, value in meta.get("non_tensor", {}).items():
        td.set(tuple(name.split(".")) if "." in name else name, value)
    return td
