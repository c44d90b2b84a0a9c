"""Memory-mapped persistence: ``memmap``, ``memmap_``, ``memmap_like``, ``load_memmap``, ...

The methods of ``TensorDict`` defined here are thin: the format lives in
:mod:`tdfunc._persist.format` (and key encoding in :mod:`tdfunc._persist.filenames`),
writing in :mod:`tdfunc._persist.save`, reading in :mod:`tdfunc._persist.load`.
The methods serve ``TensorDict`` and every ``TensorClass`` (through
:class:`~tdfunc._core.ops.TensorOps`); the class of each level is recorded on
disk, so a saved TensorClass loads back as its class.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from .._core.helpers.frozen import refuse_frozen_inside
from .._core.helpers.mixin import is_tensor_collection_or_class
from .._core.helpers.nested_keys import unravel_key
from .._core.helpers.nontensor import is_non_tensor
from . import load as _persist_load
from . import save as _persist_save
from .confine import check_component, enter_directory
from .filenames import is_valid_name
from .format import read_meta
from .leaf import load_leaf, memmap_leaf
from .make import MakeMemmapMixin
from .memmap_tensor import MemmapFileExistsError, MemoryMappedTensor
from .nested import nested_buffer
from .saved_paths import remember_path, saved_path_of
from .schema import SchemaMixin
from .tensordict_read import (
    child_directory,
    is_tensordict_layout,
    nested_container_keys,
    read_tensordict_layout,
)
from .tensordict_write import save_tensordict_layout

if TYPE_CHECKING:
    from typing_extensions import Self


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while saving or loading.

    Both allocate a few small objects per leaf; with many leaves that triggers
    collections that walk every object of the program (10-20% of a save).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _is_mapped(value: torch.Tensor) -> bool:
    """A ``MemoryMappedTensor``, or a nested tensor viewing one (as loaded)."""
    if isinstance(value, MemoryMappedTensor):
        return True
    if not value.is_nested:
        return False
    buffer = nested_buffer(value)
    return isinstance(buffer, MemoryMappedTensor) or isinstance(
        getattr(buffer, "_base", None), MemoryMappedTensor
    )


def _check_options(api: str, share_non_tensor: bool, robust_key) -> None:
    if share_non_tensor:
        raise NotImplementedError(
            f"{api}: share_non_tensor=True is not supported: non-tensor values are saved "
            f"in meta.json and loaded per process. Share them through tensors instead."
        )
    if robust_key is False:
        raise ValueError(
            f"{api}: robust_key=False (keys used as file names as they are) is not supported: "
            f"tdfunc always encodes keys so that no key can leave the directory."
        )


def _check_num_threads(api: str, num_threads: Any) -> int:
    """``num_threads`` as an int >= 0 (any integer type), or a clear error."""
    # a bool is an int to Python, and num_threads=True is a mistake, not one thread
    try:
        count = None if type(num_threads) is bool else operator.index(num_threads)
    except TypeError:
        count = None
    if count is None:
        raise TypeError(
            f"{api}: num_threads must be an int (0: the calling thread), got "
            f"{type(num_threads).__name__} {num_threads!r}."
        )
    if count < 0:
        raise ValueError(f"{api}: num_threads must be >= 0 (0: the calling thread), got {count}.")
    return count


def memmap_collection(
    obj: Any,
    prefix=None,
    copy_existing: bool = False,
    *,
    api: str = "TensorDict.memmap",
    inplace: bool = False,
    like: bool = False,
    num_threads: int = 0,
    return_early: bool = False,
    share_non_tensor: bool = False,
    existsok: bool = True,
    robust_key: bool | None = True,
    fsync: bool = False,
) -> Any:
    """Save any tensor collection (TensorDict or TensorClass) as memory-mapped files.

    The class of ``obj`` (and of every nested collection) is recorded in
    ``meta.json``. See :meth:`PersistMixin.memmap` for the arguments.
    """
    _check_options(api, share_non_tensor, robust_key)
    num_threads = _check_num_threads(api, num_threads)
    if inplace:
        refuse_frozen_inside(obj, api.rpartition(".")[2])
    background = return_early and num_threads > 0
    with contextlib.nullcontext() if background else _gc_paused():
        return _persist_save.save(
            obj,
            prefix,
            api=api,
            inplace=inplace,
            like=like,
            copy_existing=copy_existing,
            num_threads=num_threads,
            return_early=return_early,
            existsok=existsok,
            fsync=fsync,
        )


def memmap_tensordict_layout(
    obj: Any, prefix, *, api: str, inplace: bool = False, like: bool = False, **options: Any
) -> Any:
    """Save ``obj`` in tensordict's layout; the saved container, locked (``obj`` itself,
    its leaves replaced, when ``inplace``). ``options`` are the other keywords of the
    call: those tensordict's layout cannot honour are refused, never ignored."""
    _check_num_threads(api, options.get("num_threads", 0))
    if prefix is None or (options.get("return_early") and options.get("num_threads")):
        raise ValueError(f"{api}: format='tensordict' needs a prefix and return_early=False.")
    _check_options(api, options.get("share_non_tensor", False), options.get("robust_key"))
    if options.get("existsok") is False and os.path.lexists(
        os.path.join(os.fspath(prefix), "meta.json")
    ):
        raise MemmapFileExistsError(
            f"{api}: {os.fspath(prefix)} already holds saved data (meta.json exists) and "
            f"existsok=False; pass existsok=True to replace it."
        )
    if inplace:
        refuse_frozen_inside(obj, api.rpartition(".")[2])
    directory = save_tensordict_layout(obj, prefix, api, like, options.get("fsync", False))
    with _gc_paused():
        loaded = read_tensordict_layout(directory, api)
    remember_path(loaded, directory)
    if not inplace:
        return loaded.lock_()
    locked = obj.is_locked
    if locked:
        obj.unlock_()
    _persist_load.load_into(obj, loaded)
    remember_path(obj, directory)
    return obj.lock_()


def _layout(api: str, format: Any) -> bool:
    """True for tensordict's layout; ``ValueError`` for an unknown format."""
    if format == "tensordict":
        return True
    if format != "tdfunc":
        raise ValueError(f"{api}: format must be 'tdfunc' or 'tensordict', got {format!r}.")
    return False


def subpath_directory(prefix, subpath: Any, api: str) -> str:
    """The directory of the nested container ``subpath`` (a nested key, or a
    ``"/"``-separated path of keys) saved under ``prefix``, found through each level's
    ``meta.json`` (key names are encoded on disk, so the path is not joined as it is)."""
    if isinstance(subpath, str):
        parts = tuple(part for part in subpath.split("/") if part)
    else:
        key = unravel_key(subpath)
        parts = key if isinstance(key, tuple) else (key,)
    directory = os.path.abspath(os.fspath(prefix))
    for depth, part in enumerate(parts):
        if is_tensordict_layout(directory):
            child = child_directory(directory, part, api)
            known = nested_container_keys(directory, api)
        else:
            entries = read_meta(directory, api)["entries"]
            entry = entries.get(part)
            name = entry.get("dir") if isinstance(entry, dict) else None
            child = None
            if is_valid_name(name):
                check_component(name, api, os.path.join(directory, "meta.json"))
                # a link is refused here as a full load refuses it: never followed
                with contextlib.suppress(FileNotFoundError):
                    child = enter_directory(directory, name, api)
            known = sorted(k for k, e in entries.items() if isinstance(e, dict) and "dir" in e)
        if child is None:
            raise KeyError(
                f"{api}: subpath {subpath!r}: no nested container {parts[: depth + 1]!r} in "
                f"{directory}; the nested containers at that level are {known}."
            )
        directory = child
    return directory


def load_collection(
    prefix,
    device=None,
    non_blocking: bool = False,
    *,
    out: Any = None,
    num_threads: int = 0,
    api: str = "TensorDict.load_memmap",
) -> Any:
    """Load what :func:`memmap_collection` saved; its recorded class is rebuilt.

    With ``out``, the data is moved into ``out`` (which is returned).
    """
    num_threads = _check_num_threads(api, num_threads)
    if out is not None:
        refuse_frozen_inside(out, api.rpartition(".")[2])
    if out is not None and device is None:
        device = out.device
    directory = os.path.abspath(os.fspath(prefix))
    if is_tensordict_layout(directory):  # written by tensordict: read its layout
        loaded = read_tensordict_layout(directory, api, device)
        if out is None:  # unlocked, as a load of tdfunc's layout (and tensordict's load)
            remember_path(loaded, directory)
            return loaded
    else:
        with _gc_paused():
            loaded = _persist_load.load(
                prefix, api=api, device=device, non_blocking=non_blocking, num_threads=num_threads
            )
    if out is not None and is_non_tensor(loaded):
        raise TypeError(
            f"{api}: {directory} holds a {type(loaded).__name__} saved on its own, not a "
            f"container; load it with TensorDict.load_memmap(prefix)."
        )
    if out is not None:
        locked = out.is_locked
        if locked:
            out.unlock_()
        _persist_load.load_into(out, loaded)
        remember_path(out, os.path.abspath(os.fspath(prefix)))
        if locked:
            out.lock_()
        return out
    return loaded


def memmap(data, prefix=None, copy_existing: bool = False, **kwargs: Any):
    """``data.memmap(prefix, copy_existing, **kwargs)``: the container (TensorDict or
    TensorClass) written to memory-mapped files, returned locked (tensordict's function).

    Example:
        >>> import tdfunc
        >>> saved = tdfunc.memmap(TensorDict({"a": torch.zeros(3)}, [3]))
        >>> type(saved["a"]).__name__, saved.is_locked
        ('MemoryMappedTensor', True)
    """
    if not is_tensor_collection_or_class(type(data)):
        raise TypeError(
            f"memmap: expected a TensorDict or a TensorClass instance, got {type(data).__name__}."
        )
    return data.memmap(prefix, copy_existing, **kwargs)


def _memmap_leaf_checked(leaf, prefix, *, api: str, num_threads: Any = 0, **options: Any):
    """``memmap_leaf`` with ``num_threads`` checked as ``TensorDict.memmap`` checks it (a
    leaf has no tensor to write in threads, but a bad count is still a mistake)."""
    _check_num_threads(api, num_threads)
    return memmap_leaf(leaf, prefix, api=api, **options)


class PersistMixin(MakeMemmapMixin, SchemaMixin):
    """Methods of ``TensorDict``: memmap, memmap_, memmap_like, load_memmap, save, load."""

    __slots__ = ()

    # what NonTensorData.memmap / memmap_ / load_memmap call: the core reaches the
    # persistence floor through the registered TensorDict class, never by an import
    _memmap_leaf = staticmethod(_memmap_leaf_checked)
    _load_leaf = staticmethod(load_leaf)

    # ------------------------------------------------------------------ saving
    def memmap(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> Self:
        """Write every tensor to a memory-mapped file and return a new, locked TensorDict.

        The directory ``prefix`` mirrors the structure: one file per tensor leaf,
        a sub-directory per nested TensorDict or TensorClass, and a ``meta.json``
        per level with the batch size, names, classes, dtypes, shapes and the
        non-tensor values. A TensorClass directory holds its class and non-tensor
        fields in its ``meta.json`` and its tensor fields in ``_tensordict/``.

        Saving again to the same ``prefix`` replaces the content atomically: data
        goes to new files, then ``meta.json`` is written to a new file and
        renamed into place, so a load (even after a crash, even in another
        process during the save) sees the old or the new data, never a mix. A
        save never writes into a file an earlier save committed: a process that
        loaded an earlier checkpoint keeps its values (reload, or call
        ``memmap_refresh_``, to see the new ones). Nothing tdfunc did not write
        is deleted or overwritten: a ``prefix`` holding other files is a
        ``FileExistsError`` naming them.

        Args:
            prefix: the directory to write. Defaults to a temporary location
                (removed when the process exits, no ``meta.json``).
            copy_existing: a leaf that is already a ``MemoryMappedTensor`` stored
                in ``prefix`` is kept as it is (no copy); one stored elsewhere is
                an error unless ``copy_existing=True``, so data is not duplicated
                on disk by mistake.
            num_threads: threads writing the files (``0``: the calling thread).
            return_early: with ``num_threads > 0``, return a
                ``concurrent.futures.Future`` of the result at once.
            share_non_tensor: not supported (``True`` raises).
            existsok: when ``False``, a ``prefix`` that already holds saved data
                is a ``FileExistsError``.
            robust_key: keys are always encoded into safe file names (``False``
                raises).
            fsync: also ``fsync`` files and directories, so that the save
                survives a power loss or kernel crash (slow on many small files).
                Without it the save survives a killed process.
            format: ``"tdfunc"`` (the default: the layout described above, with
                its atomic replacement) or ``"tensordict"``: tensordict's own layout,
                which tensordict's ``load_memmap`` reads (files named after the keys,
                percent-encoded as tensordict does; non-tensor values must be JSON
                values; keys named like its metadata, such as ``"shape"``, are
                refused; a process killed while the files are renamed into place can
                leave a mix). Both formats validate the whole container before
                writing anything, never follow a link below ``prefix`` and never
                overwrite a file they did not write. ``memmap_``, ``memmap_like``,
                ``save`` and ``dumps`` take it too; ``load_memmap`` reads both.

        Returns:
            A locked TensorDict of ``MemoryMappedTensor`` leaves on the CPU (or a
            ``Future`` of it). In-place writes to it reach the files.

        Example:
            >>> import tempfile
            >>> td = TensorDict({"a": torch.zeros(3), "b": {"c": torch.ones(3)}}, [3])
            >>> path = tempfile.mkdtemp()
            >>> saved = td.memmap(path)
            >>> type(saved["b", "c"]).__name__, saved.is_locked
            ('MemoryMappedTensor', True)
            >>> saved["a"][0] = 5.0
            >>> TensorDict.load_memmap(path)["a"].tolist()
            [5.0, 0.0, 0.0]
        """
        api = f"{type(self).__name__}.memmap"
        options = dict(
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            fsync=fsync,
        )
        if _layout(api, format):
            return memmap_tensordict_layout(self, prefix, api=api, **options)
        return memmap_collection(self, prefix, copy_existing, api=api, **options)

    def memmap_(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        existsok: bool = True,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> Self:
        """Like :meth:`memmap`, but replaces the leaves of this TensorDict (in place).

        Returns ``self``, locked (or a ``Future`` of it with ``return_early``).

        Example:
            >>> td = TensorDict({"a": torch.zeros(3)}, [3])
            >>> td.memmap_() is td, type(td["a"]).__name__
            (True, 'MemoryMappedTensor')
        """
        self._check_mutable("memmap_")  # type: ignore[attr-defined]
        api = f"{type(self).__name__}.memmap_"
        options = dict(
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            fsync=fsync,
        )
        if _layout(api, format):
            return memmap_tensordict_layout(self, prefix, api=api, inplace=True, **options)
        return memmap_collection(self, prefix, copy_existing, api=api, inplace=True, **options)

    def memmap_like(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        existsok: bool = True,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> Self:
        """A new memory-mapped TensorDict with the same shapes and dtypes, and no content.

        Files are allocated sparse (they read as zeros and take no disk space
        until written), so preallocating a large dataset from an expanded
        datum is instant. Arguments as in :meth:`memmap`.

        Example:
            >>> datum = TensorDict({"image": torch.zeros(3, 8, 8, dtype=torch.uint8)}, [])
            >>> data = datum.expand(1000).memmap_like()
            >>> data[10] = TensorDict({"image": torch.ones(3, 8, 8, dtype=torch.uint8)}, [])
            >>> int(data["image"].sum())
            192
        """
        api = f"{type(self).__name__}.memmap_like"
        options = dict(
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            existsok=existsok,
            robust_key=robust_key,
            fsync=fsync,
        )
        if _layout(api, format):
            return memmap_tensordict_layout(self, prefix, api=api, like=True, **options)
        return memmap_collection(self, prefix, copy_existing, api=api, like=True, **options)

    def save(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> Self:
        """Save to ``prefix``; the same as :meth:`memmap` (returns the saved TensorDict)."""
        api = f"{type(self).__name__}.save"
        options = dict(
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            robust_key=robust_key,
            fsync=fsync,
        )
        if _layout(api, format):
            return memmap_tensordict_layout(self, prefix, api=api, **options)
        return memmap_collection(self, prefix, copy_existing, api=api, **options)

    def dumps(
        self,
        prefix: str | os.PathLike | None = None,
        copy_existing: bool = False,
        *,
        num_threads: int = 0,
        return_early: bool = False,
        share_non_tensor: bool = False,
        robust_key: bool | None = True,
        fsync: bool = False,
        format: str = "tdfunc",
    ) -> Self:
        """Save to ``prefix``; the same as :meth:`memmap`."""
        api = f"{type(self).__name__}.dumps"
        options = dict(
            num_threads=num_threads,
            return_early=return_early,
            share_non_tensor=share_non_tensor,
            robust_key=robust_key,
            fsync=fsync,
        )
        if _layout(api, format):
            return memmap_tensordict_layout(self, prefix, api=api, **options)
        return memmap_collection(self, prefix, copy_existing, api=api, **options)

    # ------------------------------------------------------------------ loading
    @classmethod
    def load_memmap(
        cls,
        prefix: str | os.PathLike,
        device: torch.device | str | None = None,
        non_blocking: bool = False,
        *,
        out=None,
        robust_key: bool | None = True,
        subpath: Any = None,
        mode: str = "r",
        num_threads: int = 0,
        allow_pickle: bool | None = False,
    ):
        """Load a directory written by :meth:`memmap` (or any sub-directory of one).

        Tensor leaves are ``MemoryMappedTensor`` instances: nothing is read until
        it is used, and in-place writes reach the files. Nested TensorDicts and
        TensorClass instances come back with their classes (only classes known
        to tdfunc are built; nothing is unpickled).

        Args:
            prefix: the saved directory, or one of its sub-directories.
            device: move the leaves to this device. ``"meta"`` opens no data
                file and returns empty meta tensors (the structure and sizes);
                under ``FakeTensorMode`` the leaves are fake tensors.
            non_blocking: passed to ``Tensor.to`` when ``device`` is given.
            out: load into this TensorDict (see :meth:`load_memmap_`).
            robust_key: accepted for compatibility (``False`` raises).
            subpath: load only this nested container: a nested key (``("encoder",
                "layers")``) or a ``"/"``-separated path (``"encoder/layers"``).
            mode: ``"r"`` or ``"r+"``; a directory is always write-through, so both
                load the same (tensordict's single-file archives use it).
            num_threads: threads mapping the files and moving them to ``device``.
            allow_pickle: accepted for compatibility; tdfunc never unpickles, with
                either value (non-tensor values are JSON or tensors read with
                ``weights_only=True``).

        Raises:
            FileNotFoundError: ``prefix/meta.json`` is missing.
            ValueError: ``meta.json`` is corrupt or names an unknown class, or a
                data file is shorter (or longer) than its metadata says.

        Example:
            >>> import tempfile
            >>> td = TensorDict.fromkeys(["a", "b", ("nested", "e")], 0)
            >>> path = tempfile.mkdtemp()
            >>> _ = td.memmap(path)
            >>> (TensorDict.load_memmap(path) == td).all()
            True
            >>> TensorDict.load_memmap(path + "/nested")["e"]
            MemoryMappedTensor(0)
            >>> TensorDict.load_memmap(path, subpath="nested")["e"]
            MemoryMappedTensor(0)
            >>> TensorDict.load_memmap(path, device="meta")["a"].device
            device(type='meta')
        """
        api = f"{cls.__name__}.load_memmap"
        if allow_pickle is not None and type(allow_pickle) is not bool:
            raise TypeError(
                f"{api}: allow_pickle must be a bool or None, got {type(allow_pickle).__name__}."
            )
        _check_options(api, False, robust_key)
        if mode not in ("r", "r+"):
            raise ValueError(f"{api}: mode must be 'r' or 'r+', got {mode!r}.")
        if subpath is not None:
            prefix = subpath_directory(prefix, subpath, api)
        loaded = load_collection(
            prefix, device, non_blocking, out=out, num_threads=num_threads, api=api
        )
        if out is not None or is_non_tensor(loaded):  # a leaf saved on its own comes as itself
            return loaded
        return cls._adopt(loaded)  # type: ignore[attr-defined]

    @classmethod
    def load(cls, prefix: str | os.PathLike, *args, **kwargs):
        """Load from ``prefix``; the same as :meth:`load_memmap`."""
        return cls.load_memmap(prefix, *args, **kwargs)

    def load_memmap_(
        self, prefix: str | os.PathLike, robust_key: bool | None = True, *, num_threads: int = 0
    ) -> Self:
        """Replace the content of this TensorDict by the data saved in ``prefix``.

        Nested TensorDicts are reused (same objects); leaves are replaced by the
        loaded memory-mapped tensors; keys that are not saved are removed.
        Returns ``self`` (still locked if it was).

        Example:
            >>> import tempfile
            >>> path = tempfile.mkdtemp()
            >>> _ = TensorDict({"a": torch.ones(2)}, [2]).memmap(path)
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2])
            >>> sorted(td.load_memmap_(path).keys()), td["a"].tolist()
            (['a'], [1.0, 1.0])
        """
        api = f"{type(self).__name__}.load_memmap_"
        self._check_mutable("load_memmap_")  # type: ignore[attr-defined]
        _check_options(api, False, robust_key)
        return load_collection(prefix, out=self, num_threads=num_threads, api=api)

    def load_(self, prefix: str | os.PathLike, *args, **kwargs) -> Self:
        """Load from ``prefix`` into this TensorDict; the same as :meth:`load_memmap_`."""
        return self.load_memmap_(prefix, *args, **kwargs)

    def memmap_refresh_(self) -> Self:
        """Reload the content from :attr:`saved_path` (after another process saved there).

        Raises:
            RuntimeError: this TensorDict was not saved or loaded from a directory.

        Example:
            >>> import tempfile
            >>> path = tempfile.mkdtemp()
            >>> td = TensorDict({"a": torch.zeros(2)}, [2]).memmap(path)
            >>> _ = TensorDict({"a": torch.ones(2), "b": torch.ones(2)}, [2]).memmap(path)
            >>> sorted(td.memmap_refresh_().keys()), td["a"].tolist()
            (['a', 'b'], [1.0, 1.0])
        """
        name = type(self).__name__
        self._check_mutable("memmap_refresh_")  # type: ignore[attr-defined]
        path = self.saved_path
        if path is None:
            raise RuntimeError(
                f"{name}.memmap_refresh_: this {name} has no saved path; only a "
                f"{name} returned by memmap/memmap_/memmap_like(prefix) or load_memmap "
                "can be refreshed."
            )
        return load_collection(path, out=self, api=f"{name}.memmap_refresh_")

    # ------------------------------------------------------------------ state
    @property
    def saved_path(self) -> str | None:
        """The directory this container was saved to or loaded from, else ``None``."""
        path = saved_path_of(self)
        if path is None:
            view = self._to_tensordict_view()  # type: ignore[attr-defined]
            if view is not self:  # a TensorClass: its inner TensorDict may have been saved
                path = saved_path_of(view)
        return path

    def is_memmap(self) -> bool:
        """True when every tensor leaf is a ``MemoryMappedTensor`` (and there is one).

        A container without tensors is memory-mapped when it was saved, or when all
        its non-tensor leaves were written to files by ``memmap``.
        """
        values = [v for _, v in self._iter_items((), True, True)]  # type: ignore[attr-defined]
        leaves = [v for v in values if isinstance(v, torch.Tensor)]
        if not leaves:
            if self.saved_path is not None:
                return True
            marks = [getattr(v, "_is_memmap", False) for v in values if is_non_tensor(v)]
            return bool(marks) and all(marks)
        return all(_is_mapped(v) for v in leaves)

    @property
    def _is_memmap(self) -> bool:
        """tensordict's attribute for :meth:`is_memmap`."""
        return self.is_memmap()
