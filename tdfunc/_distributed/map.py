"""``TensorDict.map``: run a function over chunks of a TensorDict in worker processes.

The data goes to shared memory first (``share_memory_()``, in place), unless a
leaf is memory-mapped from a file, which workers map again by file name: the
identity of the caller's file (device, inode, size) travels with it, checked
when it is sent (the name must still name the file the caller maps) and when
a worker opens it (on the descriptor it then maps), so workers see exactly
the caller's data or ``StaleFileError`` is raised; a deleted file is never
re-created. A worker of a caller-provided ``multiprocessing.Pool`` that dies
makes ``map`` raise (the pool itself would wait forever for its task). Each
worker receives the whole container once (pool initializer) and then only
index ranges, so a task costs a few bytes of pickling, whatever the chunk
size. Workers see the same storage as the caller: a function that writes
its chunk in place (``chunk.set_(key, value)``) and returns ``None`` edits
the caller's data. Start methods: everything passed to workers is pickled
explicitly, so ``"spawn"`` works as well as ``"fork"`` (``fn`` must then be
importable: a module-level function).
"""

from __future__ import annotations

import concurrent.futures
import io
import itertools
import math
import multiprocessing
import os
import pickle
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
import torch.multiprocessing as torch_mp
import torch.utils._pytree as pytree

from .._persist.sharing import (
    StaleFileError,
    geometry,
    identity_at_name,
    mapped_inode,
    open_identified,
    read_maps,
)

_WORKER_STATE: tuple | None = None  # (shipment, fn, dim) in a worker of our own pool
_STALE = "stale"  # the "item" of an error tuple that is not fn's (see _raise_worker_error)
_POLL_SECONDS = 0.1  # how often a caller-provided Pool's workers are checked while waiting


# ---------------------------------------------------------------- moving data to workers
_API = "TensorDict.map"


class _Pickler(ForkingPickler):
    """torch's shared-memory pickling, except that file-backed tensors travel by file name,
    with the identity (device, inode, size) of the file the caller maps (see
    :mod:`tdfunc._persist.sharing`, shared with ``MemoryMappedTensor``'s pickling)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._maps: list | bool | None = False  # read on the first file-backed tensor

    def _identity(self, storage: Any) -> tuple:
        if self._maps is False:
            self._maps = read_maps()
        mapped = mapped_inode(storage.data_ptr(), self._maps)  # type: ignore[arg-type]
        return identity_at_name(storage.filename, mapped, _API)

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and _file_backed(obj):
            storage = obj.untyped_storage()
            return open_identified, (
                storage.filename,
                *geometry(obj),
                self._identity(storage),
                _API,
            )
        return NotImplemented


class _Shipment:
    """A container on its way to a worker process (see :class:`_Pickler`).

    ``error``: set in the worker when the container could not be rebuilt there
    (a stale file); the tasks then report it instead of running ``fn``.
    """

    __slots__ = ("collection", "error")

    def __init__(self, collection: Any, error: str | None = None) -> None:
        self.collection = collection
        self.error = error

    def __reduce__(self):
        buffer = io.BytesIO()
        _Pickler(buffer, pickle.HIGHEST_PROTOCOL).dump(self.collection)
        return _unship, (buffer.getvalue(),)


def _check_files(collection: Any) -> None:
    """Raise :class:`StaleFileError` (naming the key) for a memory-mapped leaf whose file
    name no longer names the file it maps: workers could not see the caller's data."""
    pickler = _Pickler(io.BytesIO())
    for path, leaf in pytree.tree_flatten_with_path(collection)[0]:
        if isinstance(leaf, torch.Tensor) and _file_backed(leaf):
            try:
                pickler._identity(leaf.untyped_storage())
            except StaleFileError as error:
                key = tuple(getattr(entry, "key", entry) for entry in path)
                shown = key[0] if len(key) == 1 else key
                raise StaleFileError(f"{error} (at key {shown!r})") from None


def _unship(payload: bytes) -> _Shipment:
    try:
        return _Shipment(pickle.loads(payload))
    except StaleFileError as error:  # reported by the tasks: a failed unpickle kills workers
        return _Shipment(None, str(error))


def _file_backed(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.untyped_storage().filename is not None


def _share(collection: Any) -> None:
    """Put every CPU tensor leaf that is neither shared nor file-backed in shared memory."""
    for leaf in pytree.tree_leaves(collection):
        if (
            isinstance(leaf, torch.Tensor)
            and leaf.device.type == "cpu"
            and not leaf.is_shared()
            and not _file_backed(leaf)
        ):
            leaf.share_memory_()


# ---------------------------------------------------------------- worker side
def _init_worker(shipment: _Shipment, fn: Callable, dim: int) -> None:
    global _WORKER_STATE
    torch.set_num_threads(1)  # the pool is the parallelism (as DataLoader workers do)
    _WORKER_STATE = (shipment, fn, dim)


def _index(dim: int, index: Any) -> tuple:
    return (slice(None),) * dim + (index,)


def _process(data: Any, fn: Callable, dim: int, start: int, stop: int, per_item: bool):
    """Run ``fn``; returns (outputs, None) or (None, (item, exception line, traceback))."""
    if not per_item:
        try:
            return fn(data[_index(dim, slice(start, stop))]), None
        except BaseException as error:
            return None, (None, _one_line(error), traceback.format_exc())
    outputs = []
    for item in range(start, stop):
        try:
            outputs.append(fn(data[_index(dim, item)]))
        except BaseException as error:
            return None, (item, _one_line(error), traceback.format_exc())
    return outputs, None


def _one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _run_range(task: tuple) -> tuple:
    index, start, stop, per_item = task
    assert _WORKER_STATE is not None, "a task of TensorDict.map ran outside its pool"
    shipment, fn, dim = _WORKER_STATE
    if shipment.error is not None:
        return index, None, (_STALE, shipment.error, "")
    return (index, *_process(shipment.collection, fn, dim, start, stop, per_item))


def _run_shipped(task: tuple) -> tuple:
    """A task for a caller-provided pool: the chunk itself travels with the task."""
    index, shipment, fn, dim, per_item, start = task
    if shipment.error is not None:
        return index, None, (_STALE, shipment.error, "")
    data = shipment.collection
    outputs, error = _process(data, fn, dim, 0, data.batch_size[dim], per_item)
    if error is not None and error[0] is not None:
        error = (error[0] + start, *error[1:])  # the item's index in the whole container
    return index, outputs, error


# ---------------------------------------------------------------- caller side
def _ranges(total: int, chunksize: int | None, num_chunks: int | None, workers: int) -> list:
    if chunksize == 0:  # one item per call; tasks batch several items to amortise IPC
        step = max(1, math.ceil(total / (workers * 8)))
    elif chunksize is not None:
        step = chunksize
    else:
        pieces = min(num_chunks if num_chunks is not None else workers, total)
        base, extra = divmod(total, pieces)
        bounds = [0]
        for piece in range(pieces):
            bounds.append(bounds[-1] + base + (piece < extra))
        return list(itertools.pairwise(bounds))
    return [(start, min(start + step, total)) for start in range(0, total, step)]


def _check_args(td: Any, fn, dim, num_workers, chunksize, num_chunks, pool) -> int:
    if not callable(fn):
        raise TypeError(f"TensorDict.map: fn must be callable, got {type(fn).__name__}.")
    ndim = len(td.batch_size)
    if type(dim) is not int or not -ndim <= dim < ndim:
        raise ValueError(
            f"TensorDict.map: dim must be a batch dim in [-{ndim}, {ndim}) for batch size "
            f"{list(td.batch_size)}, got {dim!r}."
        )
    if chunksize is not None and num_chunks is not None:
        raise ValueError(
            "TensorDict.map: pass chunksize or num_chunks, not both (got "
            f"chunksize={chunksize}, num_chunks={num_chunks})."
        )
    if chunksize is not None and (type(chunksize) is not int or chunksize < 0):
        raise ValueError(
            f"TensorDict.map: chunksize must be an int >= 0 (0: one item at a time), got "
            f"{chunksize!r}."
        )
    if num_chunks is not None and (type(num_chunks) is not int or num_chunks < 1):
        raise ValueError(f"TensorDict.map: num_chunks must be an int >= 1, got {num_chunks!r}.")
    if num_workers is not None and (type(num_workers) is not int or num_workers < 1):
        raise ValueError(f"TensorDict.map: num_workers must be an int >= 1, got {num_workers!r}.")
    if pool is not None and not (
        isinstance(pool, concurrent.futures.Executor) or hasattr(pool, "imap_unordered")
    ):
        raise TypeError(
            f"TensorDict.map: pool must be a multiprocessing Pool or a concurrent.futures "
            f"Executor, got {type(pool).__name__}."
        )
    return dim % ndim


def _tasks(pool: Any, own: bool, td: Any, fn, dim: int, ranges: list, per_item: bool):
    """Submit every range; yields (index, outputs, error) as tasks complete."""
    if own or isinstance(pool, concurrent.futures.Executor):
        try:
            futures = [
                pool.submit(_run_range, (i, start, stop, per_item))
                if own
                else pool.submit(_run_shipped, _shipped_task(td, fn, dim, per_item, i, start, stop))
                for i, (start, stop) in enumerate(ranges)
            ]
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            # raised while starting "spawn" / "forkserver" workers, which get fn by pickle
            raise TypeError(
                f"TensorDict.map: fn ({fn!r}) or the data cannot be sent to the worker "
                f"processes: {error}. With the 'spawn' or 'forkserver' start method, fn must be "
                f"picklable: define it at module level (no lambda or local function); "
                f"non-tensor values must be picklable too."
            ) from error
        for future in concurrent.futures.as_completed(futures):
            yield future.result()
        return
    tasks = (
        _shipped_task(td, fn, dim, per_item, i, start, stop)
        for i, (start, stop) in enumerate(ranges)
    )
    workers: dict = {}
    _check_workers(pool, workers, True)  # workers already dead (not yet replaced): not ours
    results = pool.imap_unordered(_run_shipped, tasks)
    while True:
        try:
            yield results.next(timeout=_POLL_SECONDS)
        except StopIteration:
            return
        except multiprocessing.TimeoutError:
            _check_workers(pool, workers)


def _check_workers(pool: Any, workers: dict, before: bool = False) -> None:
    """Raise if a worker of a ``multiprocessing.Pool`` died: the pool replaces it, but the
    task it held is lost and would never complete (the pool would wait forever)."""
    for process in getattr(pool, "_pool", ()):  # the pool's current workers
        if id(process) not in workers:  # dead before this map started: none of our tasks
            dead = before and getattr(process, "exitcode", None) is not None
            workers[id(process)] = None if dead else process
    for process in workers.values():
        if process is None:
            continue
        code = getattr(process, "exitcode", None)
        if code:  # a worker that ends its life normally (maxtasksperchild) exits with 0
            raise RuntimeError(
                f"TensorDict.map: a worker process of the given pool died (exit code {code}: "
                f"killed or crashed, e.g. out of memory) while chunks were pending; its task "
                f"is lost. The pool stays open; its dead worker was replaced."
            )


def _shipped_task(td, fn, dim, per_item, index, start, stop) -> tuple:
    return index, _Shipment(td[_index(dim, slice(start, stop))]), fn, dim, per_item, start


def _raise_worker_error(error: tuple, ranges: list, index: int, dim: int, per_item: bool):
    item, line, remote = error
    if item == _STALE:
        raise StaleFileError(line)
    start, stop = ranges[index]
    where = f"item {item}" if per_item else f"items {start}:{stop}"
    raise RuntimeError(
        f"TensorDict.map: fn raised {line} in a worker process, on {where} along dim {dim}.\n"
        f"Worker traceback:\n{remote}"
    )


def _assemble(td: Any, results: list, ranges: list, dim: int, per_item: bool) -> Any:
    outputs: list = []
    for result in results:
        outputs.extend(result if per_item else [result])
    if all(out is None for out in outputs):
        return td  # fn edited the (shared) data in place
    for position, out in enumerate(outputs):
        if out is not None and not getattr(type(out), "_is_tensor_collection", False):
            raise TypeError(
                f"TensorDict.map: fn must return None (in-place edit) or a TensorDict / "
                f"TensorClass, got {type(out).__name__} for {'item' if per_item else 'chunk'} "
                f"{position}."
            )
    if per_item:
        items = [td[_index(dim, i)] if out is None else out for i, out in enumerate(outputs)]
        return _name_mapped_dim(torch.stack(items, dim), td.names[dim], dim)
    chunks = [
        td[_index(dim, slice(start, stop))] if out is None else out
        for (start, stop), out in zip(ranges, outputs)
    ]
    return torch.cat(chunks, dim)


def _name_mapped_dim(result: Any, name: str | None, dim: int) -> Any:
    """The stacked items' new dim is the mapped one: it keeps that dim's name (as the
    chunks' concatenation does), unless the outputs already use the name elsewhere."""
    names = list(result.names)
    if name is not None and names[dim] is None and name not in names:
        names[dim] = name
        result.names = names
    return result


def td_map(
    td: Any,
    fn: Callable,
    dim: int = 0,
    num_workers: int | None = None,
    chunksize: int | None = None,
    num_chunks: int | None = None,
    pool: Any = None,
    pbar: bool = False,
    mp_start_method: str | None = None,
) -> Any:
    dim = _check_args(td, fn, dim, num_workers, chunksize, num_chunks, pool)
    total = td.batch_size[dim]
    if total == 0:
        return td
    workers = num_workers or os.cpu_count() or 1
    ranges = _ranges(total, chunksize, num_chunks, workers)
    per_item = chunksize == 0
    bar = None
    if pbar:
        try:
            from tqdm.auto import tqdm  # optional dependency, imported only when asked for
        except ImportError:
            raise ImportError(
                "TensorDict.map: pbar=True needs tqdm; install it (pip install tqdm) or pass "
                "pbar=False."
            ) from None

        bar = tqdm(total=total, desc="TensorDict.map")
    _share(td)
    own = pool is None
    if not own or torch_mp.get_context(mp_start_method).get_start_method() != "fork":
        _check_files(td)  # workers will map file-backed leaves again by name
    if own:
        pool = concurrent.futures.ProcessPoolExecutor(
            max_workers=min(workers, len(ranges)),
            mp_context=torch_mp.get_context(mp_start_method),
            initializer=_init_worker,
            initargs=(_Shipment(td), fn, dim),
        )
    results: list = [None] * len(ranges)
    failed = True
    try:
        for index, outputs, error in _tasks(pool, own, td, fn, dim, ranges, per_item):
            if error is not None:
                _raise_worker_error(error, ranges, index, dim, per_item)
            results[index] = outputs
            if bar is not None:
                start, stop = ranges[index]
                bar.update(stop - start)
        failed = False
    except BrokenProcessPool as error:  # bound at import: a caller's Pool never imports it
        raise RuntimeError(
            "TensorDict.map: a worker process died (killed or crashed, e.g. out of memory) "
            "before finishing its chunk."
        ) from error
    finally:
        if bar is not None:
            bar.close()
        if own:
            pool.shutdown(wait=True, cancel_futures=failed)
    return _assemble(td, results, ranges, dim, per_item)


class MapMixin:
    """Methods of ``TensorDict``: map over chunks in worker processes."""

    __slots__ = ()

    def map(
        self,
        fn: Callable,
        dim: int = 0,
        num_workers: int | None = None,
        chunksize: int | None = None,
        num_chunks: int | None = None,
        pool: Any = None,
        pbar: bool = False,
        mp_start_method: str | None = None,
    ):
        """Apply ``fn`` to chunks along ``dim`` in a pool of worker processes.

        The TensorDict is first moved to shared memory in place (memory-mapped
        leaves stay where they are), so workers see the caller's storage.
        Exceptions in ``fn`` are raised here as ``RuntimeError`` with the
        worker's traceback.

        Args:
            fn: called with a chunk (a TensorDict along ``dim``). It either writes the
                chunk in place and returns ``None``, or returns a TensorDict. It must
                be picklable (a module-level function) unless workers are forked.
            dim: the batch dim to split.
            num_workers: worker processes (default: ``os.cpu_count()``).
            chunksize: items per chunk; ``0`` calls ``fn`` on one item at a time (the
                item has ``dim`` removed).
            num_chunks: number of chunks instead of ``chunksize``. With neither, one
                chunk per worker.
            pool: a ``multiprocessing.Pool`` or ``concurrent.futures.Executor`` to use
                (not closed); chunks then travel with each task.
            pbar: show a tqdm progress bar (counts items).
            mp_start_method: ``"fork"``, ``"spawn"``, ``"forkserver"`` or ``None``
                (the platform default).

        Returns:
            ``self`` (modified in place) when ``fn`` returned ``None`` for every chunk;
            otherwise the outputs concatenated along ``dim`` (stacked when
            ``chunksize=0``), a chunk that returned ``None`` contributing itself.

        Example:
            >>> def process_data(data):  # at module level
            ...     data.set_("images", data.get("images").flip(-2).clone())
            >>> # data_preproc = data.map(process_data, num_workers=4, chunksize=0, pbar=True)
        """
        return td_map(
            self, fn, dim, num_workers, chunksize, num_chunks, pool, pbar, mp_start_method
        )
