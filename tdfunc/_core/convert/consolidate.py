"""``consolidate``: every tensor leaf copied into one storage, as views of it.

A consolidated container moves to another device, pickles and is sent in one
block. It is locked: its leaves can be written in place, entries cannot be added or
removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import struct
import threading
from concurrent.futures import Future
from typing import Any

import torch

from ..helpers.class_names import class_name, lookup_class
from ..helpers.hooks import HOOKS
from ..helpers.leafwise import leaf_items, map_leaves, tensor_leaves
from ..helpers.mixin import ContainerMixin
from ..helpers.mixin import is_tensor_collection as _collection
from ..helpers.nontensor import NonTensorData, NonTensorStack
from ..helpers.nontensor.values import is_json_exact

_ALIGN = 16


def _parts(leaf: torch.Tensor) -> list[torch.Tensor]:
    """The dense tensors a leaf is stored as: itself, or a jagged tensor's buffers.

    A jagged nested tensor is its ``values()`` and ``offsets()`` (and ``lengths()``
    when it has holes); it is rebuilt over their views by ``_jagged``.
    """
    if not leaf.is_nested:
        return [leaf]
    if leaf.layout is not torch.jagged:
        raise TypeError(
            "consolidate: only jagged nested tensors (layout=torch.jagged) can be packed into "
            "one storage; convert a strided nested tensor first "
            "(torch.nested.nested_tensor(list(t.unbind()), layout=torch.jagged))."
        )
    parts = [leaf.values(), leaf.offsets()]
    if leaf.lengths() is not None:
        parts.append(leaf.lengths())
    return parts


def _check_layouts(container: Any, device: Any) -> None:
    """Refuse a leaf whose elements are not one dense block (sparse...), and leaves on
    several devices without ``device`` (one storage lies on one device: packing them
    there would move some leaves silently)."""
    first = None
    for path, leaf in leaf_items(container):
        key = path[0] if len(path) == 1 else path
        if first is None:
            first = (key, leaf.device)
        elif device is None and leaf.device != first[1]:
            raise ValueError(
                f"{type(container).__name__}.consolidate: the leaves are on several devices "
                f"(key {first[0]!r} on {first[1]}, key {key!r} on {leaf.device}) and one "
                f"storage lies on one device. Hint: pass device= to put them all there."
            )
        if leaf.layout is torch.strided or leaf.is_nested:
            continue
        raise TypeError(
            f"{type(container).__name__}.consolidate: the leaf at key {key!r} has layout "
            f"{leaf.layout}; only dense (strided) tensors and jagged nested tensors can be "
            f"packed into one storage. Hint: convert it first (td.apply(lambda t: "
            f"t.to_dense() if t.is_sparse else t)) or exclude that key."
        )


def _jagged(parts: list[torch.Tensor], ragged_idx: int) -> torch.Tensor:
    """The jagged tensor over ``parts`` (values, offsets[, lengths]): views, no copy."""
    lengths = parts[2] if len(parts) > 2 else None
    return torch.nested.nested_tensor_from_jagged(
        parts[0], parts[1], lengths, jagged_dim=ragged_idx
    )


def _all_parts(leaves: list) -> list[torch.Tensor]:
    return [part for leaf in leaves for part in _parts(leaf)]


def _layout(leaves: list) -> tuple[list[int], int]:
    """The byte offset of each leaf (dense part) in the storage, and the storage size."""
    offsets = []
    total = 0
    for leaf in leaves:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += leaf.numel() * leaf.element_size()
    return offsets, total


_MAGIC = b"TDFCONS1"
_TRAILER = struct.Struct("<Q8s")  # length of the JSON description, magic


def _describe(container: Any, offsets: list, total: int) -> dict | None:
    """The JSON description of ``container``, or None when a value is not JSON."""
    description = _description(container, offsets, total)
    # a value JSON would read back as another one (a tuple as a list, {1: ...} as
    # {"1": ...}) is not described either: from_consolidated then refuses the file
    if not all(is_json_exact(value) for value in _values(description["root"])):
        return None
    return description


def _values(node: dict):
    """Every non-tensor value of a description's tree."""
    for entry in node["entries"].values():
        if "value" in entry:
            yield entry["value"]
        elif "node" in entry:
            yield from _values(entry["node"])


def _description(container: Any, offsets: list, total: int) -> dict:
    """Where each leaf lies in the storage (part order = ``_all_parts(tensor_leaves)``)."""
    position = iter(offsets)

    def dense(item: torch.Tensor) -> dict:
        return {
            "offset": next(position),
            "dtype": str(item.dtype).removeprefix("torch."),
            "shape": list(item.shape),
        }

    def node(value: Any) -> Any:
        view = value._to_tensordict_view()
        entries = {}
        for key, item in view._data.items():
            if isinstance(item, torch.Tensor) and item.is_nested:
                entries[key] = {
                    "jagged": [dense(part) for part in _parts(item)],
                    "ragged_idx": item._ragged_idx,  # type: ignore[attr-defined]
                }
            elif isinstance(item, torch.Tensor):
                entries[key] = dense(item)
            elif _collection(item):
                entries[key] = {"node": node(item)}
            elif isinstance(item, NonTensorData):
                entries[key] = {
                    "value": item._value(),
                    "stack": type(item) is NonTensorStack,
                    "batch_size": list(item.batch_size),
                }
            else:
                raise TypeError(
                    f"consolidate: cannot describe the {type(item).__name__} at {key!r}."
                )
        return {
            "class": class_name(type(value)),
            "batch_size": list(view._batch_size),
            "names": None if view._names is None else list(view._names),
            "entries": entries,
        }

    description = {"format": "tdfunc.consolidated", "version": 1, "size": total}
    description["root"] = node(container)
    return description


def _append_description(path: str, total: int, description: dict | None) -> None:
    raw = b"" if description is None else json.dumps(description).encode()
    with open(path, "r+b") as f:
        f.seek(total)
        f.write(raw)
        f.write(_TRAILER.pack(len(raw), _MAGIC))
        f.truncate()


def file_backed_consolidation(container: Any) -> bool:
    """True for a consolidated container whose storage maps a file (on the CPU)."""
    storage = getattr(container, "_consolidation", None)
    return (
        storage is not None
        and container.is_consolidated()
        and storage.device.type == "cpu"
        and storage.untyped_storage().filename is not None
    )


def read_consolidated(path: str, cls: Any) -> Any:
    """The container a ``consolidate(filename=path)`` wrote, its leaves views of the file."""
    api = f"{cls.__name__}.from_consolidated"
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < _TRAILER.size:
            raise ValueError(f"{api}: {path} was not written by consolidate(filename=...).")
        f.seek(size - _TRAILER.size)
        length, magic = _TRAILER.unpack(f.read(_TRAILER.size))
        if magic != _MAGIC or length > size - _TRAILER.size:
            raise ValueError(f"{api}: {path} was not written by consolidate(filename=...).")
        if length == 0:
            raise ValueError(
                f"{api}: {path} holds non-tensor values JSON cannot describe exactly (only "
                "str, int, float, bool, None, lists and dicts with str keys are described); "
                "it can only be used through the container consolidate returned."
            )
        f.seek(size - _TRAILER.size - length)
        description = json.loads(f.read(length))
    total = description["size"]
    if total + length + _TRAILER.size != size:
        raise ValueError(f"{api}: {path} is corrupt (its sizes do not add up).")
    storage = torch.from_file(path, shared=True, size=total, dtype=torch.uint8)
    tensordict_class = HOOKS.tensordict

    def dense(entry: dict, key: str) -> torch.Tensor:
        dtype = getattr(torch, entry["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{api}: unknown dtype {entry['dtype']!r} at {key!r}.")
        shape = torch.Size(entry["shape"])
        nbytes = shape.numel() * torch.empty((), dtype=dtype).element_size()
        start = entry["offset"]
        if start < 0 or start + nbytes > total:
            raise ValueError(f"{api}: {path} is corrupt (entry {key!r} out of range).")
        return storage[start : start + nbytes].view(dtype).view(shape)

    def build(node: dict) -> Any:
        data: dict = {}
        size_ = torch.Size(node["batch_size"])
        for key, entry in node["entries"].items():
            if "offset" in entry:
                data[key] = dense(entry, key)
            elif "jagged" in entry:
                parts = [dense(part, key) for part in entry["jagged"]]
                data[key] = _jagged(parts, entry["ragged_idx"])
            elif "node" in entry:
                data[key] = build(entry["node"])
            else:
                batch = torch.Size(entry["batch_size"])
                if entry["stack"]:
                    data[key] = NonTensorStack.from_list(entry["value"], batch_size=batch)
                else:
                    data[key] = NonTensorData._make(entry["value"], batch, None)
        names = node.get("names")
        names = None if names is None or all(n is None for n in names) else tuple(names)
        try:  # a registered class by its name, never imported; unknown: a TensorDict
            klass = lookup_class(node.get("class", "tdfunc.TensorDict"))
        except ValueError:
            klass = tensordict_class
        return klass._from_pytree(data, size_, torch.device("cpu"), names)

    out = build(description["root"])
    out._to_tensordict_view()._consolidation = storage
    return out.lock_()


def _file_storage(filename, nbytes: int, existsok: bool) -> torch.Tensor:
    """A new file of ``nbytes`` (sparse), mapped shared, as a uint8 tensor.

    Created under a fresh name and renamed into place, as every writer of tdfunc
    does: an existing file is refused unless ``existsok``, and is then replaced,
    never written through (its other readers keep their data).
    """
    final = os.path.abspath(os.fspath(filename))
    if os.path.isdir(final):
        raise IsADirectoryError(
            f"TensorDict.consolidate: filename {final} is a directory; pass the path of a file."
        )
    if os.path.lexists(final) and not existsok:
        raise FileExistsError(
            f"TensorDict.consolidate: {final} already exists; pass existsok=True to replace it."
        )
    directory = os.path.dirname(final)
    os.makedirs(directory, exist_ok=True)
    work = os.path.join(directory, f".{secrets.token_hex(8)}.tmp")
    fd = os.open(work, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        os.replace(work, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(work)
        raise
    if not nbytes:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_file(final, shared=True, size=nbytes, dtype=torch.uint8)


class TensorDictFuture(Future):
    """The result of ``consolidate(return_early=True)``, a ``concurrent.futures.Future``.

    Example:
        >>> future = TensorDict({"a": torch.zeros(2)}, [2]).consolidate(return_early=True)
        >>> future.result().is_consolidated()
        True
    """


class ConsolidateMixin(ContainerMixin):
    """One storage for all the leaves of a container.

    Example:
        >>> td = TensorDict({"a": torch.zeros(3), "b": {"c": torch.ones(3, 2)}}, [3])
        >>> c = td.consolidate()
        >>> c.is_consolidated(), c.is_locked, c["b", "c"].tolist() == td["b", "c"].tolist()
        (True, True, True)
    """

    __slots__ = ()

    def consolidate(
        self,
        filename: str | os.PathLike | None = None,
        *,
        num_threads: int = 0,
        device: Any = None,
        non_blocking: bool = False,
        inplace: bool = False,
        return_early: bool = False,
        use_buffer: bool = False,
        share_memory: bool = False,
        pin_memory: bool = False,
        metadata: bool = False,
        existsok: bool = False,
    ):
        """A locked copy whose tensor leaves are views of one storage (already: ``self``).

        ``filename`` backs the storage with a new file (memory-mapped, shared, on the
        CPU) followed by a JSON description of the container, so that
        :meth:`from_consolidated` rebuilds it from the file alone; an existing file
        is a ``FileExistsError`` unless ``existsok=True``, which replaces it
        (mappings of the old file keep their content). ``share_memory`` puts the
        storage in shared memory; ``device`` places it there. With
        ``inplace=True`` this container's leaves are replaced by the views. With
        ``return_early=True`` a :class:`TensorDictFuture` (a
        ``concurrent.futures.Future``) of the result is returned at once.
        ``metadata`` is accepted for compatibility (the structure is always kept).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2, 3)}, [2]).consolidate()
            >>> td["a"].untyped_storage().data_ptr() == td["b"].untyped_storage().data_ptr()
            True
        """
        if return_early:
            if non_blocking:
                raise NotImplementedError(
                    f"{type(self).__name__}.consolidate: return_early=True cannot be combined "
                    "with non_blocking=True (the copy already runs in the background)."
                )
            if use_buffer:
                raise NotImplementedError(
                    f"{type(self).__name__}.consolidate: use_buffer=True is not supported with "
                    "return_early=True."
                )
            future = TensorDictFuture()
            future.set_running_or_notify_cancel()

            def work() -> None:
                try:
                    future.set_result(
                        self.consolidate(
                            filename,
                            device=device,
                            inplace=inplace,
                            share_memory=share_memory,
                            pin_memory=pin_memory,
                            existsok=existsok,
                        )
                    )
                except BaseException as error:  # the caller gets it from result()
                    future.set_exception(error)

            threading.Thread(target=work, name="tdfunc-consolidate", daemon=True).start()
            return future
        leaves = tensor_leaves(self)
        _check_layouts(self, device)
        parts = _all_parts(leaves)
        if (
            self.is_consolidated()
            and filename is None
            and device is None
            and not any(leaf.requires_grad for leaf in leaves)
        ):
            return self
        offsets, total = _layout(parts)
        target = (
            torch.device(device)
            if device is not None
            else (leaves[0].device if leaves else torch.device("cpu"))
        )
        if filename is not None:
            description = _describe(self, offsets, total)
            storage = _file_storage(filename, total, existsok)
            target = torch.device("cpu")
        else:
            storage = torch.empty(total, dtype=torch.uint8, device=target)
            if share_memory:
                storage.share_memory_()
            elif pin_memory and torch.cuda.is_available():
                storage = storage.pin_memory()
        views = []
        end = 0
        for part, offset in zip(parts, offsets):
            if offset > end:  # alignment padding: zeros, so equal containers give equal bytes
                storage[end:offset].zero_()
            nbytes = part.numel() * part.element_size()
            end = offset + nbytes
            view = storage[offset : offset + nbytes].view(part.dtype).view(part.shape)
            view.copy_(part.detach(), non_blocking=non_blocking)
            views.append(view)
        if filename is not None:
            _append_description(os.fspath(filename), total, description)
        packed = iter(views)

        def rebuilt(leaf: torch.Tensor) -> torch.Tensor:
            if not leaf.is_nested:
                return next(packed)
            own = [next(packed) for _ in _parts(leaf)]
            return _jagged(own, leaf._ragged_idx)  # type: ignore[attr-defined]

        result = map_leaves(self, rebuilt, None, True, None)
        if (device is not None or filename is not None) and hasattr(result, "_set_device"):
            result._set_device(target)
        if inplace:
            self._check_writable("consolidate", "(every leaf)")
            self._data.clear()
            self._data.update(result._data)
            result = self
        result._to_tensordict_view()._consolidation = storage
        return result.lock_()

    @property
    def _consolidated(self) -> dict:
        """The storage every leaf views and where each leaf lies in it (read-only).

        ``"storage"`` is the flat ``uint8`` tensor the tensor leaves are views of
        (a jagged tensor's values and offsets too): writing to it writes every
        leaf. ``"metadata"`` describes the tree (batch sizes, names, non-tensor
        values, and each leaf's byte offset, dtype and shape). Only a container
        returned by :meth:`consolidate` (or :meth:`from_consolidated`) has it, and
        only while it stays locked: ``unlock_()`` ends the consolidation.

        Example:
            >>> td = TensorDict({"a": torch.ones(2), "b": torch.ones(2, 3)}, [2]).consolidate()
            >>> td._consolidated["storage"].mul_(0)
            ... # doctest: +ELLIPSIS
            tensor([0, 0, ...], dtype=torch.uint8)
            >>> td["a"].tolist(), td["b"].sum().item()
            ([0.0, 0.0], 0.0)
        """
        if not self.is_consolidated():
            raise AttributeError(
                f"{type(self).__name__}._consolidated: this container is not consolidated "
                f"(call consolidate(); unlock_() ends a consolidation)."
            )
        storage = self._to_tensordict_view()._consolidation
        offsets = [
            part.storage_offset() * part.element_size() for part in _all_parts(tensor_leaves(self))
        ]
        return {"storage": storage, "metadata": _description(self, offsets, storage.numel())}

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A consolidated container pickles as its one storage and the place of each
        # leaf in it: torch cannot pickle views of one storage with different dtypes.
        # (multiprocessing sends a file-backed one by file: see file_backed_consolidation)
        storage = getattr(self, "_consolidation", None)
        if storage is None or not self.is_consolidated():
            return super().__reduce_ex__(protocol)
        skeleton = map_leaves(self, lambda t: _PLACEHOLDER, None, True, None)
        return _unpickle_consolidated, (storage, skeleton, _places(self))

    def _moved_consolidated(self, device: Any, non_blocking: bool = False) -> Any:
        """``to(device)`` of a consolidated container: the storage moves in one copy."""
        storage = self._to_tensordict_view()._consolidation
        moved = storage.to(device, non_blocking=non_blocking)
        out = _unpickle_consolidated(moved, self, _places(self))
        out._set_device(moved.device)
        return out

    @classmethod
    def from_consolidated(cls, filename: str | os.PathLike):
        """Rebuild the container that ``consolidate(filename=...)`` wrote (memory-mapped).

        The leaves are views of the file's storage (shared: writes reach the file).
        Only the JSON description written after the data is read; nothing is
        unpickled and no class is imported: a TensorClass comes back as its class when
        this process defines it (else as a TensorDict of its fields).

        Example:
            >>> import tempfile, os
            >>> path = os.path.join(tempfile.mkdtemp(), "td.bin")
            >>> _ = TensorDict({"a": torch.arange(3.0), "s": "text"}, [3]).consolidate(path)
            >>> loaded = TensorDict.from_consolidated(path)
            >>> loaded["a"].tolist(), loaded["s"]
            ([0.0, 1.0, 2.0], 'text')
        """
        return cls._adopt(read_consolidated(os.fspath(filename), cls))  # type: ignore[attr-defined]

    def is_consolidated(self) -> bool:
        """True for what :meth:`consolidate` returned, while its leaves view its storage.

        ``unlock_()`` ends the consolidation (the container may then change shape).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2])
            >>> td.is_consolidated(), td.consolidate().is_consolidated()
            (False, True)
        """
        storage = getattr(self._to_tensordict_view(), "_consolidation", None)
        if storage is None:
            return False
        first = storage.untyped_storage().data_ptr()
        return all(
            part.untyped_storage().data_ptr() == first for part in _all_parts(tensor_leaves(self))
        )


_PLACEHOLDER = torch.empty(0, device="meta")  # a pickled skeleton's leaf: no data


def _places(container: Any) -> list:
    """Where each tensor leaf lies in its storage: (dtype, offset, shape, stride) per
    dense part, then the ragged dim for a jagged leaf."""
    return [
        [(p.dtype, p.storage_offset(), tuple(p.shape), p.stride()) for p in _parts(leaf)]
        + ([leaf._ragged_idx] if leaf.is_nested else [])  # type: ignore[attr-defined]
        for leaf in tensor_leaves(container)
    ]


def _unpickle_consolidated(storage: torch.Tensor, skeleton: Any, places: list) -> Any:
    """``skeleton``'s structure over views of ``storage`` at ``places``, consolidated."""
    untyped = storage.untyped_storage()
    rebuilt = []
    for place in places:
        parts = [
            torch.empty(0, dtype=dtype, device=storage.device).set_(untyped, offset, shape, stride)
            for dtype, offset, shape, stride in (p for p in place if isinstance(p, tuple))
        ]
        rebuilt.append(parts[0] if not isinstance(place[-1], int) else _jagged(parts, place[-1]))
    values = iter(rebuilt)
    out = map_leaves(skeleton, lambda t: next(values), None, True, None)
    out._to_tensordict_view()._consolidation = storage
    return out.lock_()
