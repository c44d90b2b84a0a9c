"""``consolidate``: every tensor leaf copied into one storage, as views of it.

A consolidated container moves to another device, pickles and is sent in one
block. It is locked: its leaves can be written in place, entries cannot be added or
removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any

import torch

from ..math.leafwise import map_leaves, tensor_leaves
from ..mixin import ContainerMixin

_ALIGN = 16


def _layout(leaves: list) -> tuple[list[int], int]:
    """The byte offset of each leaf in the storage, and the storage size."""
    offsets = []
    total = 0
    for leaf in leaves:
        total = -(-total // _ALIGN) * _ALIGN
        offsets.append(total)
        total += leaf.numel() * leaf.element_size()
    return offsets, total


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
        share_memory: bool = False,
        pin_memory: bool = False,
        existsok: bool = False,
    ):
        """A locked copy whose tensor leaves are views of one storage (already: ``self``).

        ``filename`` backs the storage with a new file (memory-mapped, shared); an
        existing file is a ``FileExistsError`` unless ``existsok=True``, which
        replaces it (mappings of the old file keep their content).
        ``share_memory`` puts it in shared memory; ``device`` places it there.
        With ``inplace=True`` this container's leaves are replaced by the views.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2, 3)}, [2]).consolidate()
            >>> td["a"].untyped_storage().data_ptr() == td["b"].untyped_storage().data_ptr()
            True
        """
        leaves = tensor_leaves(self)
        if self.is_consolidated() and filename is None and device is None:
            return self
        offsets, total = _layout(leaves)
        target = (
            torch.device(device)
            if device is not None
            else (leaves[0].device if leaves else torch.device("cpu"))
        )
        if filename is not None:
            storage = _file_storage(filename, total, existsok)
        else:
            storage = torch.empty(total, dtype=torch.uint8, device=target)
            if share_memory:
                storage.share_memory_()
            elif pin_memory and torch.cuda.is_available():
                storage = storage.pin_memory()
        views = []
        for leaf, offset in zip(leaves, offsets):
            nbytes = leaf.numel() * leaf.element_size()
            view = storage[offset : offset + nbytes].view(leaf.dtype).view(leaf.shape)
            view.copy_(leaf.detach(), non_blocking=non_blocking)
            views.append(view)
        values = iter(views)
        result = map_leaves(self, lambda t: next(values), None, True, None)
        if device is not None and hasattr(result, "_set_device"):
            result._set_device(device)
        if inplace:
            self._check_writable("consolidate", "(every leaf)")
            self._data.clear()
            self._data.update(result._data)
            return self.lock_()
        return result.lock_()

    def is_consolidated(self) -> bool:
        """True when every tensor leaf is a view of one storage (one leaf: always).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2])
            >>> td.is_consolidated(), td.consolidate().is_consolidated()
            (False, True)
        """
        leaves = tensor_leaves(self)
        if not leaves:
            return False
        first = leaves[0].untyped_storage().data_ptr()
        return all(leaf.untyped_storage().data_ptr() == first for leaf in leaves[1:])
