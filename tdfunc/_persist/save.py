"""Writing a TensorDict (or TensorClass) as a directory of memory-mapped files.

A save runs in four steps, so that a crash at any point leaves a loadable
directory with either the old or the new content, never a mix:

1. *plan* (calling thread): walk the container, validate every value, encode
   non-tensor values, check that every directory is new, empty or tdfunc's
   (:mod:`tdfunc._persist.directory`), create the new directories. No file is
   written yet, so an invalid value fails the save before anything changes.
2. *write* (``num_threads`` threads): every leaf goes to a new file (``O_EXCL``)
   under a name no committed ``meta.json`` uses, with ``write()`` (never through
   a mapping, so a full disk is an ``OSError``, not a ``SIGBUS``).
3. *commit*: each level's ``meta.json`` is written to a new file and renamed
   into place, sub-directories first and the top level last. The top-level
   ``meta.json`` embeds the whole tree, so a load from the top sees exactly one
   generation.
4. *clean*: the files the replaced metadata used, and leftovers of crashed
   saves, are removed in a background thread (freeing a file's blocks can take
   milliseconds). Files still mapped, here or in another process, keep their
   content: only the name goes away. Concurrent saves to one directory are
   not supported.

Durability: by default nothing is ``fsync``-ed. The page cache makes the rename
ordering hold for every reader and across a killed process; ``fsync=True``
extends it to power loss / kernel crashes (data files, then each directory,
then ``meta.json`` and its directory are synced), at a cost on small files.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading
from concurrent.futures import Future
from typing import Any

import torch

from .._core.helpers.class_names import class_name
from .._core.helpers.mixin import is_tensor_collection as _collection
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .._core.helpers.nontensor.values import is_json_exact
from .directory import Directory, is_doomed, is_ours, remove_in_background, worker_pool
from .directory import wait_for_cleanup as wait_for_cleanup
from .filenames import encode_key
from .files import allocate_file, check_has_data, nbytes_of, tensor_bytes, write_all, write_file
from .format import (
    FORMAT,
    MAX_DEPTH,
    META,
    PACK_ALIGN,
    PACKED_VERSION,
    TENSOR_FILE,
    TENSORDICT_DIR,
    VERSION,
    dtype_name,
    encode_object,
    fsync_directory,
    inline_child,
    inline_tensordict,
    read_meta,
    write_meta,
)
from .memmap_tensor import MemmapFileExistsError, MemoryMappedTensor, map_file, map_view
from .nested import nested_flat, nested_numel, nested_parts, nested_view, packed_buffer
from .saved_paths import remember_path
from .write_back import bind

_CPU = torch.device("cpu")
# A level with at least PACK_MIN_LEAVES tensors of at most PACK_LEAF_BYTES each stores
# them in one file (see format.py): a few leaves keep a readable file each.
PACK_MIN_LEAVES = 16
PACK_LEAF_BYTES = 16 << 10
PACK_STEM = "packed~0000000000000000"
_SHOWN = 5  # entries named in a "directory in the way" error


# ---------------------------------------------------------------------------- plan
class _Level:
    """One container of the tree being saved."""

    __slots__ = (
        "children",
        "directory",
        "inner",
        "node",
        "results",
        "small",
        "source",
        "state",
        "view",
    )

    def __init__(self, source: Any, directory: str | None) -> None:
        self.source = source
        self.state: Directory | None = None
        self.view = source._to_tensordict_view()
        self.directory = directory
        self.results: dict[str, Any] = {}
        self.children: list[_Level] = []
        self.inner: _Level | None = None  # a TensorClass's TensorDict (its own directory)
        self.small: list[tuple] = []  # (key, tensor, entry, nbytes): candidates for a pack
        view = self.view
        self.node: dict = {
            "format": FORMAT,
            "version": VERSION,
            "class": class_name(type(source)),
            "batch_size": list(view.batch_size),
            "names": None if view._names is None else list(view._names),
            "device": None if view.device is None else str(view.device),
            "entries": {},
        }


class _Save:
    """The options of one save and the work it collects while planning."""

    def __init__(self, api, inplace, like, copy_existing, existsok, fsync) -> None:
        self.api = api
        self.inplace = inplace
        self.like = like
        self.copy_existing = copy_existing
        self.existsok = existsok
        self.fsync = fsync
        self.jobs: list[tuple] = []  # (nbytes, callable)
        self.levels: list[_Level] = []  # post-order: children before parents
        self.created: list[tuple[str, str]] = []  # (directory, file) written by this save
        self.made: list[str] = []  # directories this save created
        self.states: dict[str, Directory] = {}
        self.lock = threading.Lock()
        # recorded in every meta.json of this save: a non-tensor leaf writes its new
        # value back only into the save it came from (see write_back)
        self.generation = secrets.token_hex(8)

    # -------------------------------------------------------------- walking the tree
    def plan(
        self,
        source: Any,
        directory: str | None,
        at: tuple = (),
        inline: tuple = (),
        items: list | None = None,
    ) -> _Level:
        """Plan ``source``; ``inline`` holds the metadata its ancestors recorded for it.

        ``items`` (the key-value pairs to save) is given for the TensorDict of a
        TensorClass, which holds only the tensor and collection fields.
        """
        if len(at) > MAX_DEPTH:
            raise ValueError(
                f"{self.api}: containers are nested more than {MAX_DEPTH} levels deep (at key "
                f"{_show(at[:3])}...); flatten the structure before saving it."
            )
        level = _Level(source, directory)
        level.node["generation"] = self.generation
        old_nodes: list = []
        if directory is not None:
            nested = bool(at) or items is not None
            old_nodes = self._prepare_directory(level, at, inline, nested)
        if items is None:
            items = list(level.view._data.items())
            if level.view is not source:
                items = self._plan_tensorclass(level, items, at, old_nodes)
        entries = level.node["entries"]
        for key, value in items:
            path = at + (key,)
            if isinstance(value, torch.Tensor):
                plan = self._plan_nested if value.is_nested else self._plan_tensor
                entries[key] = plan(level, key, value, path)
            elif _collection(value):
                stem = encode_key(key)
                child = self.plan(
                    value,
                    None if directory is None else os.path.join(directory, stem),
                    path,
                    tuple(inline_child(node, key, stem) for node in old_nodes),
                )
                level.children.append(child)
                level.results[key] = child
                entries[key] = {"kind": "collection", "dir": stem, "meta": child.node}
            elif isinstance(value, NonTensorData):
                entries[key] = self._plan_object(level, key, value, path)
            else:
                raise TypeError(
                    f"{self.api}: cannot save the value at key {_show(path)} (a "
                    f"{type(value).__name__}); expected a tensor, a tensor collection or "
                    f"NonTensorData."
                )
        self._schedule_small(level)
        self.levels.append(level)
        return level

    def _plan_tensorclass(self, level: _Level, items: list, at: tuple, old_nodes: list) -> list:
        """Plan the TensorDict of a TensorClass in ``_tensordict``; return the other items.

        The TensorClass's own level keeps its non-tensor fields (and the order of
        all fields); its tensor and collection fields form a plain TensorDict.
        """
        inner_items = [(k, v) for k, v in items if isinstance(v, torch.Tensor) or _collection(v)]
        directory = level.directory
        level.inner = self.plan(
            level.view,
            None if directory is None else os.path.join(directory, TENSORDICT_DIR),
            at,
            tuple(inline_tensordict(node) for node in old_nodes),
            inner_items,
        )
        level.node["keys"] = [key for key, _ in items]
        level.node["tensordict"] = {"dir": TENSORDICT_DIR, "meta": level.inner.node}
        inner_keys = {key for key, _ in inner_items}
        return [(k, v) for k, v in items if k not in inner_keys]

    def _prepare_directory(self, level: _Level, at: tuple, inline: tuple, nested: bool) -> list:
        """Create the directory or check what it holds; return the metadata that uses it."""
        directory = level.directory
        assert directory is not None
        if self._make(directory, create_parents=not nested):
            return self._fresh(level)
        try:
            st = os.stat(directory, follow_symlinks=not nested)
        except OSError as error:
            raise FileExistsError(f"{self.api}: cannot use {directory}: {error}.") from None
        where = f" (key {_show(at)})" if at else ""
        if stat.S_ISLNK(st.st_mode):
            raise FileExistsError(
                f"{self.api}: refusing to write through the symbolic link {directory}"
                f"{where}; remove it or choose another prefix."
            )
        if not stat.S_ISDIR(st.st_mode):
            raise FileExistsError(
                f"{self.api}: {directory}{where} exists and is not a directory; tdfunc never "
                f"replaces a file it did not write. Remove it or choose another prefix."
            )
        names = set(os.listdir(directory))
        if not names and not any(node is not None for node in inline):
            return self._fresh(level)  # empty: as good as new
        own = None
        if META in names:
            try:
                own = read_meta(directory, self.api)
            except (OSError, ValueError) as error:
                raise FileExistsError(
                    f"{self.api}: {os.path.join(directory, META)}{where} is not metadata "
                    f"tdfunc wrote ({error}); tdfunc never replaces a file it did not write. "
                    f"Remove it or choose another prefix."
                ) from None
            if not self.existsok:  # also a RuntimeError, as in tensordict
                raise MemmapFileExistsError(
                    f"{self.api}: {directory} already holds saved data ({META} exists) and "
                    f"existsok=False; pass existsok=True to replace it."
                )
        # the files this directory's meta.json uses, and those its ancestors' use: both
        # stay untouched until the new metadata is committed
        old_nodes = [own, *inline]
        if names and not any(node is not None for node in old_nodes):
            parent = self.states.get(os.path.dirname(directory))
            if nested and parent is not None and parent.ours and is_ours(directory):
                # what a save interrupted before its commit left in a directory of ours
                os.rename(directory, os.path.join(parent.path, f"trash.{secrets.token_hex(8)}.tmp"))
                self._make(directory, create_parents=False)
                return self._fresh(level)
            shown = ", ".join(sorted(names)[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
            raise FileExistsError(
                f"{self.api}: {directory}{where} already holds files that no tdfunc metadata "
                f"references ({shown}); tdfunc never deletes or overwrites files it did not "
                f"write. Choose a new or empty directory, or move these files away (an "
                f"interrupted first save to this directory can leave such files)."
            )
        level.state = self.states[directory] = Directory(directory, names, old_nodes)
        return [node for node in old_nodes if node is not None]

    def _make(self, directory: str, create_parents: bool) -> bool:
        """Create ``directory``; False when it exists."""
        try:
            os.mkdir(directory)
        except FileNotFoundError:
            if not create_parents:
                raise
            os.makedirs(os.path.dirname(directory), exist_ok=True)
            return self._make(directory, False)
        except FileExistsError:
            return False
        self.made.append(directory)
        return True

    def _fresh(self, level: _Level) -> list:
        assert level.directory is not None
        level.state = self.states[level.directory] = Directory(level.directory, set(), [], True)
        return []

    def _plan_tensor(self, level: _Level, key: str, value, path) -> dict:
        entry = {
            "kind": "tensor",
            "file": None,
            "dtype": dtype_name(value.dtype, _key(path), self.api),
            "shape": list(value.shape),
        }
        if value.layout is not torch.strided or value.is_nested or value.is_quantized:
            raise TypeError(
                f"{self.api}: cannot save key {_show(path)}: only dense (strided, "
                f"non-quantized) tensors can be memory-mapped, got layout {value.layout}."
            )
        if not self.like:  # (memmap_like reads only the shape and dtype)
            check_has_data(value, f"{self.api}: cannot save key {_show(path)}")
        if isinstance(value, MemoryMappedTensor) and value._is_whole_file() and not self.like:
            # (not a view; memmap_like wants new, empty files, so it never reuses one)
            if self._keep_file(level, key, value, value, entry):
                return entry
            real = os.path.realpath(level.directory)
            if os.path.dirname(os.path.realpath(value.filename)) != real and not (
                self.copy_existing
            ):
                raise RuntimeError(
                    f"{self.api}: A filename was provided but the tensor already has a file "
                    f"associated: key {_show(path)} is already memory-mapped in "
                    f"{value.filename}, outside {level.directory}. Pass copy_existing=True "
                    f"to copy it there."
                )
        nbytes = nbytes_of(value.shape, value.dtype)
        if not self.like and level.state is not None and 0 < nbytes <= PACK_LEAF_BYTES:
            level.small.append((key, value, entry, nbytes))  # scheduled once the level is planned
            return entry
        self._schedule_one(level, key, value, entry, nbytes)
        return entry

    def _schedule_one(self, level: _Level, key: str, value, entry: dict, nbytes: int) -> None:
        stem = encode_key(key)

        def job() -> None:
            level.results[key] = self._write_tensor(level.state, stem, value, entry)

        self.jobs.append((nbytes, job))

    def _schedule_small(self, level: _Level) -> None:
        """The level's small tensors: one shared file when there are many (a file per leaf
        costs a create, a write and a mapping each, which dominate tiny leaves), else one
        file each."""
        small, level.small = level.small, []
        if len(small) < PACK_MIN_LEAVES:
            for key, value, entry, nbytes in small:
                self._schedule_one(level, key, value, entry, nbytes)
            return
        level.node["version"] = PACKED_VERSION
        offsets = []
        end = 0
        for _, _, _, nbytes in small:
            offsets.append(end)
            end += -(-nbytes // PACK_ALIGN) * PACK_ALIGN

        def job() -> None:
            self._write_pack(level, small, offsets, end)

        self.jobs.append((end, job))

    def _write_pack(self, level: _Level, small: list, offsets: list, end: int) -> None:
        state = level.state
        assert state is not None
        buffer = bytearray(end)  # zeros between the tensors
        view = memoryview(buffer)
        for (_, value, _, nbytes), offset in zip(small, offsets):
            view[offset : offset + nbytes] = tensor_bytes(value)
        fd, name = self._create(state, PACK_STEM, "memmap")
        path = os.path.join(state.path, name)
        try:
            write_all(fd, buffer)
            if self.fsync:
                os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        base = map_file(path, torch.uint8, (end,), st)
        for (key, value, entry, _), offset in zip(small, offsets):
            entry["file"] = name
            entry["offset"] = offset
            level.results[key] = map_view(base, offset, value.dtype, value.shape)

    def _keep_file(self, level: _Level, key: str, value, mapped, entry: dict) -> bool:
        """Keep ``value`` as it is when the file it maps (``mapped``) is already one of
        this directory's: the same file and the object users hold (a new file would
        leave their later writes in the old one). A save without a directory keeps it."""
        real = None if level.directory is None else os.path.realpath(level.directory)
        if real is not None:
            if not _reusable(mapped, real):
                return False
            name = os.path.basename(mapped.filename)
            assert level.state is not None
            if not level.state.claim(name):
                return False
            entry["file"] = name
        level.results[key] = value
        return True

    def _plan_nested(self, level: _Level, key: str, value, path) -> dict:
        """A nested tensor: its components in one file, mapped back as a nested view."""
        layout, sizes = nested_parts(value, self.api, _key(path))
        entry = {
            "kind": "nested",
            "file": None,
            "dtype": dtype_name(value.dtype, _key(path), self.api),
            "layout": layout,
            "sizes": sizes,
        }
        buffer = packed_buffer(value, sizes)
        if (
            isinstance(buffer, MemoryMappedTensor)
            and buffer._is_whole_file()
            and not self.like
            and self._keep_file(level, key, value, buffer, entry)
        ):
            return entry
        stem = encode_key(key)

        def job() -> None:
            buffer = self._write_tensor(level.state, stem, nested_flat(value), entry)
            level.results[key] = nested_view(buffer, layout, sizes)

        self.jobs.append((nested_numel(sizes) * value.dtype.itemsize, job))
        return entry

    def _plan_object(self, level: _Level, key: str, value: NonTensorData, path) -> dict:
        stack = type(value) is NonTensorStack
        entry: dict = {"kind": "non_tensor", "batch_size": list(value.batch_size), "stack": stack}
        leaf = level.results[key] = type(value)._make(value.data, value.batch_size, _CPU)
        if level.directory is None:
            return entry
        bind(leaf, level.directory, key, self.generation)
        if is_json_exact(value.data):
            entry["value"] = value.data
            return entry
        blob = encode_object(value.data, _key(path), self.api)
        stem = encode_key(key)
        state = level.state
        assert state is not None

        def job() -> None:
            fd, name = self._create(state, stem, "pt")
            try:
                os.write(fd, blob)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            entry["file"] = name

        self.jobs.append((len(blob), job))
        entry["file"] = None
        return entry

    # -------------------------------------------------------------- writing
    def _create(self, state: Directory, stem: str, suffix: str) -> tuple[int, str]:
        fd, name = state.create(stem, suffix)
        with self.lock:  # removed again if the save fails
            self.created.append((state.path, os.path.join(state.path, name)))
        return fd, name

    def _write_tensor(self, state, stem: str, value, entry: dict) -> MemoryMappedTensor:
        if state is None:
            return MemoryMappedTensor.from_tensor(value, copy_data=not self.like)
        fd, name = self._create(state, stem, "memmap")
        path = os.path.join(state.path, name)
        try:
            if self.like:
                allocate_file(fd, nbytes_of(value.shape, value.dtype))
            else:
                write_file(fd, path, value)
            if self.fsync:
                os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        entry["file"] = name
        return map_file(path, value.dtype, value.shape, st)

    def run_jobs(self, num_threads: int) -> None:
        if num_threads <= 1 or len(self.jobs) <= 1:
            for _, job in self.jobs:
                job()
            return
        # one task per thread, balanced by bytes: submitting a task per tiny leaf
        # would cost more than writing it
        bins: list[list] = [[] for _ in range(min(num_threads, len(self.jobs)))]
        loads = [0] * len(bins)
        for nbytes, job in sorted(self.jobs, key=lambda item: -item[0]):
            i = loads.index(min(loads))
            bins[i].append(job)
            loads[i] += nbytes + 4096

        def run(jobs: list) -> None:
            for job in jobs:
                job()

        pool = worker_pool(num_threads)
        for future in [pool.submit(run, jobs) for jobs in bins]:
            future.result()

    # -------------------------------------------------------------- commit and clean
    def commit(self) -> None:
        committed: set[str] = set()
        try:
            for level in self.levels:  # post-order: the top level is committed last
                if level.state is None:
                    continue
                if self.fsync:  # the new files' and sub-directories' names first
                    fsync_directory(level.state.path)
                replaced = level.state.replaced(level.node)
                if replaced:  # removed after the commit: recorded, should a kill come first
                    level.node["stale"] = replaced
                write_meta(level.state.path, level.node, self.fsync)
                committed.add(level.state.path)
        except BaseException:
            # a level already committed references its new files: they stay (the next
            # save removes them); the others go
            self.discard(committed)
            raise
        if self.fsync and self.made and self.levels[-1].directory in self.made:
            fsync_directory(os.path.dirname(self.levels[-1].directory))

    def clean(self) -> None:
        """Remove what earlier saves left (in a background thread: freeing blocks is slow)."""
        files: list[str] = []
        trash: list[str] = []
        for level in self.levels:
            if level.state is not None:
                stale_files, stale_dirs = level.state.stale(level.node)
                files += stale_files
                trash += stale_dirs
        if files or trash:
            remove_in_background(files, trash)

    def discard(self, keep: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        """After a failure: remove what this save created (nothing committed references it)."""
        for directory, path in self.created:
            if directory not in keep:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for directory in reversed(self.made):
            if directory not in keep:
                with contextlib.suppress(OSError):
                    os.rmdir(directory)  # only if empty

    # -------------------------------------------------------------- results
    def build(self, level: _Level) -> Any:
        results = level.results
        if level.inner is not None:
            results = {**level.inner.results, **results}
        view = level.view
        if self.inplace:
            for key in view._data:
                value = results[key]
                view._data[key] = self.build(value) if isinstance(value, _Level) else value
            view._device = _CPU
            out = level.source
        else:
            data = {
                key: self.build(value) if isinstance(value, _Level) else value
                for key, value in ((k, results[k]) for k in view._data)
            }
            out = type(level.source)._from_pytree(data, view.batch_size, _CPU, view._names)
        if level.directory is not None:
            remember_path(out, level.directory)
            inner = out._to_tensordict_view()
            if inner is not out:
                remember_path(inner, level.directory)
        return out


def _key(path: tuple) -> Any:
    return path[0] if len(path) == 1 else path


def _show(path: tuple) -> str:
    return repr(_key(path))


def _reusable(value: MemoryMappedTensor, real_directory: str) -> bool:
    """The file of ``value`` is a data file of this directory, still the one it maps."""
    filename = value.filename
    if os.path.dirname(os.path.realpath(filename)) != real_directory:
        return False
    name = os.path.basename(filename)
    if not TENSOR_FILE.fullmatch(name) or is_doomed(os.path.join(real_directory, name)):
        return False
    try:
        st = os.stat(filename, follow_symlinks=False)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == value._inode and st.st_size == value.nbytes


# ---------------------------------------------------------------------------- entry point
def save(
    obj: Any,
    prefix,
    *,
    api: str,
    inplace: bool,
    like: bool,
    copy_existing: bool,
    num_threads: int,
    return_early: bool,
    existsok: bool,
    fsync: bool,
    top_class: str | None = None,
) -> Any:
    """Save ``obj`` under ``prefix`` (a temporary location when ``None``); see the module doc.

    ``top_class`` replaces the class recorded for ``obj`` (a non-tensor leaf saved on
    its own is saved as the TensorDict holding it, under its own class name).
    """
    # num_threads was checked by the public entry point (api.py)
    directory = None if prefix is None else os.path.abspath(os.fspath(prefix))
    work = _Save(api, inplace, like, copy_existing, existsok, fsync)
    try:
        top = work.plan(obj, directory)
        if top_class is not None:
            top.node["class"] = top_class
    except BaseException:
        work.discard()
        raise

    def finish() -> Any:
        try:
            work.run_jobs(num_threads)
        except BaseException:
            work.discard()
            raise
        finally:
            work.jobs = []  # the jobs refer to ``work``: drop the cycle (and the mappings)
        work.commit()
        work.clean()
        out = work.build(top)
        out.lock_()
        return out

    if not (return_early and num_threads > 0):
        return finish()
    future: Future = Future()

    def background() -> None:
        try:
            future.set_result(finish())
        except BaseException as error:
            future.set_exception(error)

    future.set_running_or_notify_cancel()
    threading.Thread(target=background, name="tdfunc-memmap").start()
    return future
