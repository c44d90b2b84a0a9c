"""Writing tensordict's memory-mapped layout (``memmap(..., format="tensordict")``).

The layout itself is described in :mod:`tdfunc._persist.tensordict_read`. A save runs
as tdfunc's own does (:mod:`tdfunc._persist.save`): validate, then write, then commit.

1. *plan* (nothing written): walk the whole tree, refuse what tensordict's layout
   cannot hold (keys named like its metadata, keys whose file names collide, nested
   tensors, values JSON cannot hold) and check every directory on the way through
   :mod:`tdfunc._persist.confine`: it is new, empty, or holds a checkpoint in this
   layout, and every name the save will replace is one that checkpoint used (a
   user's file, a link or a directory in the way is a ``FileExistsError``).
2. *write*: new directories, then every data file under a temporary name
   (``O_EXCL``). A failure here removes them: the old checkpoint is untouched.
3. *commit*: temporary files renamed over their names, then each level's
   ``meta.json`` (a new file renamed into place), sub-directories first.

tensordict's layout names files after keys, so a save replaces files in place of
the previous ones; unlike tdfunc's layout, a process killed during the renames of
step 3 can leave a mix of the two generations. Files an earlier checkpoint used and
this one does not are left where they are (tensordict ignores them).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
from typing import Any

import torch

from .._core.helpers.hooks import HOOKS
from .._core.helpers.mixin import is_tensor_collection
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .confine import check_data_file, create_new, lstat_or_none, root_directory, write_new
from .filenames import tensordict_legacy_name, tensordict_name
from .files import allocate_file, check_has_data, nbytes_of, write_file
from .format import (
    DTYPES,
    MAX_META_BYTES,
    META,
    TENSORDICT_DIR,
    fsync_directory,
    parse_json,
    read_regular,
)

# what tensordict records next to the entries of a level's meta.json: a key of that
# name would be read as (or overwritten by) the level's own metadata
RESERVED = frozenset(
    {"shape", "device", "_type", "_format_version", "_class", "_names", "_metadata"}
)
_SHOWN = 5


def type_of(value: Any) -> str:
    if getattr(type(value), "_is_tensordict", False):
        return "<class 'tensordict._td.TensorDict'>"
    return f"<class '{type(value).__module__}.{type(value).__qualname__}'>"


def _show(path: tuple) -> str:
    return repr(path[0] if len(path) == 1 else path)


def referenced_names(node: Any) -> set[str]:
    """The names an existing tensordict-layout ``meta.json`` uses in its directory."""
    names: set[str] = set()
    if type(node) is not dict:
        return names
    if "shape" not in node and isinstance(node.get("_type"), str):  # a tensorclass or leaf
        names.add(TENSORDICT_DIR)
    for key, entry in node.items():
        if key in RESERVED or type(entry) is not dict or type(key) is not str:
            continue
        suffix = ".memmap" if "dtype" in entry else ""
        for name in (tensordict_name(key), tensordict_legacy_name(key)):
            if name is not None:
                names.add(name + suffix)
    return names


_MAX_DEPTH = 100
_TEMPORARY = re.compile(r"\.(?:meta\.json\.)?[0-9a-f]{16}\.tmp")


def _interrupted(path: str, depth: int = 0) -> bool:
    """A temporary file of this writer, or a real directory holding only such things."""
    if _TEMPORARY.fullmatch(os.path.basename(path)):
        return True
    st = lstat_or_none(path)
    if st is None or not stat.S_ISDIR(st.st_mode) or depth > _MAX_DEPTH:
        return False
    return all(_interrupted(os.path.join(path, n), depth + 1) for n in os.listdir(path))


def _old_meta(directory: str, api: str) -> dict | None:
    """The tensordict-layout ``meta.json`` of ``directory``, ``None`` if there is none;
    ``FileExistsError`` for any other ``meta.json`` (the user's, or tdfunc's layout)."""
    path = os.path.join(directory, META)
    if lstat_or_none(path) is None:
        return None
    try:
        node = parse_json(read_regular(path, api, "metadata", MAX_META_BYTES), path, api)
    except (OSError, ValueError) as error:
        node, problem = None, str(error)
    else:
        problem = "it is not tensordict's layout"
    if type(node) is dict and isinstance(node.get("_type"), str) and "entries" not in node:
        return node
    raise FileExistsError(
        f"{api}: {path} is not a meta.json of tensordict's layout ({problem}); tdfunc never "
        f"replaces a file it did not write in that layout. Choose a new or empty directory "
        f"(a checkpoint in tdfunc's layout is replaced by saving with the default format)."
    )


class _Level:
    __slots__ = ("directory", "exists", "files", "node", "subdirs")

    def __init__(self, directory: str, exists: bool) -> None:
        self.directory = directory
        self.exists = exists
        self.node: dict = {}
        self.files: list[tuple[str, Any]] = []  # (name, tensor): data files of this level
        self.subdirs: list[str] = []


class TensordictSave:
    """One save in tensordict's layout: :meth:`plan`, then :meth:`write_and_commit`."""

    def __init__(self, api: str, like: bool = False, fsync: bool = False) -> None:
        self.api = api
        self.like = like
        self.fsync = fsync
        self.levels: list[_Level] = []  # post-order: children before parents
        self.made: list[str] = []
        self.temps: list[tuple[str, str]] = []  # (temporary path, final path)

    # ------------------------------------------------------------------ plan
    def _level(self, directory: str, at: tuple, allowed: bool) -> tuple[_Level, set[str]]:
        """A level in ``directory``; the names in it this save may replace.

        ``allowed``: the parent's checkpoint used this directory (so it is ours).
        """
        where = f" (key {_show(at)})" if at else ""
        st = lstat_or_none(directory)
        if st is None:
            return _Level(directory, False), set()
        if stat.S_ISLNK(st.st_mode) and at:
            raise FileExistsError(
                f"{self.api}: refusing to write through the symbolic link {directory}{where}; "
                f"a save never leaves its directory. Remove the link or choose another prefix."
            )
        if not os.path.isdir(directory):
            raise FileExistsError(
                f"{self.api}: {directory}{where} exists and is not a directory; tdfunc never "
                f"replaces a file it did not write. Remove it or choose another prefix."
            )
        names = set(os.listdir(directory))
        # what a save killed before its commit left: its temporary files, and directories
        # holding nothing else; they are the save's to reuse, never the user's
        leftovers = {n for n in names if _interrupted(os.path.join(directory, n))}
        names -= leftovers
        old = _old_meta(directory, self.api) if META in names else None
        if names and old is None and not (allowed and names <= {TENSORDICT_DIR}):
            shown = ", ".join(sorted(names)[:_SHOWN]) + (", ..." if len(names) > _SHOWN else "")
            raise FileExistsError(
                f"{self.api}: {directory}{where} already holds files that no checkpoint there "
                f"uses ({shown}); tdfunc never deletes or overwrites files it did not write. "
                f"Choose a new or empty directory, or move these files away."
            )
        replaceable = referenced_names(old) | {META}
        return _Level(directory, True), {n for n in names if n in replaceable} | leftovers

    def _claim(self, level: _Level, name: str, ours: set[str], at: tuple, is_dir: bool) -> None:
        """Check that the save may write ``name`` in ``level``'s directory."""
        if not level.exists:
            return
        path = os.path.join(level.directory, name)
        st = lstat_or_none(path)
        if st is None:
            return
        kind_ok = stat.S_ISDIR(st.st_mode) if is_dir else stat.S_ISREG(st.st_mode)
        if name in ours and kind_ok and not stat.S_ISLNK(st.st_mode):
            return
        what = (
            "a symbolic link"
            if stat.S_ISLNK(st.st_mode)
            else "a file the checkpoint there does not use"
        )
        raise FileExistsError(
            f"{self.api}: {path} (key {_show(at)}) is {what}; tdfunc never writes through a "
            f"link or over a file it did not write. Remove it or choose another directory."
        )

    def plan(self, obj: Any, directory: str, at: tuple = (), allowed: bool = False) -> None:
        level, ours = self._level(directory, at, allowed)
        view = obj._to_tensordict_view()
        if view is not obj:  # a TensorClass: its class here, its fields in _tensordict/
            self._claim(level, TENSORDICT_DIR, ours, at, True)
            level.subdirs.append(TENSORDICT_DIR)
            self.plan(view, os.path.join(directory, TENSORDICT_DIR), at, TENSORDICT_DIR in ours)
            level.node = {"_type": type_of(obj)}
            self.levels.append(level)
            return
        node = level.node
        taken: dict[str, Any] = {META: None}
        for key, value in view._data.items():
            path = at + (key,)
            self._check_key(key, path)
            name = tensordict_name(key)
            file = name + ".memmap" if isinstance(value, torch.Tensor) else name
            if file in taken:
                raise ValueError(
                    f"{self.api}: keys {taken[file]!r} and {key!r} would both be stored as "
                    f"{os.path.join(directory, file)} in tensordict's layout; rename one of "
                    f"them (tdfunc's own layout, the default, stores both)."
                )
            taken[file] = key
            if isinstance(value, torch.Tensor):
                node[key] = self._plan_tensor(level, file, value, ours, path)
            elif isinstance(value, NonTensorData):
                self._claim(level, name, ours, path, True)
                self.plan_leaf(value, os.path.join(directory, name), path, name in ours)
                level.subdirs.append(name)
                node[key] = {"type": leaf_kind(value)}
            elif is_tensor_collection(value):
                self._claim(level, name, ours, path, True)
                self.plan(value, os.path.join(directory, name), path, name in ours)
                level.subdirs.append(name)
                node[key] = {"type": type(value).__name__}
            else:
                raise TypeError(
                    f"{self.api}: cannot save the value at key {_show(path)} (a "
                    f"{type(value).__name__}); expected a tensor, a tensor collection or "
                    f"NonTensorData."
                )
        node["shape"] = list(view._batch_size)
        node["device"] = "cpu"  # memory-mapped leaves live on the CPU (tensordict writes it)
        node["_type"] = type_of(view)
        node["_format_version"] = 1
        node["_class"] = "tensordict:TensorDict"
        if view._names is not None:
            node["_names"] = list(view._names)
        self.levels.append(level)

    def _check_key(self, key: Any, path: tuple) -> None:
        if type(key) is not str:
            raise TypeError(f"{self.api}: key {_show(path)} is not a str.")
        if key in RESERVED:
            raise ValueError(
                f"{self.api}: cannot save key {_show(path)} in tensordict's layout: its "
                f"meta.json stores the level's own {key!r} under that name, so the entry "
                f"would be lost (tensordict loses it too). Rename the key, or save with "
                f"tdfunc's own layout (the default), which keeps it."
            )

    def _plan_tensor(self, level: _Level, file: str, value, ours: set[str], path) -> dict:
        if value.is_nested:
            raise TypeError(
                f"{self.api}: the nested tensor at key {_show(path)} cannot be written in "
                f"tensordict's layout; save with tdfunc's own format (the default), or "
                f"pad it first (t.to_padded_tensor(0.0))."
            )
        if value.layout is not torch.strided or value.is_quantized:
            raise TypeError(
                f"{self.api}: cannot save key {_show(path)}: only dense (strided, "
                f"non-quantized) tensors can be memory-mapped, got layout {value.layout}."
            )
        if value.dtype not in DTYPES.values():
            raise TypeError(
                f"{self.api}: cannot save key {_show(path)}: dtype {value.dtype} has no "
                f"memory-mapped file format."
            )
        if not self.like:
            check_has_data(value, f"{self.api}: cannot save key {_show(path)}")
        self._claim(level, file, ours, path, False)
        level.files.append((file, value))
        return {
            "device": "cpu",  # where the memory-mapped copy lives
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "is_nested": False,
        }

    def plan_leaf(
        self, leaf: NonTensorData, directory: str, at: tuple = (), allowed: bool = False
    ) -> None:
        """A non-tensor leaf in its own directory (inside a container, or on its own)."""
        level, ours = self._level(directory, at, allowed)
        node = leaf_node(leaf, at[-1] if at else "data", self.api)
        if not at:  # saved on its own: its batch size cannot be read from its values
            if type(leaf) is NonTensorStack:
                node["batch_size"] = list(leaf.batch_size)
            else:
                self._claim(level, TENSORDICT_DIR, ours, at, True)
                empty = HOOKS.tensordict._new_unsafe({}, leaf.batch_size, None, None)
                level.subdirs.append(TENSORDICT_DIR)
                self.plan(
                    empty, os.path.join(directory, TENSORDICT_DIR), at, TENSORDICT_DIR in ours
                )
        level.node = node
        self.levels.append(level)

    # ------------------------------------------------------------------ write and commit
    def write_and_commit(self) -> None:
        try:
            self._write()
        except BaseException:
            self._discard()
            raise
        for temporary, final in self.temps:
            os.replace(temporary, final)
        for level in self.levels:  # post-order: the top level last
            write_meta(level.directory, level.node, self.fsync)
        if self.fsync and self.made:
            fsync_directory(os.path.dirname(self.levels[-1].directory))

    def _write(self) -> None:
        for level in reversed(self.levels):  # pre-order: parents before children
            if not level.exists:
                try:
                    os.mkdir(level.directory)
                except FileNotFoundError:
                    if level is not self.levels[-1]:
                        raise
                    root_directory(level.directory, self.api, create=True)
                self.made.append(level.directory)
        for level in self.levels:
            for name, value in level.files:
                final = os.path.join(level.directory, name)
                temporary = os.path.join(level.directory, f".{secrets.token_hex(8)}.tmp")
                fd = create_new(temporary)
                self.temps.append((temporary, final))
                try:
                    if self.like:
                        allocate_file(fd, nbytes_of(value.shape, value.dtype))
                    else:
                        write_file(fd, temporary, value)
                    if self.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)

    def _discard(self) -> None:
        for temporary, _ in self.temps:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        for directory in reversed(self.made):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def write_meta(directory: str, node: dict, fsync: bool = False) -> None:
    """``directory/meta.json`` replaced whole: a new file, then renamed over the name
    (with ``fsync``, the new names of the directory too)."""
    temporary = os.path.join(directory, f".{META}.{secrets.token_hex(8)}.tmp")
    write_new(temporary, json.dumps(node).encode(), fsync)
    try:
        os.replace(temporary, os.path.join(directory, META))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    if fsync:
        fsync_directory(directory)


def check_json(value: Any, key: Any, api: str) -> None:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        raise TypeError(
            f"{api}: the non-tensor value at key {key!r} ({type(value).__name__}) cannot be "
            "written as JSON; tensordict's layout would need pickle, which tdfunc does not write."
        ) from None


def leaf_kind(leaf: NonTensorData) -> str:
    return "NonTensorStack" if type(leaf) is NonTensorStack else "NonTensorData"


def leaf_node(leaf: NonTensorData, key: Any, api: str) -> dict:
    """The ``meta.json`` of a non-tensor leaf."""
    device = None if leaf.device is None else str(leaf.device)
    return leaf_node_of(type(leaf) is NonTensorStack, leaf._value(), device, key, api)


def leaf_node_of(stack: bool, value: Any, device: str | None, key: Any, api: str) -> dict:
    check_json(value, key, api)
    kind = "NonTensorStack" if stack else "NonTensorData"
    node: dict = {"_type": f"<class 'tensordict.tensorclass.{kind}'>"}
    if stack:
        node.update({"stack_dim": 0, "device": device, "data": value})
    else:
        node.update({"data": value, "_metadata": None, "_is_non_tensor": True})
    return node


def save_tensordict_layout(
    obj: Any, prefix, api: str, like: bool = False, fsync: bool = False
) -> str:
    """Save a container or a non-tensor leaf in tensordict's layout; its directory."""
    directory = os.path.abspath(os.fspath(prefix))
    work = TensordictSave(api, like, fsync)
    if isinstance(obj, NonTensorData):
        work.plan_leaf(obj, directory)
    else:
        work.plan(obj, directory)
    work.write_and_commit()
    return directory


def rewrite_leaf(directory: str, stamp: list, api: str, value: Any, stack=None) -> None:
    """Write a loaded leaf's new value into its ``meta.json`` (tensordict's layout).

    ``stamp`` identifies the ``meta.json`` the leaf was loaded from: once another save
    replaced it, the entry belongs to that save and is not written.
    """
    path = os.path.join(directory, META)
    try:
        st = check_data_file(path, api, "metadata")
    except FileNotFoundError:
        st = None
    if st is None or (st.st_ino, st.st_mtime_ns, st.st_size) != tuple(stamp[0]):
        raise RuntimeError(
            f"{api}: {path} was saved again since this leaf was loaded; the new value is kept "
            f"in memory only (a checkpoint is never a mix of two saves). Load the directory "
            f"again and write to that."
        )
    node = parse_json(read_regular(path, api, "metadata", MAX_META_BYTES), path, api)
    node = node if type(node) is dict else {}
    if stack is None:
        stack = "NonTensorStack" in str(node.get("_type", ""))
    device = node.get("device") if isinstance(node.get("device"), str) else None
    new = leaf_node_of(bool(stack), value, device, "data", api)
    write_meta(directory, new)
    done = os.lstat(path)
    stamp[0] = (done.st_ino, done.st_mtime_ns, done.st_size)
