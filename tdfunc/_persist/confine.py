"""The boundary of a checkpoint directory, for every layout and every entry point.

A checkpoint is untrusted input and a save target may hold the user's own files,
so every path below the directory a caller named (the *root*) goes through here:

- a path component is one name that stays in its directory (no ``/``, ``\\``,
  NUL, ``.``, ``..`` or empty name), checked before it is joined;
- a file or directory below the root is never a symbolic link: it is examined
  with ``lstat`` and refused, whether it is read, written or descended into (the
  root itself is the caller's choice and may be a link);
- a file is never written in place: data goes to a new file (``O_EXCL``) that is
  renamed over the old name only when that name is free or a regular file the
  replaced checkpoint used.

Both layouts (tdfunc's and tensordict's) read and write through these functions,
so a link or a name that leaves the directory is refused with the same words.
"""

from __future__ import annotations

import os
import stat

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_CREATE |= getattr(os, "O_BINARY", 0)


def check_component(name: object, api: str, where: str) -> str:
    """``name`` if it names one entry inside its directory; ``ValueError`` otherwise.

    ``where`` says which metadata or argument the name came from.
    """
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
    ):
        raise ValueError(
            f"{api}: the name {name!r} in {where} cannot name a file inside the checkpoint "
            f"directory (it is empty, '.', '..' or holds a path separator); the checkpoint is "
            f"corrupt or hostile."
        )
    return name


def _link_error(api: str, path: str, what: str) -> ValueError:
    return ValueError(
        f"{api}: {path} is a symbolic link; refusing to follow it out of the checkpoint "
        f"directory ({what} must be a real {'directory' if 'dir' in what else 'file'} inside "
        f"it). Replace the link by a copy of its target."
    )


def lstat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def enter_directory(parent: str, name: str, api: str, what: str = "a nested directory") -> str:
    """``parent/name``, which must be a real directory (``FileNotFoundError`` if absent)."""
    path = os.path.join(parent, name)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(api, path, what)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{api}: {path} is not a directory ({what} was expected there).")
    return path


def check_data_file(path: str, api: str, what: str = "a data file") -> os.stat_result:
    """``lstat`` of ``path``, which must be a regular file (never a link)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _link_error(api, path, what)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(
            f"{api}: {path} is not a regular file (a directory, FIFO, socket or device); "
            f"refusing to use it as {what}."
        )
    return st


def make_directory(parent: str, name: str, api: str) -> tuple[str, bool]:
    """``(parent/name, created)``: an existing real directory, or a new one."""
    path = os.path.join(parent, name)
    try:
        os.mkdir(path)
    except FileExistsError:
        enter_directory(parent, name, api, "a nested directory")
        return path, False
    return path, True


def root_directory(prefix, api: str, create: bool) -> tuple[str, bool]:
    """``(absolute path, created)`` of the directory a caller named (links allowed here)."""
    path = os.path.abspath(os.fspath(prefix))
    if create:
        try:
            os.mkdir(path)
            return path, True
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return root_directory(path, api, create)
        except FileExistsError:
            pass
    if not os.path.isdir(path):
        raise FileExistsError(
            f"{api}: {path} exists and is not a directory; tdfunc never replaces a file it did "
            f"not write. Remove it or choose another prefix."
        )
    return path, False


def create_new(path: str) -> int:
    """A write descriptor of the new file ``path`` (``FileExistsError`` if it exists)."""
    return os.open(path, _CREATE, 0o644)


def write_new(path: str, data: bytes, fsync: bool = False) -> None:
    """Write ``data`` to the new file ``path`` (never through an existing file or link)."""
    fd = create_new(path)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
