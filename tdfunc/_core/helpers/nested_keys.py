"""Nested keys: one normalisation function, with a fast path for ``str``.

A key is a ``str`` or a tuple of keys, nested arbitrarily
(``("a", ("b", ("c",)))``); it is unravelled to a flat tuple of ``str``.
A one-element tuple is the same key as its element.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

NestedKey = str | tuple
MISSING = object()  # "no value at this key", returned by lookups that do not raise


def unravel_key(key: object, api: str = "tdfunc") -> str | tuple[str, ...]:
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
                raise KeyError(f"{api}: an empty tuple is not a key.")
            return key
        flat: list[str] = []
        _flatten_into(key, flat, key, api)
        if not flat:
            raise KeyError(f"{api}: an empty tuple is not a key.")
        return flat[0] if len(flat) == 1 else tuple(flat)
    raise TypeError(
        f"{api}: a key must be a str or a (nested) tuple of str, got {type(key).__name__} {key!r}."
    )


def _flatten_into(key: tuple, out: list[str], whole: object, api: str) -> None:
    for part in key:
        if type(part) is str:
            out.append(part)
        elif type(part) is tuple:
            _flatten_into(part, out, whole, api)
        else:
            raise TypeError(
                f"{api}: a key must be a str or a (nested) tuple of str, got "
                f"{type(part).__name__} {part!r} inside {whole!r}."
            )


def key_parts(key: object, api: str = "tdfunc") -> tuple[str, ...]:
    """Return ``key`` as a tuple of ``str`` (a single ``str`` becomes a 1-tuple)."""
    if type(key) is str:
        return (key,)
    flat = unravel_key(key, api)
    return (flat,) if isinstance(flat, str) else flat


def is_key(index: object) -> bool:
    """True when ``index`` is a key rather than a tensor index."""
    if type(index) is str:
        return True
    if type(index) is tuple and index:
        return all(type(part) is str or (type(part) is tuple and is_key(part)) for part in index)
    return False


def missing_key_error(
    key: object, available: Iterable[str], where: str = "", api: str = "tdfunc"
) -> KeyError:
    """A ``KeyError`` naming ``key`` and the closest keys that do exist.

    Example:
        >>> missing_key_error("obs", ["observation", "action"]).args[0]
        "tdfunc: key 'obs' not found. Did you mean 'observation'?"
    """
    names = [str(name) for name in available]
    text = key if isinstance(key, str) else str(key)
    close = difflib.get_close_matches(text, names, n=3, cutoff=0.5)
    close += [n for n in names if n.startswith(text) and n not in close][: 3 - len(close)]
    message = f"{api}: key {key!r} not found{where}."
    if close:
        message += f" Did you mean {', '.join(repr(c) for c in close)}?"
    elif names:
        shown = ", ".join(repr(n) for n in names[:8])
        message += f" Available keys: {shown}{', ...' if len(names) > 8 else ''}."
    return KeyError(message)


def is_non_tensor_leaf(value: Any) -> bool:
    """A ``NonTensorData`` / ``NonTensorStack`` entry (which ``leaves_only`` leaves out)."""
    return getattr(type(value), "_is_non_tensor", False)


class KeysView:
    """The keys of a TensorDict; membership accepts any nested-tuple spelling."""

    __slots__ = ("_include_nested", "_leaves_only", "_sort", "_td")

    def __init__(self, td, include_nested: bool, leaves_only: bool, sort: bool = False) -> None:
        self._td = td
        self._include_nested = include_nested
        self._leaves_only = leaves_only
        self._sort = sort

    def __iter__(self):
        if not self._include_nested and not self._leaves_only and not self._sort:
            return iter(self._td._data)
        if self._leaves_only:  # tensordict's default leaves: tensors, not non-tensor data
            keys = (
                key
                for key, value in self._td._iter_items((), self._include_nested, True)
                if not is_non_tensor_leaf(value)
            )
        else:
            keys = self._td._iter_keys((), self._include_nested, False)
        if self._sort:
            return iter(sorted(keys, key=lambda k: k if type(k) is tuple else (k,)))
        return keys

    def __len__(self) -> int:
        if not self._include_nested and not self._leaves_only:
            return len(self._td._data)
        return sum(1 for _ in self)

    def __contains__(self, key) -> bool:
        # as in tensordict: what is not a key, and a nested key asked of the top-level
        # keys, are mistakes (a TypeError), not keys that are missing
        try:
            parts = key_parts(key, "KeysView.__contains__")
        except (TypeError, KeyError):
            raise TypeError(
                f"KeysView.__contains__: TensorDict keys are always strings (or tuples of "
                f"strings for nested keys), got {type(key).__name__} {key!r}."
            ) from None
        if len(parts) > 1 and not self._include_nested:
            raise TypeError(
                f"KeysView.__contains__: checks with tuples of strings is only supported "
                f"with include_nested=True (got {key!r}); use "
                f"td.keys(include_nested=True) or `key in td`."
            )
        value = self._td._get_nested(parts)
        if value is MISSING:
            return False
        if not self._leaves_only:
            return True
        return not (
            getattr(type(value), "_is_tensor_collection", False) or is_non_tensor_leaf(value)
        )

    def __repr__(self) -> str:
        return f"KeysView({list(self)})"

    def __eq__(self, other) -> bool:
        try:
            return set(self) == set(other)
        except TypeError:
            return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def close_matches_hint(key: Any, names: list) -> str:
    """The " Did you mean ...?" (or " Available keys: ...") part of a missing-key message.

    Example:
        >>> close_matches_hint("a.b", ["a.c", "x"])
        " Did you mean 'a.c'?"
    """
    message = str(missing_key_error(key, names).args[0])
    head = f"tdfunc: key {key!r} not found."
    return message[len(head) :] if message.startswith(head) else ""


def _is_collection(value: Any) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


def leaf_walk(td, is_leaf, include_nested: bool, prefix: tuple = ()):
    """``(key, stored value)`` below ``td``, not entering the containers ``is_leaf`` accepts."""
    for key, value in td._data.items():
        full = prefix + (key,) if prefix else key
        yield full, value
        if include_nested and _is_collection(value) and not is_leaf(type(value)):
            inner = value._to_tensordict_view()
            yield from leaf_walk(inner, is_leaf, True, full if prefix else (key,))
