"""One saved directory across saves: which files are in use, new, or stale.

Rules that keep every committed checkpoint whole, for this process and others:

- a file that a committed ``meta.json`` references is never written again by a
  save (only a user's in-place write through a loaded tensor writes it). Every
  leaf of a save goes to a new file (``O_EXCL``), under a name no earlier
  generation used (``<stem>.<token>.memmap``; ``<stem>.memmap`` only in a
  directory this save created), and stale files are removed only after the new
  ``meta.json`` is committed. A process that mapped an older generation keeps
  reading it whole: removing a name leaves the mapped pages in place.
- nothing tdfunc did not write is deleted or overwritten. A directory is
  written only if it is new, empty, or holds a valid tdfunc ``meta.json``;
  anything else is a ``FileExistsError`` naming what is in the way. In a
  directory of ours, only the names the replaced metadata referenced and
  tdfunc's own temporary names (``<stem>.<token>.memmap``, ``meta.json.<token>.tmp``,
  ``trash.<token>.tmp``) are removed; other files are left alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .filenames import NAME
from .files import create_file
from .format import META, META_TMP, OBJECT_FILE, TENSOR_FILE, TRASH, data_file
from .format import new_token as new_token


def _referenced(node: Any) -> set[str]:
    """Every file and directory name ``node`` uses."""
    names: set[str] = set()
    if type(node) is not dict or type(node.get("entries")) is not dict:
        return names
    inner = node.get("tensordict")  # a TensorClass: its TensorDict's sub-directory
    if type(inner) is dict and type(inner.get("dir")) is str:
        names.add(inner["dir"])
    for entry in node["entries"].values():
        if type(entry) is not dict:
            continue
        name = entry.get("file") or entry.get("dir")
        if type(name) is str:
            names.add(name)
    return names


def is_temporary(name: str) -> bool:
    """A name only tdfunc writes and no committed generation keeps unreferenced."""
    if META_TMP.fullmatch(name) or TRASH.fullmatch(name):
        return True
    return (TENSOR_FILE.fullmatch(name) or OBJECT_FILE.fullmatch(name)) is not None and (
        name.count(".") == 2
    )


class Directory:
    """The state of one directory of the tree being saved, read before anything is written."""

    __slots__ = ("claimed", "fresh", "leftover", "names", "ours", "path", "protected")

    def __init__(self, path: str, names: set[str], old_nodes: list, fresh: bool = False) -> None:
        self.path = path
        self.names = names
        self.fresh = fresh  # created by this save: plain names are free
        self.protected: set[str] = set()  # referenced by committed metadata: never written
        self.claimed: set[str] = set()  # files this save keeps, each for one entry
        # names an earlier save replaced and was to remove after its commit (recorded in
        # its meta.json under "stale": a kill before the removal must not leak them)
        self.leftover: set[str] = set()
        for node in old_nodes:
            self.protected |= _referenced(node)
            if type(node) is dict and type(node.get("stale")) is list:
                self.leftover |= {n for n in node["stale"] if type(n) is str and _ours_name(n)}
        self.ours = any(node is not None for node in old_nodes)

    def claim(self, name: str) -> bool:
        """Keep the file ``name`` as it is for one entry of this save; False when another
        entry already kept it (two entries sharing one file would see each other's
        writes after a load, so the second one gets a copy)."""
        if name in self.claimed:
            return False
        self.claimed.add(name)
        self.protected.add(name)  # never overwritten or removed by this save
        return True

    def create(self, stem: str, suffix: str) -> tuple[int, str]:
        """(descriptor, name) of a new file for ``stem``, under a name nothing used."""
        if self.fresh:
            name = data_file(stem, None, suffix)
            if name not in self.names:
                with contextlib.suppress(FileExistsError):
                    return create_file(os.path.join(self.path, name)), name
        while True:
            name = data_file(stem, new_token(), suffix)
            try:
                return create_file(os.path.join(self.path, name)), name
            except FileExistsError:  # a leftover of a crashed save (4 billion to one)
                continue

    def replaced(self, node: dict) -> list[str]:
        """The names of earlier generations that ``node`` no longer uses and that only a
        record can tell from a user's file (plain names: ``a.memmap``, ``b/``)."""
        used = _referenced(node)
        names = (self.protected | self.leftover) - used
        return sorted(n for n in names if not is_temporary(n) and n in self.names)

    def stale(self, node: dict) -> tuple[list[str], list[str]]:
        """(files, directories) the new ``node`` replaced; removed once it is committed.

        Stale sub-directories are renamed to a trash name at once, so that a
        later save can create a directory of the same name.
        """
        files: list[str] = []
        trash: list[str] = []
        if not self.ours and not self.fresh:
            return files, trash
        used = _referenced(node)
        used.add(META)
        try:
            names = os.listdir(self.path)
        except OSError:
            return files, trash
        real = None
        for name in names:
            if name in used:
                continue
            path = os.path.join(self.path, name)
            if name in self.protected or name in self.leftover or is_temporary(name):
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    real = real or os.path.realpath(self.path)
                    files.append(os.path.join(real, name))
                elif TRASH.fullmatch(name):
                    trash.append(path)
                elif stat.S_ISDIR(st.st_mode) and NAME.fullmatch(name) and is_ours(path):
                    moved = os.path.join(self.path, f"trash.{secrets.token_hex(8)}.tmp")
                    with contextlib.suppress(OSError):
                        os.rename(path, moved)
                        trash.append(moved)
        return files, trash


def _ours_name(name: str) -> bool:
    """A name tdfunc writes for a data file or a sub-directory."""
    return bool(TENSOR_FILE.fullmatch(name) or OBJECT_FILE.fullmatch(name) or NAME.fullmatch(name))


def is_ours(directory: str) -> bool:
    """A real directory holding nothing but files and directories tdfunc writes."""
    if os.path.islink(directory) or not os.path.isdir(directory):
        return False
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.islink(path):
            return False
        if name == META or TENSOR_FILE.fullmatch(name) or OBJECT_FILE.fullmatch(name):
            continue
        if META_TMP.fullmatch(name) or TRASH.fullmatch(name):
            continue
        if NAME.fullmatch(name) and is_ours(path):
            continue
        return False
    return True


# ---------------------------------------------------------------------------- removal
def _remove(files: list[str], trash: list[str]) -> None:
    for path in files:
        with contextlib.suppress(OSError):  # best effort: the new data is committed
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
        with _CLEANER_LOCK:
            _DOOMED.discard(path)
    for path in trash:
        if not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)


# One worker, started on first use and joined at exit: starting a thread per save
# costs more than the removal itself on small saves.
_CLEANER: dict[str, Any] = {"executor": None, "pid": None, "pending": []}
_CLEANER_LOCK = threading.Lock()
_DOOMED: set[str] = set()  # files queued for removal: a save must not reuse them


def is_doomed(path: str) -> bool:
    """True while ``path`` waits in the removal queue of an earlier save."""
    with _CLEANER_LOCK:
        return path in _DOOMED


def remove_in_background(files: list[str], trash: list[str]) -> None:
    with _CLEANER_LOCK:
        if _CLEANER["executor"] is None or _CLEANER["pid"] != os.getpid():
            _CLEANER["executor"] = ThreadPoolExecutor(1, thread_name_prefix="tdfunc-cleanup")
            _CLEANER["pid"] = os.getpid()
            _CLEANER["pending"] = []
            _DOOMED.clear()
        _DOOMED.update(files)
        pending = [f for f in _CLEANER["pending"] if not f.done()]
        pending.append(_CLEANER["executor"].submit(_remove, files, trash))
        _CLEANER["pending"] = pending


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}


def worker_pool(num_threads: int) -> ThreadPoolExecutor:
    """A pool of ``num_threads`` writers/readers, kept for the next save (threads are slow
    to start, and idle ones cost nothing)."""
    key = (os.getpid(), num_threads)
    with _CLEANER_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(num_threads, thread_name_prefix="tdfunc-io")
    return pool


def wait_for_cleanup() -> None:
    """Block until the removal of files replaced by earlier saves has finished."""
    with _CLEANER_LOCK:
        pending = list(_CLEANER["pending"]) if _CLEANER["pid"] == os.getpid() else []
    for future in pending:
        future.result()
