"""Sending a file-backed tensor to another process: by file name, checked by file identity.

A tensor whose storage maps a file (``MemoryMappedTensor``, a view of one,
``UntypedStorage.from_file``) travels to another process as the file's name,
the byte range it maps and its view geometry (storage offset, size, stride),
never as the start of the file. The name alone is not enough: a later save
may have replaced the file (``os.replace`` keeps old mappings alive, so the
sender still reads the old data), and the receiver would then map the new
one and silently compute on other values. So the identity of the file the
sender maps, ``(device, inode)``, travels too, and the receiver checks it on
the descriptor that it then maps: it sees exactly the sender's data or
raises :class:`StaleFileError`. A deleted file is never re-created.

``TensorDict.map`` and ``MemoryMappedTensor``'s multiprocessing pickling both
go through :func:`identity_at_name` (sender) and :func:`open_identified`
(receiver).
"""

from __future__ import annotations

import os
from typing import Any

import torch


class StaleFileError(RuntimeError):
    """A memory-mapped tensor's file name no longer names the file the tensor maps."""


def stale(api: str, filename: str, why: str) -> StaleFileError:
    return StaleFileError(
        f"{api}: the memory-mapped data backed by {filename!r} cannot be shared with another "
        f"process: {why}. The receiving process maps such tensors again by file name, so it "
        f"would compute on (or write into) another file than the sender's data (a later save "
        f"replaced it?). Load the data again, or send a copy (tensor.clone()) instead."
    )


def read_maps() -> list | None:
    """``[(start, end, device, inode), ...]`` of this process's file mappings (Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 6 or fields[4] == "0":
            continue
        start, end = (int(part, 16) for part in fields[0].split("-"))
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        out.append((start, end, os.makedev(major, minor), int(fields[4])))
    return out


def mapped_inode(address: int, maps: list | None) -> tuple | None:
    """``(device, inode)`` of the file mapped at ``address``, or None if unknown."""
    for start, end, device, inode in maps or ():
        if start <= address < end:
            return device, inode
    return None


def identity_at_name(filename: str, mapped: tuple | None, api: str) -> tuple:
    """``(device, inode, size)`` of the file at ``filename``, checked against ``mapped``.

    ``mapped`` is the ``(device, inode)`` the sender's storage maps (None when
    unknown). Raises :class:`StaleFileError` when the name is gone or names
    another file: the receiver could not map the sender's data.
    """
    try:
        st = os.stat(filename)
    except OSError as error:
        raise stale(api, filename, f"the file cannot be read ({error.strerror})") from None
    if mapped is not None and tuple(mapped) != (st.st_dev, st.st_ino):
        raise stale(api, filename, "the file at that name is not the one it maps")
    return (st.st_dev, st.st_ino, st.st_size)


def open_identified(
    filename: str,
    nbytes: int,
    dtype: torch.dtype,
    size,
    stride,
    offset: int,
    identity: tuple | None,
    api: str = "MemoryMappedTensor",
) -> torch.Tensor:
    """Map the sender's file again as the view ``(size, stride, offset)`` of ``nbytes`` bytes.

    ``identity`` is ``(device, inode)`` or ``(device, inode, size)``, checked on an
    open descriptor before the file is mapped by name, and on the name after:
    the descriptor keeps that inode alive (its number cannot be reused), so a
    file renamed over the name in between is caught. Mapping by name (not
    ``/proc/self/fd/N``) keeps the storage's ``filename`` meaningful, so the
    receiver can send the tensor on. Raises :class:`StaleFileError`.
    """
    shared = True
    try:
        fd = os.open(filename, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except PermissionError:  # a read-only file: a private (copy-on-write) mapping reads it
        fd, shared = os.open(filename, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)), False
    except FileNotFoundError:
        raise stale(api, filename, "the file was deleted") from None
    try:
        st = os.fstat(fd)
        _check_identity(st, identity, nbytes, filename, api)
        storage = torch.UntypedStorage.from_file(filename, shared=shared, nbytes=nbytes)
        try:
            after = os.stat(filename)
        except OSError:
            raise stale(api, filename, "the file was deleted while it was mapped") from None
        if (after.st_dev, after.st_ino) != (st.st_dev, st.st_ino):
            raise stale(api, filename, "the file at that name was replaced while it was mapped")
    finally:
        os.close(fd)
    return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)  # type: ignore[arg-type]


def _check_identity(st: os.stat_result, identity, nbytes: int, filename: str, api: str) -> None:
    if identity is not None:
        now = (st.st_dev, st.st_ino, st.st_size)[: len(identity)]
        if now != tuple(identity):
            raise stale(api, filename, "the file at that name was replaced since it was sent")
    if st.st_size < nbytes:  # mapping past the end would crash the receiver (SIGBUS)
        raise stale(api, filename, f"the file now holds {st.st_size} bytes, fewer than {nbytes}")


def geometry(tensor: torch.Tensor) -> tuple[Any, ...]:
    """``(nbytes of the storage, dtype, size, stride, storage offset)`` of a view."""
    return (
        tensor.untyped_storage().nbytes(),
        tensor.dtype,
        tuple(tensor.shape),
        tensor.stride(),
        tensor.storage_offset(),
    )
