"""Files of memory-mapped tensors: created under a fresh name, written with ``write()``,
checked against the size their dtype and shape need, and a temporary home for tensors
made without a file name."""

from __future__ import annotations

import atexit
import math
import os
import shutil
import stat
import tempfile
import uuid
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from .confine import check_data_file

_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_CREATE_FLAGS |= getattr(os, "O_BINARY", 0)
_WRITE_BLOCK = 1 << 30  # one os.write call writes at most ~2 GiB on Linux
_COPY_BLOCK = 8 << 20  # a non-contiguous tensor is written through buffers of this size


def nbytes_of(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def create_file(path: str) -> int:
    """Create ``path`` (which must not exist) and return a read-write descriptor."""
    return os.open(path, _CREATE_FLAGS, 0o644)


def check_has_data(value: torch.Tensor, what: str) -> None:
    """Refuse, before anything is written, a tensor whose values cannot be read as bytes;
    ``what`` opens the message (``"TensorDict.memmap: cannot save key 'a'"``)."""
    problem = None
    if value.device.type == "meta":
        problem = "it is a meta tensor (a shape and a dtype, no values)"
    elif is_traceable_wrapper_subclass(value):
        problem = (
            f"it is a {type(value).__name__}, a tensor subclass that wraps other tensors and "
            f"has no storage of its own to write"
        )
    if problem is not None:
        raise TypeError(
            f"{what}: {problem}. Hint: save plain tensors (for a wrapper subclass, the "
            f"tensors it holds), or allocate files of that shape and dtype without values "
            f"(memmap_like(), MemoryMappedTensor.empty)."
        )


def _bytes_of(tensor: torch.Tensor):
    """A zero-copy byte view (numpy) of a contiguous CPU tensor.

    A contiguous tensor may still carry a stride other than 1 on a dimension of size
    1 (``torch.zeros(2)[::2]``), which ``view(torch.uint8)`` refuses: its elements are
    dense in memory, so they are read with unit strides.
    """
    flat = tensor.reshape(-1)
    if flat.numel() == 1 and flat.stride(0) != 1:
        flat = flat.as_strided((1,), (1,))
    return flat.view(torch.uint8).numpy()


def tensor_bytes(tensor: torch.Tensor):
    """The bytes of ``tensor`` (detached, on the CPU), in row-major order."""
    return _bytes_of(plain_cpu(tensor).contiguous())


def write_all(fd: int, buffer) -> None:
    view = memoryview(buffer).cast("B")
    offset = 0
    while offset < len(view):
        offset += os.write(fd, view[offset : offset + _WRITE_BLOCK])


def plain_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, on the CPU, with its conjugate/negative bits resolved."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.to("cpu")
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    return tensor


def write_file(fd: int, path: str, tensor: torch.Tensor, shape=None) -> None:
    """Write the content of ``tensor`` (broadcast to ``shape``) to the empty file ``fd``.

    Everything goes through ``os.write`` (no copy for a contiguous tensor, the
    GIL released); others (expanded, transposed) are made contiguous a block
    at a time, so a broadcast dataset is never materialised in memory. Never
    through a mapping: on a full disk, a write into a mapped sparse file kills
    the process with ``SIGBUS``, where ``write`` raises ``OSError(ENOSPC)``.
    """
    tensor = plain_cpu(tensor)
    shape = tensor.shape if shape is None else torch.Size(shape)
    if nbytes_of(shape, tensor.dtype) == 0:
        return
    if tensor.shape != shape:
        tensor = tensor.expand(shape)
    _write_blocks(fd, tensor)


def _write_blocks(fd: int, tensor: torch.Tensor) -> None:
    if tensor.is_contiguous() or tensor.ndim == 0 or tensor.nbytes <= _COPY_BLOCK:
        write_all(fd, _bytes_of(tensor.contiguous()))
        return
    rows = max(1, _COPY_BLOCK // max(1, tensor[0].nbytes))
    for start in range(0, tensor.shape[0], rows):
        _write_blocks(fd, tensor[start : start + rows] if rows > 1 else tensor[start])


def allocate_file(fd: int, nbytes: int) -> None:
    """Give the file its size without writing: a sparse file that reads as zeros."""
    if nbytes:
        os.ftruncate(fd, nbytes)


def check_file(
    path: str, nbytes: int, api: str, *, exact: bool = True, follow_symlinks: bool = False
) -> os.stat_result:
    """``stat`` a data file; a clear error unless it is a regular file of the right size.

    Loading refuses symbolic links (``follow_symlinks=False``): a file listed in
    ``meta.json`` must be inside the saved directory.
    """
    if not follow_symlinks:
        st = check_data_file(path, api)
    else:
        st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{api}: {path} is not a regular file (a symbolic link, a directory or a device); "
            f"refusing to map it."
        )
    if st.st_size < nbytes or (exact and st.st_size != nbytes):
        raise ValueError(
            f"{api}: data file {path} holds {st.st_size} bytes, but its metadata needs "
            f"{nbytes} bytes: the file is truncated or corrupt (an interrupted copy?). "
            f"Save the data again."
        )
    return st


# ---------------------------------------------------------------------------- temp location
_TEMP: dict[str, Any] = {"dir": None, "pid": None}


def temp_dir() -> str:
    """A directory for memory-mapped data saved without a prefix (removed at exit)."""
    if _TEMP["dir"] is None or _TEMP["pid"] != os.getpid():
        _TEMP["dir"] = tempfile.mkdtemp(prefix="tdfunc-memmap-")
        _TEMP["pid"] = os.getpid()
        atexit.register(_remove_temp_dir, _TEMP["dir"], _TEMP["pid"])
    return _TEMP["dir"]


def _remove_temp_dir(path: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child must not remove its parent's data
        shutil.rmtree(path, ignore_errors=True)


def temp_path() -> str:
    return os.path.join(temp_dir(), uuid.uuid4().hex + ".memmap")
