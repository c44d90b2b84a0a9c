"""Reading tensordict's memory-mapped layout.

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
``pair/_tensordict/``. File and directory names are the keys with the characters
``/<>:"|?*\\``, space, ``%`` and control characters written as ``%XX``
(:func:`~tdfunc._persist.filenames.tensordict_name`); older versions used the key
itself, which is read when the encoded name is absent.

Reading never unpickles and never imports: a tensorclass is rebuilt as the
TensorClass registered under the same ``module.QualName`` when tdfunc knows one,
otherwise as a ``TensorDict`` of its fields. Every name goes through
:mod:`tdfunc._persist.confine` (no link followed, no name leaving the directory),
dtypes come from a fixed table, shapes must fit in memory sizes and the data file
must hold the bytes they need, and a nested level's batch size starts with its
parent's. The leaves are mapped on the CPU and the container says so (a recorded
device is checked, not followed: the same answer as a load of tdfunc's layout). Non-tensor values
that tensordict pickled (values JSON cannot hold) are refused with an error that
says so. A non-tensor leaf is bound to its ``meta.json``: an in-place write to it
reaches the file, as a write to a tensor leaf reaches its data file.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import torch

from .._core.helpers.class_names import lookup_class
from .._core.helpers.hooks import HOOKS
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .confine import check_component, check_data_file, enter_directory
from .filenames import tensordict_legacy_name, tensordict_name
from .files import nbytes_of
from .format import (
    DTYPES,
    FORMAT,
    MAX_META_BYTES,
    META,
    TENSORDICT_DIR,
    open_regular,
    parse_json,
    read_fd,
)
from .memmap_tensor import map_file
from .tensordict_write import RESERVED, rewrite_leaf

_CLASS = re.compile(r"<class '([A-Za-z_][\w.]*)'>")
_MAX_DEPTH = 100
_LEAF_TYPES = ("NonTensorData", "NonTensorStack")
_INT64 = 1 << 63
_CPU = torch.device("cpu")


def is_tensordict_layout(directory: str) -> bool:
    """True when ``directory/meta.json`` is tensordict's layout (not tdfunc's own).

    tdfunc's layout is told by its ``"format"`` marker (a string); a tensordict
    checkpoint may hold a key named ``format``, whose entry is an object.
    """
    path = os.path.join(directory, META)
    try:
        node = _parse(path, "load_memmap")
    except (OSError, ValueError):
        return False  # the reader of tdfunc's own format gives the clear error
    return (
        isinstance(node, dict)
        and node.get("format") != FORMAT
        and isinstance(node.get("_type"), str)
    )


def _parse(path: str, api: str) -> Any:
    fd, st = open_regular(path, api, "metadata")
    try:
        return parse_json(read_fd(fd, st, path, api, "metadata", MAX_META_BYTES), path, api)
    finally:
        os.close(fd)


def _stamp(path: str) -> list:
    st = os.lstat(path)
    return [(st.st_ino, st.st_mtime_ns, st.st_size)]


class _Read:
    def __init__(self, api: str, device) -> None:
        self.api = api
        self.device = None if device is None else torch.device(device)

    def meta(self, directory: str) -> dict:
        path = os.path.join(directory, META)
        node = _parse(path, self.api)
        if not isinstance(node, dict):
            raise ValueError(
                f"{self.api}: {path} must hold a JSON object, got {type(node).__name__}."
            )
        return node

    def bad(self, directory: str, key: Any, message: str) -> ValueError:
        where = os.path.join(directory, META)
        at = "" if key is None else f" at key {key!r}"
        return ValueError(f"{self.api}: {where} is corrupt{at}: {message}.")

    def size(self, value: Any, directory: str, key: Any, what: str) -> torch.Size:
        if type(value) is not list or not all(type(s) is int and s >= 0 for s in value):
            raise self.bad(directory, key, f"{what} {value!r} is not a list of sizes")
        total = 1
        for s in value:
            total *= s or 1
        if total >= _INT64:
            raise self.bad(
                directory, key, f"{what} {value!r} has more elements than a tensor can hold"
            )
        return torch.Size(value)

    def place(self, value: Any, directory: str) -> torch.device | None:
        if value is None or value == "None":
            return None
        try:
            return torch.device(value)
        except (TypeError, RuntimeError):
            raise self.bad(directory, "device", f"{value!r} is not a device") from None

    def name(self, directory: str, key: str, suffix: str, used: dict | None = None) -> str:
        """The file or directory of ``key``: tensordict's encoded name, else an older
        version's plain one. ``used`` (name -> key) refuses two keys of one level
        reaching the same file (an old plain name can equal another key's encoded one):
        their tensors would be one."""
        name = check_component(tensordict_name(key) + suffix, self.api, directory)
        if not os.path.lexists(os.path.join(directory, name)):
            legacy = tensordict_legacy_name(key)
            if legacy is not None and os.path.lexists(os.path.join(directory, legacy + suffix)):
                name = legacy + suffix
        if used is not None:
            if name in used:
                raise self.bad(
                    directory, key, f"it names the file {name!r} of key {used[name]!r} too"
                )
            used[name] = key
        return name

    # ------------------------------------------------------------------ levels
    def read(self, directory: str, parent: torch.Size | None = None, depth: int = 0) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError(
                f"{self.api}: {directory} is nested more than {_MAX_DEPTH} levels deep."
            )
        node = self.meta(directory)
        kind = _CLASS.fullmatch(str(node.get("_type", "")))
        if kind is None:
            raise self.bad(directory, "_type", f"{node.get('_type')!r} is not a class name")
        name = kind.group(1)
        if name.rpartition(".")[2] in _LEAF_TYPES:
            if parent is not None:  # inside a container: the container's batch size
                return self.leaf(directory, parent, self.device or _CPU)
            return self.standalone_leaf(directory, node, depth)  # saved on its own
        if "shape" not in node:  # a tensorclass: its fields are in _tensordict/
            inner = enter_directory(directory, TENSORDICT_DIR, self.api)
            fields = self.read(inner, parent, depth + 1)
            try:
                cls = lookup_class(name)
            except ValueError:
                return fields  # unknown to tdfunc: its fields, as a TensorDict
            return cls._adopt(fields) if hasattr(cls, "_adopt") else fields
        batch_size = self.size(node["shape"], directory, "shape", "the batch size")
        if parent is not None and batch_size[: len(parent)] != parent:
            raise self.bad(
                directory,
                "shape",
                f"the batch size {list(batch_size)} does not start with the batch size "
                f"{list(parent)} of the level that holds it",
            )
        # checked, then set aside: the leaves are mapped on the CPU, so the container is
        # there unless a device is asked for (as a load of tdfunc's own layout)
        self.place(node.get("device"), directory)
        target = self.device
        data: dict = {}
        used: dict = {}
        for key, entry in node.items():
            if key in RESERVED:
                continue
            if not isinstance(entry, dict):
                if key.startswith("_"):  # metadata a later tensordict may add
                    continue
                raise self.bad(directory, key, "the entry must be a JSON object")
            if "dtype" in entry:
                data[key] = self.tensor(directory, key, entry, batch_size, target, used)
            elif entry.get("type") in _LEAF_TYPES:
                path = enter_directory(directory, self.name(directory, key, "", used), self.api)
                data[key] = self.leaf(path, batch_size, target or _CPU)
            elif "type" in entry:
                path = enter_directory(directory, self.name(directory, key, "", used), self.api)
                data[key] = self.read(path, batch_size, depth + 1)
            else:
                raise self.bad(directory, key, "the entry is neither a tensor nor a node")
        out = HOOKS.tensordict._new_unsafe(data, batch_size, target or _CPU)
        names = node.get("_names")
        if names is not None:
            if (
                type(names) is not list
                or len(names) != len(batch_size)
                or not all(n is None or type(n) is str for n in names)
            ):
                raise self.bad(
                    directory, "_names", f"{names!r} is not a list of {len(batch_size)} names"
                )
            if any(n is not None for n in names):
                out.names = names
        return out

    def tensor(
        self, directory: str, key: str, entry: dict, batch_size, target, used: dict
    ) -> torch.Tensor:
        if entry.get("is_nested"):
            raise ValueError(
                f"{self.api}: {os.path.join(directory, META)}: the nested tensor at key {key!r} "
                f"is not supported in tensordict's layout."
            )
        dtype_text = entry["dtype"]
        name = dtype_text[len("torch.") :] if isinstance(dtype_text, str) else None
        if name not in DTYPES:
            raise self.bad(directory, key, f"unknown dtype {dtype_text!r}")
        dtype = DTYPES[name]
        shape = self.size(entry.get("shape"), directory, key, "the shape")
        if shape[: len(batch_size)] != batch_size:
            raise self.bad(
                directory,
                key,
                f"the shape {list(shape)} does not start with the batch size {list(batch_size)}",
            )
        path = os.path.join(directory, self.name(directory, key, ".memmap", used))
        nbytes = nbytes_of(shape, dtype)
        try:
            st = check_data_file(path, self.api)
        except FileNotFoundError:
            if nbytes:
                raise FileNotFoundError(
                    f"{self.api}: the data file {path} of key {key!r} is missing: the "
                    f"checkpoint is incomplete."
                ) from None
            tensor = torch.empty(shape, dtype=dtype)  # tensordict writes no file for these
        else:
            if st.st_size < nbytes:
                raise ValueError(
                    f"{self.api}: the data file {path} of key {key!r} holds {st.st_size} bytes, "
                    f"but its shape {list(shape)} and dtype {dtype} need {nbytes}: the file is "
                    f"truncated or the metadata is corrupt."
                )
            tensor = map_file(path, dtype, shape, st)
        return tensor if target is None else self.move(tensor, target, directory, key)

    def move(self, tensor: torch.Tensor, target, directory: str, key: Any) -> torch.Tensor:
        try:
            return tensor.to(target)
        except (RuntimeError, AssertionError) as error:
            raise ValueError(
                f"{self.api}: cannot move key {key!r} of {os.path.join(directory, META)} to "
                f"device={str(target)!r}: {str(error).splitlines()[0]}"
            ) from None

    # ------------------------------------------------------------------ non-tensor leaves
    def leaf(self, directory: str, batch_size: torch.Size, device) -> NonTensorData:
        node = self.meta(directory)
        where = os.path.join(directory, META)
        if "data" not in node:
            raise ValueError(
                f"{self.api}: {where} holds a non-tensor value tensordict saved with pickle; "
                f"tdfunc never unpickles. Save values that JSON can hold, or convert the "
                f"checkpoint with tensordict."
            )
        if "NonTensorStack" in str(node.get("_type", "")):
            if not isinstance(node["data"], list):  # "pickle.pkl": tensordict pickled them
                raise ValueError(
                    f"{self.api}: {where} names a pickled file for its non-tensor values; "
                    f"tdfunc never unpickles. Save values that JSON can hold, or convert the "
                    f"checkpoint with tensordict."
                )
            out = NonTensorStack.from_list(node["data"], device, batch_size=batch_size)
        else:
            out = NonTensorData._make(node["data"], batch_size, device)
        self.bind(out, directory)
        return out

    def bind(self, leaf: NonTensorData, directory: str) -> None:
        """In-place writes to ``leaf`` reach its ``meta.json`` (unless moved off the CPU)."""
        if self.device is not None and self.device.type != "cpu":
            return
        stamp = _stamp(os.path.join(directory, META))
        leaf._is_memmap = True
        leaf._write_back = functools.partial(
            rewrite_leaf, directory, stamp, f"{type(leaf).__name__}.update_"
        )

    def standalone_leaf(self, directory: str, node: dict, depth: int) -> NonTensorData:
        """Its batch size is recorded by tdfunc, else read as tensordict does (a stack's
        from the nesting of its values, a ``NonTensorData``'s from ``_tensordict/``)."""
        saved = node.get("batch_size")
        if saved is None and "NonTensorStack" not in node["_type"]:
            try:
                inner = enter_directory(directory, TENSORDICT_DIR, self.api)
            except FileNotFoundError:
                saved = []
            else:
                saved = self.meta(inner).get("shape", [])
        self.place(node.get("device"), directory)
        place = self.device or _CPU
        if saved is None:  # tensordict's own stack: the nesting of the values
            if not isinstance(node.get("data"), list):
                return self.leaf(directory, torch.Size(), place)  # the error for a pickled one
            out = NonTensorStack.from_list(node["data"], place)
            self.bind(out, directory)
            return out
        return self.leaf(directory, self.size(saved, directory, "batch_size", "batch"), place)


def read_tensordict_layout(directory: str, api: str, device=None) -> Any:
    """The container (or leaf) saved in ``directory`` in tensordict's layout."""
    return _Read(api, device).read(directory)


def child_directory(directory: str, key: str, api: str) -> str | None:
    """The directory of the nested container ``key`` of the level in ``directory``
    (``None`` when the level holds no container under that key)."""
    reader = _Read(api, None)
    entry = reader.meta(directory).get(key)
    if key in RESERVED or type(entry) is not dict or "type" not in entry:
        return None
    if entry["type"] in _LEAF_TYPES:
        return None
    try:
        return enter_directory(directory, reader.name(directory, key, ""), api)
    except FileNotFoundError:
        return None


def nested_container_keys(directory: str, api: str) -> list[str]:
    node = _Read(api, None).meta(directory)
    return sorted(
        k
        for k, e in node.items()
        if k not in RESERVED and type(e) is dict and e.get("type") not in (None, *_LEAF_TYPES)
    )
