"""One saved directory across saves: which files are in use, reused, or stale.

Saving again to a directory must never write a file that a committed
``meta.json`` references (a crash would leave old metadata over new data). The
simple way, a new file per leaf and the old one deleted, turns every save into
a create and a delete per leaf; on file systems that discard freed blocks
online (common on cloud disks) each delete costs milliseconds and stalls the
creates that follow. So small files are *recycled*, double-buffered:

- the files the current ``meta.json`` references (generation ``N``) are
  *protected*: never written;
- the files of generation ``N - 1`` (kept after the previous save, at most
  ``KEEP_LIMIT`` bytes each) are overwritten in place with generation
  ``N + 1`` when their size matches, unless this process still maps them;
- ``meta.json`` itself alternates between two files: the new metadata is
  written over the previous generation's ``meta.json`` (kept under a ``.old``
  name), then renamed into place; the current one is kept as the next ``.old``.

A steady stream of saves of the same shapes thus creates and deletes nothing.
The price: a *different process* that loaded generation ``N - 1`` and still
reads it lazily sees the small leaves change two saves later (call
``memmap_refresh_`` after a save). Larger files are always new and removed
once stale, in a background thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .format import DTYPES, META, META_TMP, OBJECT_FILE, TENSOR_FILE, TRASH, data_file
from .format import new_token as new_token
from .keys import NAME
from .memmap_tensor import create_file, is_mapped, nbytes_of

KEEP_LIMIT = 8 << 20  # stale files up to this size are kept for the next save to overwrite
_STEM_OF = re.compile(r"([^.]*)\..*")


def _referenced(node: Any, small: set[str] | None = None) -> set[str]:
    """Every file and directory name ``node`` uses; its small tensor files go to ``small``."""
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
        if type(name) is not str:
            continue
        names.add(name)
        if small is None or entry.get("kind") != "tensor":
            continue
        dtype = DTYPES.get(entry.get("dtype"))  # type: ignore[arg-type]
        shape = entry.get("shape")
        if dtype is not None and type(shape) is list:
            with contextlib.suppress(TypeError):
                if nbytes_of(shape, dtype) <= KEEP_LIMIT:
                    small.add(name)
    return names


def read_node(directory: str) -> dict | None:
    """The parsed ``meta.json`` of ``directory``, or ``None`` (missing or unreadable)."""
    try:
        with open(os.path.join(directory, META), "rb") as file:
            node = json.loads(file.read())
    except (OSError, ValueError):
        return None
    return node if type(node) is dict else None


class Directory:
    """The state of one directory of the tree being saved, read before anything is written."""

    __slots__ = ("keep", "lock", "names", "path", "protected", "recyclable", "spare_meta")

    def __init__(self, path: str, names: set[str], old_nodes: list) -> None:
        self.path = path
        self.names = names
        self.lock = threading.Lock()
        self.protected: set[str] = set()
        self.keep: set[str] = set()
        for node in old_nodes:
            self.protected |= _referenced(node, self.keep)
        if names and not any(node is not None for node in old_nodes):
            self.protected |= names  # no readable metadata: touch nothing that exists
        self.recyclable: dict[str, list[str]] = {}
        self.spare_meta: str | None = None
        doomed: set[str] = set()
        if _DOOMED:  # files an earlier save is still removing are not spares
            start = os.path.realpath(path) + os.sep
            with _CLEANER_LOCK:
                doomed = {name for name in names if start + name in _DOOMED}
        for name in names - self.protected - doomed:
            if TENSOR_FILE.fullmatch(name):
                match = _STEM_OF.fullmatch(name)
                if match:
                    self.recyclable.setdefault(match.group(1), []).append(name)
            elif self.spare_meta is None and META_TMP.fullmatch(name) and name.endswith(".old"):
                self.spare_meta = name

    def protect(self, name: str) -> None:
        """A file reused as it is by this save: never overwrite it."""
        self.protected.add(name)
        for names in self.recyclable.values():
            if name in names:
                names.remove(name)

    def recycle(self, stem: str, nbytes: int) -> tuple[str, os.stat_result] | None:
        """(name, stat) of a stale file of ``stem`` holding exactly ``nbytes``, if any."""
        for name in self.recyclable.pop(stem, ()):
            try:
                st = os.stat(os.path.join(self.path, name), follow_symlinks=False)
            except OSError:
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and st.st_size == nbytes
                and not is_mapped((st.st_dev, st.st_ino))  # this process still reads it
            ):
                return name, st
        return None

    def create(self, stem: str, suffix: str) -> tuple[int, str]:
        """(descriptor, name) of a new file for ``stem``, under a name nothing uses."""
        name = data_file(stem, None, suffix)
        if name in self.names:
            name = data_file(stem, new_token(), suffix)
        while True:
            try:
                return create_file(os.path.join(self.path, name)), name
            except FileExistsError:  # a leftover of a crashed save, or a concurrent one
                name = data_file(stem, new_token(), suffix)

    def stale(self, node: dict, spare: str | None) -> tuple[list[str], list[str]]:
        """(files, directories) that neither the new ``node`` nor the next save needs.

        Files the previous ``meta.json`` used (small ones) are kept: the next save
        overwrites them. Stale sub-directories are renamed to a trash name at
        once, so that a later save can create a directory of the same name.
        """
        used = _referenced(node)
        stems = {_STEM_OF.sub(r"\1", name) for name in used if TENSOR_FILE.fullmatch(name)}
        # the previous generation of the leaves still saved: the next save overwrites them
        spares = {name for name in self.keep if _STEM_OF.sub(r"\1", name) in stems}
        keep = used | spares | {META}
        if spare is not None:
            keep.add(spare)
        files: list[str] = []
        trash: list[str] = []
        try:
            names = os.listdir(self.path)
        except OSError:
            return files, trash
        real = None
        for name in names:
            if name in keep:
                continue
            path = os.path.join(self.path, name)
            if (
                TENSOR_FILE.fullmatch(name)
                or OBJECT_FILE.fullmatch(name)
                or META_TMP.fullmatch(name)
            ):
                # queued by their real path: the path a later save compares with
                real = real or os.path.realpath(self.path)
                files.append(os.path.join(real, name))
            elif TRASH.fullmatch(name):
                trash.append(path)
            elif NAME.fullmatch(name) and _is_ours(path):
                moved = os.path.join(self.path, f"trash.{secrets.token_hex(8)}.tmp")
                with contextlib.suppress(OSError):
                    os.rename(path, moved)
                    trash.append(moved)
        return files, trash


def _is_ours(directory: str) -> bool:
    """A real directory holding nothing but files and directories tdfunc writes."""
    if os.path.islink(directory) or not os.path.isdir(directory):
        return False
    for name in os.listdir(directory):
        if name == META or TENSOR_FILE.fullmatch(name) or OBJECT_FILE.fullmatch(name):
            continue
        if META_TMP.fullmatch(name) or TRASH.fullmatch(name):
            continue
        if NAME.fullmatch(name) and _is_ours(os.path.join(directory, name)):
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
