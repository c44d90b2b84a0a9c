"""Sending memory-mapped tensors and containers to other processes: the file, not the values.

multiprocessing (queues, pools, ``torch.multiprocessing``) pickles through
``ForkingPickler``: a ``MemoryMappedTensor`` travels as its file's name, identity and
the view's place in it, and a container's file-backed leaves go the same way. Plain
``pickle`` and ``torch.save`` are unchanged (they store the values).
"""

from __future__ import annotations

import os
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from .._core.convert.consolidate import file_backed_consolidation
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .memmap_tensor import MemoryMappedTensor, _wrap
from .sharing import geometry, mapped_inode, open_identified, read_maps


def _rebuild(filename: str, geometry: tuple, inode: tuple) -> MemoryMappedTensor:
    """The receiving side of :func:`_reduce_for_process`: the same view of the same file."""
    nbytes, dtype, size = geometry[:3]
    if not nbytes:  # nothing mapped (an empty tensor): no file to open
        return _wrap(torch.empty(size, dtype=dtype), filename, tuple(inode))
    tensor = open_identified(filename, *geometry, inode, "MemoryMappedTensor")
    return _wrap(tensor, filename, tuple(inode))


def _reduce_for_process(tensor: MemoryMappedTensor):
    """multiprocessing (queues, pools, ``torch.multiprocessing``): the file, not the values.

    The view's place in the file travels (storage size, offset, strides) with the
    identity of the file it maps; the receiver checks that identity (raising
    ``StaleFileError`` for a file replaced or deleted since) before it maps.
    """
    if tensor.is_nested:
        # the flat mapping travels, with the components' place in it
        storage = tensor.untyped_storage()
        flat = torch.empty((0,), dtype=tensor.dtype)
        flat.set_(storage, 0, (storage.nbytes() // tensor.element_size(),))
        layout = (
            tensor._nested_tensor_size(),
            tensor._nested_tensor_strides(),
            tensor._nested_tensor_storage_offsets(),
        )
        return _rebuild_nested, (tensor._filename, geometry(flat), tensor._inode, layout)
    return _rebuild, (tensor._filename, geometry(tensor), tensor._inode)


def _rebuild_nested(filename: str, geometry: tuple, inode: tuple, layout: tuple):
    flat = _rebuild(filename, geometry, inode).as_subclass(torch.Tensor)
    return _wrap(torch._nested_view_from_buffer(flat, *layout), filename, tuple(inode))


ForkingPickler.register(MemoryMappedTensor, _reduce_for_process)


def _reduce_leaf_for_process(leaf: NonTensorData) -> tuple:
    """multiprocessing of a memory-mapped non-tensor leaf: its binding to the saved entry
    travels too (plain ``pickle`` sends a copy of the value), so that the receiver's
    ``update_`` reaches the file, as its writes through a ``MemoryMappedTensor`` do."""
    reduced = leaf.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    binding = {k: leaf.__dict__[k] for k in ("_write_back", "_is_memmap") if k in leaf.__dict__}
    if not binding:
        return reduced
    return _rebuild_leaf, (reduced[0], reduced[1], reduced[2], binding)


def _rebuild_leaf(factory, arguments: tuple, state: Any, binding: dict) -> NonTensorData:
    leaf = factory(*arguments)
    attributes, slots = state if type(state) is tuple else (state, None)
    for name, value in {**(attributes or {}), **(slots or {}), **binding}.items():
        object.__setattr__(leaf, name, value)
    return leaf


for _leaf_class in (NonTensorData, NonTensorStack):
    ForkingPickler.register(_leaf_class, _reduce_leaf_for_process)


def _as_file_view(tensor: torch.Tensor, maps: list | None) -> MemoryMappedTensor:
    """A plain tensor over a file mapping (``UntypedStorage.from_file``, a ``consolidate``d
    file) as the ``MemoryMappedTensor`` view it is, naming the file it maps."""
    filename = tensor.untyped_storage().filename
    mapped = mapped_inode(tensor.untyped_storage().data_ptr(), maps)
    if mapped is None:  # mapping unknown (not Linux): the file at the name now
        try:
            st = os.stat(filename)
        except OSError:
            mapped = (-1, -1)  # the receiver will say the file is gone
        else:
            mapped = (st.st_dev, st.st_ino)
    return _wrap(tensor, os.path.abspath(filename), mapped)


def reduce_collection_for_process(container: Any) -> tuple:
    """multiprocessing pickling of a ``TensorDict``: file-backed leaves go by file.

    torch's own pickling of a plain tensor over a file mapping fails (``EBADF``,
    "file_descriptor" strategy) or, worse, moves the *sender's* storage to shared
    memory ("file_system" strategy): the sender's later writes silently stop
    reaching its file. Such leaves are sent as ``MemoryMappedTensor`` views
    instead (file name, identity, offset and strides). Other leaves, and plain
    ``pickle``, are unchanged.
    """
    if file_backed_consolidation(container):
        # its leaves go by file (below), not as a copy of the consolidated storage
        reduced = object.__reduce_ex__(container, pickle.HIGHEST_PROTOCOL)
    else:
        reduced = container.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    state = reduced[2] if len(reduced) > 2 else None
    slots = state[1] if type(state) is tuple and len(state) == 2 else None
    data = slots.get("_data") if type(slots) is dict else None
    if type(data) is not dict:
        return reduced
    maps: list | bool | None = False
    shipped = dict(data)
    for key, value in data.items():
        if (
            type(value) is torch.Tensor
            and value.device.type == "cpu"
            and value.untyped_storage().filename is not None
        ):
            if maps is False:
                maps = read_maps()
            shipped[key] = _as_file_view(value, maps)  # type: ignore[arg-type]
    changed = len(shipped) and any(shipped[k] is not data[k] for k in data)
    if changed or "_consolidation" in slots:
        # the receiver maps each leaf's file itself: its leaves no longer share one
        # storage, so it is not consolidated (and the storage is not sent).
        slots = {k: v for k, v in slots.items() if k != "_consolidation"}
        slots["_data"] = shipped
        reduced = (*reduced[:2], (state[0], slots), *reduced[3:])
    return reduced
