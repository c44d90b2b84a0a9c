"""Errors raised by a torch function on one leaf name that leaf's key.

A container op runs a torch function on every leaf; when torch refuses one (a
``mean`` of a bool leaf, ``add`` on a sparse one) its message speaks of "the
input" and the user cannot tell which of the entries it was. The loops that visit
leaves call :func:`note_key` with the key they were at: the exception keeps its
type and message and gains a note (PEP 678, shown under the message in a
traceback) naming the full key path, nested levels included.

Example:
    >>> error = RuntimeError("mean(): could not infer output dtype")
    >>> note_key(note_key(error, "b"), "n").__notes__
    ["(raised by a torch operation on the leaf at key ('n', 'b'))"]
"""

from __future__ import annotations

from typing import Any

import torch

_PATH = "_tdfunc_key_path"
_INDEX = "_tdfunc_key_note"


def note_key(error: BaseException, key: Any) -> BaseException:
    """Add (or extend, one level up) the note naming the key ``error`` was raised at."""
    path = (key, *getattr(error, _PATH, ()))
    shown = path[0] if len(path) == 1 else path
    note = f"(raised by a torch operation on the leaf at key {shown!r})"
    notes = getattr(error, "__notes__", None)
    index = getattr(error, _INDEX, None)
    try:
        if index is not None and notes is not None and index < len(notes):
            notes[index] = note  # the inner level's note, now with the outer keys
        else:
            error.add_note(note)
            setattr(error, _INDEX, len(error.__notes__) - 1)
        setattr(error, _PATH, path)
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        pass
    return error


def map_values(data: dict, fn: Any) -> dict:
    """``{key: fn(value)}`` of a level's entries; an error names the key it was raised at."""
    out = {}
    key = None
    try:
        for key, value in data.items():
            out[key] = fn(value)
    except Exception as error:
        note_key(error, key)
        raise
    return out


def each_leaf(container: Any, fn: Any, path: tuple = ()) -> None:
    """``fn(leaf)`` for every tensor leaf of ``container`` (in-place work, results unused);
    an error names the key path of the leaf it was raised at."""
    for key, value in container._data.items():
        if isinstance(value, torch.Tensor):
            try:
                fn(value)
            except Exception as error:
                for part in reversed((*path, key)):
                    note_key(error, part)
                raise
        elif getattr(type(value), "_is_tensor_collection", False):
            each_leaf(value._to_tensordict_view(), fn, (*path, key))
