"""Nested keys: one normalisation function, with a fast path for ``str``.

A key is a ``str`` or a tuple of keys, nested arbitrarily
(``("a", ("b", ("c",)))``); it is unravelled to a flat tuple of ``str``.
A one-element tuple is the same key as its element.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

NestedKey = str | tuple


def unravel_key(key: object) -> str | tuple[str, ...]:
    """Return ``key`` as a ``str`` or a flat tuple of at least two ``str``.

    Example:
        >>> unravel_key(("a", ("b", ("c",))))
        ('a', 'b', 'c')
        >>> unravel_key(("a",))
        'a'
    """
    if type(key) is str:
        return key
    if type(key) is tuple:
        if all(type(part) is str for part in key):
            if len(key) == 1:
                return key[0]
            if not key:
                raise KeyError("tdfunc: an empty tuple is not a key.")
            return key
        flat: list[str] = []
        _flatten_into(key, flat, key)
        if not flat:
            raise KeyError("tdfunc: an empty tuple is not a key.")
        return flat[0] if len(flat) == 1 else tuple(flat)
    raise TypeError(
        f"tdfunc: a key must be a str or a (nested) tuple of str, got {type(key).__name__} {key!r}."
    )


def _flatten_into(key: tuple, out: list[str], whole: object) -> None:
    for part in key:
        if type(part) is str:
            out.append(part)
        elif type(part) is tuple:
            _flatten_into(part, out, whole)
        else:
            raise TypeError(
                f"tdfunc: a key must be a str or a (nested) tuple of str, got "
                f"{type(part).__name__} {part!r} inside {whole!r}."
            )


def key_parts(key: object) -> tuple[str, ...]:
    """Return ``key`` as a tuple of ``str`` (a single ``str`` becomes a 1-tuple)."""
    key = unravel_key(key)
    return (key,) if type(key) is str else key


def is_key(index: object) -> bool:
    """True when ``index`` is a key rather than a tensor index."""
    if type(index) is str:
        return True
    if type(index) is tuple and index:
        return all(type(part) is str or (type(part) is tuple and is_key(part)) for part in index)
    return False


def missing_key_error(key: object, available: Iterable[str], where: str = "") -> KeyError:
    """A ``KeyError`` naming ``key`` and the closest keys that do exist."""
    names = [str(name) for name in available]
    text = key if isinstance(key, str) else str(key)
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.5)
    message = f"tdfunc: key {key!r} not found{where}."
    if close:
        message += f" Did you mean {', '.join(repr(c) for c in close)}?"
    elif names:
        shown = ", ".join(repr(n) for n in names[:8])
        message += f" Available keys: {shown}{', ...' if len(names) > 8 else ''}."
    return KeyError(message)
