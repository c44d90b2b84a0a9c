"""Reading a saved directory back: validated metadata, size-checked mappings.

Loading never unpickles (non-tensor files are read with
``torch.load(weights_only=True)``) and only builds classes registered in
:mod:`tdfunc._core.helpers.class_names`. A data file is checked against the size its dtype and
shape need before it is mapped, so a truncated file is a ``ValueError`` and
never a ``SIGBUS``.

A concurrent save to the same directory commits a new ``meta.json`` (a new
file renamed into place) and then removes the files of the generation it
replaced. A load holds ``meta.json`` open while it maps the data files and
checks at the end that it is still the committed one: if not (or if a file is
gone), it starts over, so it returns one generation, whole. Symbolic links,
FIFOs and devices are refused wherever a file or directory is expected.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import torch

from .._core.helpers.class_names import lookup_class
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .._core.helpers.tracing import fake_mode as _fake_mode_active
from .confine import enter_directory
from .directory import worker_pool
from .files import check_file, nbytes_of
from .format import DTYPES, META, decode_object, open_meta, same_meta
from .leaf import LEAF_LOADERS
from .memmap_tensor import map_file, map_view
from .nested import nested_numel, nested_view
from .saved_paths import remember_path
from .write_back import bind

_ATTEMPTS = 5


class _Gone(Exception):
    """A data file listed in ``meta.json`` disappeared (a concurrent save replaced it)."""

    def __init__(self, error: FileNotFoundError) -> None:
        super().__init__(str(error))
        self.error = error


class _Planned:
    """A container whose tensor leaves are not mapped yet."""

    __slots__ = ("batch_size", "data", "directory", "klass", "names")

    def __init__(self, klass, data: dict, batch_size, names, directory: str) -> None:
        self.klass = klass
        self.data = data
        self.batch_size = batch_size
        self.names = names
        self.directory = directory


class _Load:
    def __init__(self, api: str, device, non_blocking: bool, meta_path: str) -> None:
        self.api = api
        self.device = None if device is None else torch.device(device)
        self.non_blocking = non_blocking
        self.meta_path = meta_path
        self.fake = _fake_mode_active()
        self.placeholder = self.fake or (self.device is not None and self.device.type == "meta")
        # (data dict, key, path, dtype, shape, (layout, sizes) of a nested tensor or None)
        self.tasks: list[tuple] = []
        self.packs: dict[str, list[tuple]] = {}  # file -> (data, key, dtype, shape, offset)
        self.result_device = self.device or torch.device("cpu")

    def plan(self, node: dict, directory: str, data: dict | None = None) -> _Planned:
        """The container described by ``node``, its tensor leaves listed in ``tasks``.

        ``data`` (given for the TensorDict of a TensorClass) receives the values.
        """
        try:
            klass = LEAF_LOADERS.get(node["class"]) or lookup_class(node["class"])
        except ValueError as error:
            raise ValueError(f"{self.api}: {self.meta_path}: {error}") from None
        if data is None:
            data = {}
        inner = node.get("tensordict")
        if inner is not None:  # a TensorClass (format 2): its tensors are in _tensordict/
            data.update(dict.fromkeys(node["keys"]))  # the fields' order, filled below
            self.plan(inner["meta"], self._subdirectory(directory, inner["dir"]), data)
        # the saved key order: tensors are mapped after the walk, so their slots are
        # taken now (a TensorClass's fields already hold theirs)
        for key in node["entries"]:
            data.setdefault(key, None)
        for key, entry in node["entries"].items():
            kind = entry["kind"]
            if kind == "tensor":
                dtype, shape = DTYPES[entry["dtype"]], torch.Size(entry["shape"])
                if self.placeholder:
                    device = "meta" if not self.fake else None
                    data[key] = torch.empty(shape, dtype=dtype, device=device)
                elif "offset" in entry:  # one of the small tensors sharing a file
                    path = os.path.join(directory, entry["file"])
                    self.packs.setdefault(path, []).append(
                        (data, key, dtype, shape, entry["offset"])
                    )
                else:
                    path = os.path.join(directory, entry["file"])
                    self.tasks.append((data, key, path, dtype, shape, None))
            elif kind == "nested":
                if self.placeholder:
                    raise NotImplementedError(
                        f"{self.api}: the nested tensor at key {key!r} cannot be loaded on the "
                        f"meta device or under fake tensors; load it on the CPU."
                    )
                dtype, sizes = DTYPES[entry["dtype"]], entry["sizes"]
                path = os.path.join(directory, entry["file"])
                shape = torch.Size([nested_numel(sizes)])
                self.tasks.append((data, key, path, dtype, shape, (entry["layout"], sizes)))
            elif kind == "collection":
                data[key] = self.plan(entry["meta"], self._subdirectory(directory, entry["dir"]))
            else:
                if "value" in entry:
                    value = entry["value"]
                else:
                    path = os.path.join(directory, entry["file"])
                    try:
                        value = decode_object(path, self.api)
                    except FileNotFoundError as error:
                        raise _Gone(error) from None
                kind_ = NonTensorStack if entry["stack"] else NonTensorData
                leaf = kind_._make(value, torch.Size(entry["batch_size"]), self.result_device)
                if self.device is None and not self.placeholder:
                    bind(
                        leaf, directory, key, node.get("generation")
                    )  # mapped, like the tensors: updates reach disk
                data[key] = leaf
        names = node["names"]
        names = None if names is None or all(n is None for n in names) else tuple(names)
        return _Planned(klass, data, torch.Size(node["batch_size"]), names, directory)

    def _subdirectory(self, directory: str, name: str) -> str:
        """``directory/name``, which must be a real directory (a link is never followed)."""
        if self.placeholder:
            return os.path.join(directory, name)
        try:
            return enter_directory(directory, name, self.api)
        except FileNotFoundError as error:
            raise _Gone(error) from None

    def map_one(self, task: tuple) -> None:
        data, key, path, dtype, shape, nested = task
        try:
            st = check_file(path, nbytes_of(shape, dtype), self.api)
        except FileNotFoundError as error:
            raise _Gone(error) from None
        tensor: torch.Tensor = map_file(path, dtype, shape, st)
        if nested is not None:
            tensor = nested_view(tensor, *nested)
        if self.device is not None and self.device.type != "cpu":
            tensor = tensor.to(self.device, non_blocking=self.non_blocking)
        data[key] = tensor

    def map_packs(self) -> None:
        """Map each shared file once; its tensors are views of that mapping."""
        for path, views in self.packs.items():
            spans = sorted((v[4], v[4] + nbytes_of(v[3], v[2]), v[1]) for v in views)
            for (_, stop, key), (start, _, other) in itertools.pairwise(spans):
                if start < stop:  # two entries would be one tensor: writes to one change both
                    raise ValueError(
                        f"{self.api}: {self.meta_path} is corrupt: the bytes of keys {key!r} "
                        f"and {other!r} overlap in {path}."
                    )
            end = max(stop for _, stop, _ in spans)
            try:
                st = check_file(path, end, self.api, exact=False)
            except FileNotFoundError as error:
                raise _Gone(error) from None
            base = map_file(path, torch.uint8, (end,), st)
            for data, key, dtype, shape, offset in views:
                tensor: torch.Tensor = map_view(base, offset, dtype, shape)
                if self.device is not None and self.device.type != "cpu":
                    tensor = tensor.to(self.device, non_blocking=self.non_blocking)
                data[key] = tensor

    def map_all(self, num_threads: int) -> None:
        self.map_packs()
        if num_threads <= 1 or len(self.tasks) < 2 * num_threads:
            for task in self.tasks:
                self.map_one(task)
            return
        chunk = -(-len(self.tasks) // num_threads)
        futures = [
            worker_pool(num_threads).submit(self._map_some, self.tasks[i : i + chunk])
            for i in range(0, len(self.tasks), chunk)
        ]
        for future in futures:
            future.result()

    def _map_some(self, tasks: list) -> None:
        for task in tasks:
            self.map_one(task)

    def build(self, planned: _Planned) -> Any:
        data = planned.data
        for key, value in data.items():
            if type(value) is _Planned:
                data[key] = self.build(value)
        out = planned.klass._from_pytree(
            data, planned.batch_size, self.result_device, planned.names
        )
        if not self.placeholder:
            remember_path(out, planned.directory)
            if isinstance(out, NonTensorData):  # a leaf saved on its own
                return out
            inner = out._to_tensordict_view()
            if inner is not out:
                remember_path(inner, planned.directory)
        return out


def load(prefix, *, api: str, device=None, non_blocking: bool = False, num_threads: int = 0):
    """The container saved in ``prefix``, with memory-mapped tensor leaves."""
    directory = os.path.abspath(os.fspath(prefix))
    meta_path = os.path.join(directory, META)
    for _ in range(_ATTEMPTS):
        node, fd = open_meta(directory, api)
        try:
            work = _Load(api, device, non_blocking, meta_path)
            try:
                planned = work.plan(node, directory)
                work.map_all(num_threads)
            except _Gone as gone:
                if same_meta(directory, fd):
                    raise FileNotFoundError(
                        f"{api}: {gone.error.filename} is listed in {meta_path} but missing: "
                        f"the saved data is incomplete (files were removed by hand?)."
                    ) from None
                continue  # a concurrent save committed a new generation: read it instead
            if not same_meta(directory, fd):
                continue  # replaced while the files were mapped: some may be newer
        finally:
            os.close(fd)
        return work.build(planned)
    raise RuntimeError(
        f"{api}: {directory} kept changing while it was read ({_ATTEMPTS} attempts): another "
        f"process is saving to it in a loop. Load it once that process has finished."
    )


def load_into(out: Any, loaded: Any) -> Any:
    """Move the content of ``loaded`` into ``out`` (same object, nested containers reused)."""
    target = out._to_tensordict_view()
    source = loaded._to_tensordict_view()
    old = target._data
    new: dict[str, Any] = {}
    for key, value in source._data.items():
        current = old.get(key)
        if (
            current is not None
            and getattr(type(value), "_is_tensor_collection", False)
            and type(current) is type(value)
        ):
            new[key] = load_into(current, value)
        else:
            new[key] = value
    old.clear()
    old.update(new)
    target._batch_size = source._batch_size
    target._names = source._names
    target._device = source._device
    return out
