"""Keys to file names: any key maps to a safe, portable name inside its directory.

A saved key becomes a directory (nested TensorDict) or the stem of a data file
(``<stem>.memmap``). The real key lives in ``meta.json``; the name only has to be
safe and distinct, so the encoding is one-way:

- a *simple* key (lowercase ASCII letters, digits, ``_`` and ``-``, at most 64
  characters, not a device name reserved on Windows) is its own name, so the
  layout stays readable (``weight.memmap``, ``0/``);
- any other key becomes ``<readable>~<hash>``: a lowercased, sanitised prefix
  of at most 40 characters, ``~`` (which a simple name never contains) and 16
  hex digits of the SHA-256 of the key.

Every name is lowercase ASCII, so two keys that differ only in case never
collide, even on case-insensitive file systems; names never contain ``/``,
``\\`` or ``.``, so no key can reach outside its directory, collide with
``meta.json`` or with a data file; names are at most 64 characters long.
"""

from __future__ import annotations

import hashlib
import re

_SIMPLE = re.compile(r"[a-z0-9_][a-z0-9_-]{0,63}")
_UNSAFE = re.compile(r"[^a-z0-9_-]")
_WINDOWS_RESERVED = frozenset(
    ["con", "prn", "aux", "nul", "conin$", "conout$"]
    + [f"{stem}{n}" for stem in ("com", "lpt") for n in range(10)]
)
_READABLE_LENGTH = 40
_HASH_LENGTH = 16

# What ``encode_key`` can produce; used to validate names read from meta.json.
NAME = re.compile(r"[a-z0-9_-]{0,40}~[0-9a-f]{16}|[a-z0-9_][a-z0-9_-]{0,63}")


def encode_key(key: str) -> str:
    """The file-system name used for ``key`` (a directory or a data-file stem).

    Example:
        >>> encode_key("weight")
        'weight'
        >>> encode_key("Weight")
        'weight~81d27ef6d5033c3e'
        >>> encode_key("../etc")
        '___etc~f7f9121fdb53d8de'
    """
    if _SIMPLE.fullmatch(key) and key not in _WINDOWS_RESERVED:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    # lower() can lengthen a string ("İ" is two characters once lowercased)
    readable = _UNSAFE.sub("_", key[:_READABLE_LENGTH].lower())[:_READABLE_LENGTH]
    return f"{readable}~{digest[:_HASH_LENGTH]}"


def is_valid_name(name: object) -> bool:
    """True when ``name`` is something :func:`encode_key` can produce."""
    return isinstance(name, str) and NAME.fullmatch(name) is not None


# ---------------------------------------------------------------------------- tensordict's names
# tensordict (0.15) names a key's file or directory by the key itself, with the characters
# below written as ``%XX`` (two uppercase hex digits); ``%`` is among them, so the
# encoding is reversible, and a bare ``%`` (which it never produces) names the empty key.
_TENSORDICT_ESCAPED = frozenset('/<>:"|?*\\ \0%' + "".join(map(chr, range(32))) + chr(127))


def tensordict_name(key: str) -> str:
    """The file-system name tensordict gives ``key`` (a directory, or a stem of ``.memmap``).

    Example:
        >>> tensordict_name("next obs"), tensordict_name("a:b"), tensordict_name("")
        ('next%20obs', 'a%3Ab', '%')
    """
    if not key:
        return "%"
    if key in (".", ".."):
        return "%2E" * len(key)
    return "".join(f"%{ord(c):02X}" if c in _TENSORDICT_ESCAPED else c for c in key)


def tensordict_legacy_name(key: str) -> str | None:
    """The name older tensordict versions used for ``key`` (the key itself), when that
    name stays inside its directory; ``None`` otherwise."""
    if key in ("", ".", "..") or "/" in key or "\\" in key or "\0" in key:
        return None
    if len(key) >= 2 and key[1] == ":" and key[0].isalpha():  # a drive on Windows
        return None
    return key
