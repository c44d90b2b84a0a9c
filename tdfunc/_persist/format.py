"""The on-disk format of a saved TensorDict: ``meta.json``, data-file names, checks.

A saved TensorDict is a directory per container (nested TensorDicts and
TensorClass instances are sub-directories) holding one file per tensor leaf and
a ``meta.json`` (format version 2)::

    {"format": "tdfunc.memmap", "version": 2,
     "class": "tdfunc.TensorDict",
     "batch_size": [10], "names": null, "device": "cpu",
     "entries": {
       "a": {"kind": "tensor", "file": "a.memmap", "dtype": "float32", "shape": [10]},
       "n": {"kind": "nested", "file": "n.memmap", "dtype": "float32",
             "layout": "jagged", "sizes": [[3, 2], [5, 2], ...]},
       "b": {"kind": "collection", "dir": "b", "meta": {...b/meta.json...}},
       "s": {"kind": "non_tensor", "batch_size": [10], "stack": false, "value": "text"},
       "o": {"kind": "non_tensor", "batch_size": [10], "stack": false, "file": "o.pt"}}}

A nested tensor's file holds its components back to back (see ``nested.py``); a
batch size may hold -1 at a ragged dim (never the first). A reader that predates these
refuses the entry by its unknown kind.

A level with many small tensors (``PACK_MIN_LEAVES`` of at most ``PACK_LEAF_BYTES``
each, in :mod:`tdfunc._persist.save`) stores them in one data file, each at an
``"offset"`` (bytes, a multiple of ``PACK_ALIGN``) given in its entry; such a level
records version 3 (version 2 readers refuse it). One file instead of one per leaf:
a save creates, writes and maps one file, a load maps it once.

A TensorClass instance is two levels, as in the documented layout
(``tc/meta.json`` and ``tc/_tensordict/{data.memmap, meta.json}``): its own
``meta.json`` records the class, its non-tensor fields (``entries``, all of
kind ``non_tensor``), the order of all its fields (``keys``) and, under
``tensordict``, the plain TensorDict of its tensor and collection fields saved
in the sub-directory ``_tensordict``::

    {"format": "tdfunc.memmap", "version": 2, "class": "my_module.MyClass",
     "batch_size": [], "names": null, "device": "cpu",
     "entries": {"metadata": {"kind": "non_tensor", ..., "value": "some text"}},
     "keys": ["data", "metadata"],
     "tensordict": {"dir": "_tensordict", "meta": {...tc/_tensordict/meta.json...}}}

An optional ``"stale"`` list names the files and sub-directories (plain names
such as ``a.memmap``) of the generation a save replaced, removed after its
commit: should the process die before removing them, the next save still knows
they are tdfunc's and removes them.

Version 1 (still read) saved a TensorClass flat, like a TensorDict: its tensors
next to its ``meta.json``.

Keys are the real keys; file and directory names come from
:func:`tdfunc._persist.filenames.encode_key`. A nested entry embeds the sub-directory's
metadata, so loading from the top reads one ``meta.json`` and sees one
consistent snapshot, while the sub-directory's own ``meta.json`` allows loading
it alone. Non-tensor values that JSON holds exactly are stored inline; others
with ``torch.save`` in a ``.pt`` file, read back with ``weights_only=True``.

``meta.json`` is untrusted input: :func:`read_meta` validates every field
before the loader uses it (names cannot leave the directory, dtypes come from a
fixed table, classes are looked up in :mod:`tdfunc._core.helpers.class_names` only).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import stat
from typing import Any

import torch

from .._core.helpers.nontensor.values import MAX_DEPTH
from .filenames import NAME
from .nested import LAYOUTS, nested_numel

FORMAT = "tdfunc.memmap"
VERSION = 2
# a level whose small tensors share one data file (entries with an "offset") says so:
# a reader that predates packed files refuses it by its version, never misreads it
PACKED_VERSION = 3
PACK_ALIGN = 64  # every packed tensor starts at a multiple of this many bytes
META = "meta.json"
# the sub-directory of a TensorClass that holds its TensorDict (tensor and collection fields)
TENSORDICT_DIR = "_tensordict"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)

_DTYPE_NAMES = [
    *("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"),
    *("float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128"),
    *("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"),
]
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name)
    for name in _DTYPE_NAMES
    if isinstance(getattr(torch, name, None), torch.dtype)
}
_DTYPE_NAME = {dtype: name for name, dtype in DTYPES.items()}

_STEM = f"(?:{NAME.pattern})"
TENSOR_FILE = re.compile(rf"{_STEM}(?:\.[0-9a-f]{{8}})?\.memmap")
OBJECT_FILE = re.compile(rf"{_STEM}(?:\.[0-9a-f]{{8}})?\.pt")
# a meta.json being written, the previous meta.json kept until cleanup, a stale directory
META_TMP = re.compile(r"meta\.json\.[0-9a-f]{16}\.(?:tmp|old)")
TRASH = re.compile(r"trash\.[0-9a-f]{16}\.tmp")


def dtype_name(dtype: torch.dtype, key: str, api: str) -> str:
    try:
        return _DTYPE_NAME[dtype]
    except KeyError:
        raise TypeError(
            f"{api}: cannot save key {key!r}: dtype {dtype} has no memory-mapped file format."
        ) from None


def data_file(stem: str, token: str | None, suffix: str) -> str:
    """``<stem>.memmap`` or, when that name is taken, ``<stem>.<token>.memmap``."""
    return f"{stem}.{suffix}" if token is None else f"{stem}.{token}.{suffix}"


def new_token() -> str:
    return secrets.token_hex(4)


# ---------------------------------------------------------------------------- non-tensor values
def encode_object(value: Any, key: str, api: str) -> bytes:
    """``torch.save`` bytes for ``value``, checked to load back with ``weights_only=True``."""
    buffer = io.BytesIO()
    try:
        torch.save(value, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    except Exception as error:
        raise TypeError(
            f"{api}: cannot save the non-tensor value at key {key!r} (a "
            f"{type(value).__name__}): loading never unpickles, so a value must be JSON "
            f"(None, bool, int, float, str, lists, dicts with str keys) or something "
            f"torch.load(weights_only=True) accepts (tensors, tuples, sets, bytes, ...). "
            f"Hint: convert it, or allow its type with torch.serialization.add_safe_globals. "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
        ) from None
    return buffer.getvalue()


def decode_object(path: str, api: str) -> Any:
    """The non-tensor value in ``path`` (a regular file, read with ``weights_only=True``)."""
    raw = read_regular(path, api, "a non-tensor value", MAX_OBJECT_BYTES)
    try:
        return torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except Exception as error:
        raise ValueError(
            f"{api}: cannot read the non-tensor value in {path} with "
            f"torch.load(weights_only=True): {str(error).splitlines()[0] if str(error) else error}"
        ) from None


# ---------------------------------------------------------------------------- reading files
# meta.json embeds the whole tree; no real checkpoint comes near this (a million leaves
# take about 150 MB), and a cap keeps a hostile file (a link to /dev/zero) bounded.
MAX_META_BYTES = 1 << 30
MAX_OBJECT_BYTES = 1 << 30
# Containers nested deeper than this are refused, on save and load: the code that walks
# them recurses, and a hostile meta.json must end in a ValueError, not a RecursionError.
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO opens at once (and is then refused)
    | getattr(os, "O_NOFOLLOW", 0)  # a symbolic link is refused, never followed
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def open_regular(path: str, api: str, what: str) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` if it is a regular file (never a link, FIFO or device).

    Raises ``FileNotFoundError`` when it is missing and ``ValueError`` otherwise.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as error:  # ELOOP: a symbolic link; ENXIO: a socket
        if os.path.islink(path):
            raise ValueError(
                f"{api}: {path} is a symbolic link; refusing to follow it ({what} must be a "
                f"regular file inside the saved directory)."
            ) from None
        raise ValueError(f"{api}: cannot open {path} ({what}): {error.strerror}.") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(
            f"{api}: {path} is not a regular file (a directory, FIFO, socket or device); "
            f"refusing to read it as {what}."
        )
    return fd, st


def read_fd(fd: int, st: os.stat_result, path: str, api: str, what: str, cap: int) -> bytes:
    """Read a whole regular file of at most ``cap`` bytes (bounded even if it grows)."""
    if st.st_size > cap:
        raise ValueError(
            f"{api}: {path} holds {st.st_size} bytes, more than the {cap} bytes {what} can "
            f"take; it is not a file tdfunc wrote."
        )
    chunks = []
    total = 0
    while True:
        chunk = os.read(fd, min(cap + 1 - total, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            raise ValueError(f"{api}: {path} grew past {cap} bytes while it was read.")
    return b"".join(chunks)


def read_regular(path: str, api: str, what: str, cap: int) -> bytes:
    fd, st = open_regular(path, api, what)
    try:
        return read_fd(fd, st, path, api, what, cap)
    finally:
        os.close(fd)


def parse_json(raw: bytes, path: str, api: str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(
            f"{api}: {path} is corrupt: its JSON is nested too deeply to be metadata tdfunc wrote."
        ) from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{api}: {path} is corrupt: not valid JSON ({error}).") from None


# ---------------------------------------------------------------------------- meta.json
def write_meta(directory: str, node: dict, fsync: bool) -> None:
    """Commit ``node`` as ``directory/meta.json``: a new file, fully written, then renamed.

    The commit is always the rename of a file this call created (``O_EXCL``):
    whatever an earlier crash left in the directory, the committed ``meta.json``
    is never written in place.
    """
    text = json.dumps(node, ensure_ascii=True).encode("ascii")
    work = os.path.join(directory, f"{META}.{secrets.token_hex(8)}.tmp")
    fd = os.open(work, _CREATE, 0o644)
    try:
        try:
            _write_fd(fd, text, fsync)
        finally:
            os.close(fd)
        os.replace(work, os.path.join(directory, META))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(work)
        raise
    if fsync:
        fsync_directory(directory)


def _write_fd(fd: int, data: bytes, fsync: bool) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    if fsync:
        os.fsync(fd)


def fsync_directory(directory: str) -> None:
    if os.name != "posix":  # directories cannot be opened for fsync elsewhere
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_meta(directory: str, api: str) -> tuple[dict, int]:
    """The validated ``meta.json`` of ``directory`` and an open descriptor of it.

    The caller keeps the descriptor open while it reads the data files: the
    file then cannot be freed and its inode reused, so ``same_meta`` tells for
    sure whether ``meta.json`` was replaced meanwhile.
    """
    path = os.path.join(directory, META)
    try:
        fd, st = open_regular(path, api, "metadata")
    except FileNotFoundError:
        hint = "" if os.path.isdir(directory) else f" (the directory {directory} does not exist)"
        raise FileNotFoundError(
            f"{api}: {path} not found{hint}: {directory} does not hold data saved with "
            f"memmap/memmap_/memmap_like/save."
        ) from None
    try:
        node = parse_json(read_fd(fd, st, path, api, "metadata", MAX_META_BYTES), path, api)
        validate(node, path, api)
    except BaseException:
        os.close(fd)
        raise
    return node, fd


def same_meta(directory: str, fd: int) -> bool:
    """True while ``directory/meta.json`` is still the file open as ``fd``."""
    try:
        now = os.stat(os.path.join(directory, META), follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def read_meta(directory: str, api: str) -> dict:
    """The validated ``meta.json`` of ``directory``."""
    node, fd = open_meta(directory, api)
    os.close(fd)
    return node


_INT64 = 1 << 63


def _shape(value: Any) -> bool:
    """A list of sizes whose product (zero sizes aside) torch can hold."""
    if type(value) is not list or not all(type(s) is int and 0 <= s < _INT64 for s in value):
        return False
    total = 1
    for size in value:
        total *= size or 1
    return total < _INT64


def _batch(value: Any) -> bool:
    """A batch size: sizes, with -1 at ragged dims (never the first, which counts)."""
    if type(value) is not list or (value and value[0] == -1):
        return False
    return _shape([1 if s == -1 else s for s in value])


def _prefix(shape: list, batch: list) -> bool:
    """``shape`` starts with ``batch``; a ragged batch dim (-1) takes any length (the
    components of a jagged tensor may happen to agree)."""
    return len(shape) >= len(batch) and all(b in (s, -1) for s, b in zip(shape, batch))


def _nested_shape(sizes: list) -> list:
    """The shape of a nested tensor of components ``sizes``: -1 where they differ."""
    return [len(sizes)] + [d[0] if len(set(d)) == 1 else -1 for d in zip(*sizes)]


def validate(
    node: Any, path: str, api: str, parent_batch: list | None = None, at=(), depth: int = 0
) -> None:
    """Check every field of a metadata node (recursively); ``ValueError`` naming the file."""

    def bad(message: str) -> None:
        where = f" at key {at if len(at) > 1 else at[0]!r}" if at else ""
        raise ValueError(f"{api}: {path} is corrupt{where}: {message}.")

    if depth > MAX_DEPTH:
        bad(f"containers are nested more than {MAX_DEPTH} levels deep")

    if type(node) is not dict:
        bad(f"expected a JSON object, got {type(node).__name__}")
    if node.get("format") != FORMAT:
        bad(f"'format' is {node.get('format')!r}, expected {FORMAT!r}")
    version = node.get("version")
    if type(version) is not int or version < 1:
        bad(f"'version' is {version!r}, expected a positive integer")
    if version > PACKED_VERSION:
        raise ValueError(
            f"{api}: {path} uses format version {version}; this tdfunc reads versions up to "
            f"{PACKED_VERSION}. Upgrade tdfunc to load it."
        )
    if type(node.get("class")) is not str:
        bad("'class' must be a string")
    batch = node.get("batch_size")
    if not _batch(batch):
        bad(f"'batch_size' is {batch!r}, expected a list of non-negative integers (or -1)")
    if parent_batch is not None and batch[: len(parent_batch)] != parent_batch:
        bad(f"batch size {batch} does not start with the parent's {parent_batch}")
    names = node.get("names")
    if names is not None and (
        type(names) is not list
        or len(names) != len(batch)
        or not all(n is None or type(n) is str for n in names)
    ):
        bad(f"'names' is {names!r}, expected null or {len(batch)} strings or nulls")
    if names is not None:
        given = [n for n in names if n is not None]
        if len(set(given)) != len(given):
            bad(f"'names' {names!r} repeats a dimension name")
    if node.get("device") is not None and type(node.get("device")) is not str:
        bad("'device' must be a string or null")
    entries = node.get("entries")
    if type(entries) is not dict:
        bad("'entries' must be a JSON object")
    for key, entry in entries.items():
        _validate_entry(key, entry, batch, path, api, at + (key,), bad, depth)
    if "tensordict" in node:
        _validate_tensorclass(node, batch, path, api, at, bad, depth)


def _validate_tensorclass(node: dict, batch: list, path, api, at, bad, depth: int) -> None:
    """The fields of a TensorClass node (format version 2): ``tensordict`` and ``keys``."""
    inner = node["tensordict"]
    if type(inner) is not dict or inner.get("dir") != TENSORDICT_DIR:
        bad(f"'tensordict' must be an object with 'dir': {TENSORDICT_DIR!r}")
    meta = inner.get("meta")
    if type(meta) is dict and "tensordict" in meta:
        bad("the TensorDict of a TensorClass cannot be a TensorClass")
    validate(meta, path, api, batch, at, depth + 1)
    if meta["batch_size"] != batch:
        bad(f"the TensorClass's batch size {batch} differs from its TensorDict's")
    entries = node["entries"]
    for key, entry in entries.items():
        if entry["kind"] != "non_tensor":
            bad(f"entry {key!r} of a TensorClass is a {entry['kind']}, expected a non_tensor")
    shared = sorted(set(entries) & set(meta["entries"]))
    if shared:
        bad(f"keys {shared} are both non-tensor fields and in the TensorDict")
    keys = node.get("keys")
    if (
        type(keys) is not list
        or not all(type(key) is str for key in keys)
        or len(set(keys)) != len(keys)
        or set(keys) != set(entries) | set(meta["entries"])
    ):
        bad(f"'keys' is {keys!r}, expected the list of all the fields")


def _validate_entry(key, entry, batch, path, api, at, bad, depth: int) -> None:
    if type(entry) is not dict:
        bad(f"entry {key!r} is not a JSON object")
    kind = entry.get("kind")
    if kind == "tensor":
        if type(entry.get("file")) is not str or not TENSOR_FILE.fullmatch(entry["file"]):
            bad(f"data file name {entry.get('file')!r} is not a name tdfunc writes")
        if type(entry.get("dtype")) is not str or entry["dtype"] not in DTYPES:
            bad(f"dtype {entry.get('dtype')!r} is not a known dtype")
        offset = entry.get("offset", 0)
        if type(offset) is not int or not 0 <= offset < _INT64 or offset % PACK_ALIGN:
            bad(f"offset {offset!r} is not a multiple of {PACK_ALIGN} bytes")
        shape = entry.get("shape")
        if not _shape(shape) or shape[: len(batch)] != batch:
            bad(f"shape {shape!r} is not a list of sizes starting with the batch size {batch}")
    elif kind == "nested":
        if type(entry.get("file")) is not str or not TENSOR_FILE.fullmatch(entry["file"]):
            bad(f"data file name {entry.get('file')!r} is not a name tdfunc writes")
        if type(entry.get("dtype")) is not str or entry["dtype"] not in DTYPES:
            bad(f"dtype {entry.get('dtype')!r} is not a known dtype")
        if entry.get("layout") not in LAYOUTS:
            bad(f"layout {entry.get('layout')!r} is not one of {list(LAYOUTS)}")
        sizes = entry.get("sizes")
        if (
            type(sizes) is not list
            or not sizes
            or not all(_shape(size) for size in sizes)
            or len({len(size) for size in sizes}) != 1
            or not _shape([nested_numel(sizes)])
            or (entry["layout"] == "jagged" and not sizes[0])
            or (entry["layout"] == "jagged" and len({tuple(s[1:]) for s in sizes}) != 1)
            or not _prefix(_nested_shape(sizes), batch)
        ):
            bad(
                f"'sizes' {sizes!r} is not a list of component shapes of one rank (sharing "
                f"their trailing dims when jagged) whose nested shape starts with {batch}"
            )
    elif kind == "collection":
        if not isinstance(entry.get("dir"), str) or not NAME.fullmatch(entry["dir"]):
            bad(f"directory name {entry.get('dir')!r} is not a name tdfunc writes")
        validate(entry.get("meta"), path, api, batch, at, depth + 1)
    elif kind == "non_tensor":
        size = entry.get("batch_size")
        if not _batch(size) or size[: len(batch)] != batch:
            bad(f"batch size {size!r} does not start with {batch}")
        if type(entry.get("stack")) is not bool:
            bad("'stack' must be true or false")
        has_value, has_file = "value" in entry, "file" in entry
        if has_value == has_file:
            bad("a non-tensor entry needs exactly one of 'value' and 'file'")
        if has_file and (
            type(entry["file"]) is not str or not OBJECT_FILE.fullmatch(entry["file"])
        ):
            bad(f"file name {entry['file']!r} is not a name tdfunc writes")
        if (
            has_value
            and entry["stack"]
            and (type(entry["value"]) is not list or not size or len(entry["value"]) != size[0])
        ):
            bad(f"a stack of non-tensor values must be a list of {size[:1]} values")
    else:
        bad(f"entry {key!r} has unknown kind {kind!r}")


def inline_child(node: dict, key: str, stem: str) -> Any:
    """The metadata ``node`` records for its sub-directory ``stem`` (key ``key``), if any."""
    entries = node.get("entries")
    entry = entries.get(key) if type(entries) is dict else None
    if type(entry) is dict and entry.get("kind") == "collection" and entry.get("dir") == stem:
        return entry.get("meta")
    return None


def inline_tensordict(node: dict) -> Any:
    """The metadata ``node`` records for its sub-directory ``_tensordict``, if any."""
    inner = node.get("tensordict")
    if type(inner) is dict and inner.get("dir") == TENSORDICT_DIR:
        return inner.get("meta")
    entries = node.get("entries")  # a version 1 node may use the name for a key
    for key, entry in entries.items() if type(entries) is dict else ():
        if type(entry) is dict and entry.get("dir") == TENSORDICT_DIR:
            return inline_child(node, key, TENSORDICT_DIR)
    return None
