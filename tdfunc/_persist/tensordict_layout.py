"""tensordict's memory-mapped layout: read it, and write it when asked.

tensordict (0.15) saves a TensorDict as a directory per container with a
``meta.json`` per level::

    {"a": {"device": "cpu", "shape": [2, 3], "dtype": "torch.float32", "is_nested": false},
     "b": {"type": "TensorDict"}, "note": {"type": "NonTensorData"},
     "shape": [2], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>",
     "_format_version": 1, "_class": "tensordict:TensorDict", "_names": [...]}

with the tensor ``a`` in ``a.memmap``, the nested container ``b`` in ``b/``, a
non-tensor value in ``note/meta.json`` (``{"data": ..., "_is_non_tensor": true}``;
a ``NonTensorStack`` holds the nested list in ``"data"``), and a tensorclass as
``pair/meta.json`` (``{"_type": "<class 'module.Pair'>"}``) plus its fields in
``pair/_tensordict/``.

Reading never unpickles and never imports: a tensorclass is rebuilt as the
TensorClass registered under the same ``module.QualName`` when tdfunc knows one,
otherwise as a ``TensorDict`` of its fields. Keys are checked so that none can
leave the directory, dtypes come from a fixed table, and every data file must hold
the bytes its shape needs. Non-tensor values that tensordict pickled (values JSON
cannot hold) are refused with an error that says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Any

import torch

from .._core.helpers.class_names import lookup_class
from .._core.helpers.hooks import HOOKS
from .._core.helpers.mixin import is_tensor_collection
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .format import DTYPES, MAX_META_BYTES, META, TENSORDICT_DIR, parse_json, read_regular
from .memmap_tensor import MemoryMappedTensor

_RESERVED = {"shape", "device", "_type", "_format_version", "_class", "_names", "_metadata"}
_CLASS = re.compile(r"<class '([A-Za-z_][\w.]*)'>")


def is_tensordict_layout(directory: str) -> bool:
    """True when ``directory/meta.json`` is tensordict's layout (not tdfunc's own)."""
    path = os.path.join(directory, META)
    try:
        node = parse_json(
            read_regular(path, "load_memmap", "metadata", MAX_META_BYTES), path, "load_memmap"
        )
    except (OSError, ValueError):
        return False  # the reader of tdfunc's own format gives the clear error
    return isinstance(node, dict) and "format" not in node and "_type" in node


def _read(directory: str, api: str) -> dict:
    path = os.path.join(directory, META)
    node = parse_json(read_regular(path, api, "metadata", MAX_META_BYTES), path, api)
    if not isinstance(node, dict):
        raise ValueError(f"{api}: {path} must hold a JSON object, got {type(node).__name__}.")
    return node


def _child(directory: str, key: Any, api: str) -> str:
    if (
        not isinstance(key, str)
        or not key
        or key in (".", "..")
        or "/" in key
        or "\\" in key
        or "\0" in key
    ):
        raise ValueError(
            f"{api}: the key {key!r} in {os.path.join(directory, META)} cannot name a file "
            "inside the directory; the checkpoint is corrupt or hostile."
        )
    return os.path.join(directory, key)


def _size(value: Any, where: str, api: str) -> torch.Size:
    if type(value) is not list or not all(type(s) is int and s >= 0 for s in value):
        raise ValueError(f"{api}: {where}: expected a list of sizes, got {value!r}.")
    return torch.Size(value)


def _device(value: Any, where: str, api: str) -> torch.device | None:
    if value is None:
        return None
    try:
        return torch.device(value)
    except (TypeError, RuntimeError):
        raise ValueError(f"{api}: {where}: {value!r} is not a device.") from None


def _dtype(value: Any, where: str, api: str) -> torch.dtype:
    name = value[len("torch.") :] if isinstance(value, str) and value.startswith("torch.") else None
    if name not in DTYPES:
        raise ValueError(f"{api}: {where}: unknown dtype {value!r}.")
    return DTYPES[name]


def _non_tensor(directory: str, batch_size: torch.Size, device, api: str) -> NonTensorData:
    node = _read(directory, api)
    where = os.path.join(directory, META)
    if "data" not in node:
        raise ValueError(
            f"{api}: {where} holds a non-tensor value tensordict saved with pickle; tdfunc "
            "never unpickles. Save values that JSON can hold, or convert the checkpoint with "
            "tensordict."
        )
    if "NonTensorStack" in str(node.get("_type", "")):
        if not isinstance(node["data"], list):  # "pickle.pkl": tensordict pickled the values
            raise ValueError(
                f"{api}: {where} names a pickled file for its non-tensor values; tdfunc never "
                "unpickles. Save values that JSON can hold, or convert the checkpoint with "
                "tensordict."
            )
        return NonTensorStack.from_list(node["data"], device, batch_size=batch_size)
    return NonTensorData._make(node["data"], batch_size, device)


_MAX_DEPTH = 100
_LEAF_TYPES = ("NonTensorData", "NonTensorStack")


def _leaf(directory: str, node: dict, device, api: str) -> NonTensorData:
    """A standalone leaf: its batch size is recorded by tdfunc, else read as tensordict does
    (a stack's from the nesting of its values, a ``NonTensorData``'s from ``_tensordict/``)."""
    where = os.path.join(directory, META)
    saved = node.get("batch_size")
    if saved is None and "NonTensorStack" not in node["_type"]:
        inner = os.path.join(directory, TENSORDICT_DIR)
        saved = _read(inner, api).get("shape", []) if os.path.isdir(inner) else []
    batch_size = None if saved is None else _size(saved, f"{where} 'batch_size'", api)
    place = torch.device(device) if device is not None else None
    place = place or _device(node.get("device"), f"{where} 'device'", api)
    if batch_size is None:  # tensordict's own stack: the nesting of the values
        if not isinstance(node.get("data"), list):
            _non_tensor(directory, torch.Size(), place, api)  # the error for a pickled one
        return NonTensorStack.from_list(node["data"], place)
    return _non_tensor(directory, batch_size, place, api)


def read_tensordict_layout(directory: str, api: str, device=None, depth: int = 0) -> Any:
    """The container saved in ``directory`` by tensordict (memory-mapped tensor leaves)."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{api}: {directory} is nested more than {_MAX_DEPTH} levels deep.")
    node = _read(directory, api)
    where = os.path.join(directory, META)
    kind = _CLASS.fullmatch(str(node.get("_type", "")))
    if kind is None:
        raise ValueError(f"{api}: {where}: '_type' {node.get('_type')!r} is not a class name.")
    name = kind.group(1)
    if name.rpartition(".")[2] in _LEAF_TYPES:  # a non-tensor leaf saved on its own
        return _leaf(directory, node, device, api)
    if "shape" not in node:  # a tensorclass: its fields are in _tensordict/
        fields = read_tensordict_layout(
            os.path.join(directory, TENSORDICT_DIR), api, device, depth + 1
        )
        try:
            cls = lookup_class(name)
        except ValueError:
            return fields  # unknown to tdfunc: its fields, as a TensorDict
        return cls._adopt(fields) if hasattr(cls, "_adopt") else fields
    batch_size = _size(node["shape"], f"{where} 'shape'", api)
    saved_device = _device(node.get("device"), f"{where} 'device'", api)
    target = torch.device(device) if device is not None else None
    data: dict = {}
    for key, entry in node.items():
        if key in _RESERVED:
            continue
        path = _child(directory, key, api)
        if not isinstance(entry, dict):
            raise ValueError(f"{api}: {where}: entry {key!r} must be an object.")
        if "dtype" in entry:
            if entry.get("is_nested"):
                raise ValueError(f"{api}: {where}: nested tensors at {key!r} are not supported.")
            shape = _size(entry.get("shape"), f"{where} {key!r} shape", api)
            tensor = MemoryMappedTensor.from_filename(
                path + ".memmap", _dtype(entry["dtype"], f"{where} {key!r}", api), shape
            )
            if shape[: len(batch_size)] != batch_size:
                raise ValueError(
                    f"{api}: {where}: {key!r} has shape {list(shape)}, which does not start "
                    f"with the batch size {list(batch_size)}."
                )
            data[key] = tensor if target is None else tensor.to(target)
        elif entry.get("type") in ("NonTensorData", "NonTensorStack"):
            data[key] = _non_tensor(path, batch_size, target or saved_device, api)
        elif "type" in entry:
            data[key] = read_tensordict_layout(path, api, device, depth + 1)
        else:
            raise ValueError(f"{api}: {where}: entry {key!r} is neither a tensor nor a node.")
    tensordict_class = HOOKS.tensordict
    out = tensordict_class._new_unsafe(data, batch_size, target or saved_device)
    names = node.get("_names")
    if names is not None and any(n is not None for n in names):
        out.names = names
    return out


# ---------------------------------------------------------------------- writing
def _type_of(value: Any) -> str:
    if getattr(type(value), "_is_tensordict", False):
        return "<class 'tensordict._td.TensorDict'>"
    return f"<class '{type(value).__module__}.{type(value).__qualname__}'>"


def _write_json(directory: str, node: dict) -> None:
    path = os.path.join(directory, META)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(node, f)
    os.replace(tmp, path)  # meta.json last and whole: a reader never sees half of it


def write_tensordict_layout(obj: Any, prefix: str, api: str) -> None:
    """Save ``obj`` in tensordict's layout (data files first, each ``meta.json`` last)."""
    directory = os.path.abspath(os.fspath(prefix))
    os.makedirs(directory, exist_ok=True)
    view = obj._to_tensordict_view()
    if view is not obj:  # a TensorClass: its class, then its fields in _tensordict/
        write_tensordict_layout(view, os.path.join(directory, TENSORDICT_DIR), api)
        _write_json(directory, {"_type": _type_of(obj)})
        return
    node: dict = {}
    for key, value in view._data.items():
        path = _child(directory, key, api)
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                raise TypeError(
                    f"{api}: the nested tensor at key {key!r} cannot be written in "
                    f"tensordict's layout; save with tdfunc's own format (the default), or "
                    f"pad it first (t.to_padded_tensor(0.0))."
                )
            MemoryMappedTensor.from_tensor(
                value.detach().cpu(), filename=path + ".memmap", existsok=True
            )
            node[key] = {
                "device": str(value.device),
                "shape": list(value.shape),
                "dtype": str(value.dtype),
                "is_nested": False,
            }
        elif isinstance(value, NonTensorData):
            os.makedirs(path, exist_ok=True)
            _write_json(path, _leaf_node(value, key, api))
            node[key] = {"type": _leaf_kind(value)}
        elif is_tensor_collection(value):
            write_tensordict_layout(value, path, api)
            node[key] = {"type": type(value).__name__}
        else:
            raise TypeError(f"{api}: cannot save the {type(value).__name__} at key {key!r}.")
    node["shape"] = list(view._batch_size)
    # tensordict needs a device here; memory-mapped leaves live on the CPU
    node["device"] = "cpu" if view._device is None else str(view._device)
    node["_type"] = _type_of(view)
    node["_format_version"] = 1
    node["_class"] = "tensordict:TensorDict"
    if view._names is not None:
        node["_names"] = list(view._names)
    _write_json(directory, node)


def _check_json(value: Any, key: str, api: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"{api}: the non-tensor value at key {key!r} ({type(value).__name__}) cannot be "
            "written as JSON; tensordict's layout would need pickle, which tdfunc does not write."
        ) from None


def _leaf_kind(leaf: NonTensorData) -> str:
    return "NonTensorStack" if type(leaf) is NonTensorStack else "NonTensorData"


def _leaf_node(leaf: NonTensorData, key: Any, api: str) -> dict:
    _check_json(leaf._value(), key, api)
    kind = _leaf_kind(leaf)
    node = {"_type": f"<class 'tensordict.tensorclass.{kind}'>"}
    if kind == "NonTensorStack":
        device = None if leaf.device is None else str(leaf.device)
        node.update({"stack_dim": 0, "device": device, "data": leaf._value()})
    else:
        node.update({"data": leaf._value(), "_is_non_tensor": True})
    return node


def write_leaf_layout(leaf: NonTensorData, directory: str, api: str) -> None:
    """Save one leaf on its own in tensordict's layout.

    A stack also records its batch size (tensordict ignores the field): the nesting
    of its values alone cannot tell a stack of lists from a deeper stack. A
    ``NonTensorData`` keeps its batch size in ``_tensordict/``, where tensordict
    reads it.
    """
    os.makedirs(directory, exist_ok=True)
    node = _leaf_node(leaf, "data", api)
    if type(leaf) is NonTensorStack:
        node["batch_size"] = list(leaf.batch_size)
    else:
        empty = HOOKS.tensordict._new_unsafe({}, leaf.batch_size, None, None)
        write_tensordict_layout(empty, os.path.join(directory, TENSORDICT_DIR), api)
    _write_json(directory, node)
    # tensordict's file for values JSON could not hold: stale once the values are JSON
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, "pickle.pkl"))
