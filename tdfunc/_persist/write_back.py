"""A memory-mapped non-tensor leaf's new value, written to the directory it was saved in.

Tensor leaves of a memory-mapped container reach their files through the mapping;
a non-tensor leaf (a string, a list, a dict) lives in ``meta.json`` or in a
``.pt`` file of its own. When its value changes in place
(``NonTensorData.update_``), this rewrites that entry with the same crash safety
as a save: the new data file first, ``meta.json`` last through an atomic rename,
the file it replaces removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
from functools import partial
from typing import Any

from .._core.helpers.nontensor.values import is_json_exact
from .filenames import encode_key
from .format import (
    data_file,
    encode_object,
    new_token,
    read_meta,
    write_meta,
)

_API = "NonTensorData.update_"
_INNER = object()  # the step into a TensorClass's inner TensorDict


def _set_entry(
    node: dict, route: list, value: Any, blob_name: str | None, stack: bool | None
) -> str | None:
    """Write ``value`` into the entry ``route`` leads to from ``node``; the file it named."""
    for step in route[:-1]:
        if step is _INNER:
            node = node["tensordict"]["meta"]
        else:
            node = node["entries"][step]["meta"]
    entry = node["entries"][route[-1]]
    if not isinstance(entry, dict) or entry.get("kind") != "non_tensor":
        raise KeyError(route[-1])
    old = entry.pop("file", None)
    entry.pop("value", None)
    if stack is not None:
        entry["stack"] = stack
    if blob_name is None:
        entry["value"] = value
    else:
        entry["file"] = blob_name
    return old


def _parent_step(directory: str) -> Any:
    """The step from the parent directory's metadata to ``directory``'s, if it inlines it."""
    parent, stem = os.path.split(directory)
    try:
        node = read_meta(parent, _API)
    except (OSError, ValueError):
        return None
    inner = node.get("tensordict")
    if isinstance(inner, dict) and inner.get("dir") == stem:
        return _INNER
    for key, entry in node.get("entries", {}).items():
        if (
            isinstance(entry, dict)
            and entry.get("kind") == "collection"
            and entry.get("dir") == stem
        ):
            return key
    return None


def rewrite_non_tensor(
    directory: str, key: str, generation: str | None, value: Any, stack: bool | None = None
) -> None:
    """Store ``value`` as the non-tensor entry ``key`` of the save in ``directory``.

    Every ``meta.json`` that records the entry is rewritten: the directory's own and
    those of the enclosing saves that inline its metadata. ``generation`` is the token
    of the save the leaf was saved or loaded with: once a later save replaced it, the
    entry belongs to that save, and writing into it would mix the two. ``stack``
    (when given) records whether ``value`` is one value per element: an index write
    turns a saved single value into a stack.
    """
    try:
        current: dict | None = read_meta(directory, _API)
    except (FileNotFoundError, NotADirectoryError):  # removed by the newer save
        current = None
    if current is None or current.get("generation") != generation:
        raise RuntimeError(
            f"{_API}: {directory} was saved again since this leaf was saved or loaded; its "
            f"entry {key!r} belongs to the newer save, which this write must not change (a "
            f"checkpoint is never a mix of two saves). The new value is kept in memory only. "
            f"Load the directory again (or call memmap_refresh_()) and write to that."
        )
    blob_name = None
    if not is_json_exact(value):
        blob = encode_object(value, key, _API)
        blob_name = data_file(encode_key(key), new_token(), "pt")
        with open(os.path.join(directory, blob_name), "xb") as f:
            f.write(blob)
    route: list = [key]
    here = directory
    old = None
    while True:
        node = read_meta(here, _API)
        try:  # file names are relative to the leaf's directory in every meta.json
            found = _set_entry(node, route, value, blob_name, stack)
        except (KeyError, TypeError):
            if here == directory:
                raise RuntimeError(
                    f"{_API}: {directory} no longer holds the non-tensor entry {key!r} this "
                    f"leaf was saved as (it was overwritten since); the new value is kept in "
                    f"memory only."
                ) from None
            break
        write_meta(here, node, fsync=False)
        if here == directory:
            old = found
        step = _parent_step(here)
        if step is None:
            break
        route.insert(0, step)
        here = os.path.dirname(here)
    if old is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, old))


def bind(leaf: Any, directory: str, key: str, generation: str | None) -> None:
    """Mark ``leaf`` as memory-mapped in ``directory`` and route its updates there, as
    long as the save ``generation`` it came from is the one there."""
    leaf._is_memmap = True
    leaf._write_back = partial(rewrite_non_tensor, directory, key, generation)
