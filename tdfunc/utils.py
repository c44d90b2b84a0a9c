"""Public helpers importable as ``tdfunc.utils`` (tensordict's ``tensordict.utils``).

Example:
    >>> import tempfile, torch
    >>> from tdfunc import TensorDict
    >>> from tdfunc.utils import print_directory_tree
    >>> path = tempfile.mkdtemp()
    >>> _ = TensorDict({"a": torch.zeros(2)}, [2]).memmap(path)
    >>> _ = print_directory_tree(path)  # doctest: +ELLIPSIS
    tmp.../
        a.memmap
        meta.json
"""

from __future__ import annotations

import logging
import os

from ._core.convert.consolidate import TensorDictFuture
from ._core.helpers.by_value import assert_close, isin, remove_duplicates
from ._core.helpers.mixin import LOCK_ERROR as _LOCK_ERROR
from ._core.helpers.nontensor import LinkedList, is_non_tensor
from ._core.helpers.options import (
    capture_non_tensor_stack,
    get_printoptions,
    list_to_stack,
    set_capture_non_tensor_stack,
    set_list_to_stack,
    set_printoptions,
    strtobool,
)
from ._core.helpers.predicates import (
    default_is_leaf,
    expand_as_right,
    expand_right,
    is_bool,
    is_floating,
    is_inexact,
    is_integer,
    is_leaf_nontensor,
    unravel_key_list,
    unravel_key_to_tuple,
)
from ._core.helpers.repr import parse_tensor_dict_string

logger = logging.getLogger("tdfunc")

# ``_LOCK_ERROR`` keeps tensordict's name: code written for tensordict matches lock
# errors against ``tensordict.utils._LOCK_ERROR``, and every lock error contains it.
__all__ = [
    "_LOCK_ERROR",
    "LinkedList",
    "TensorDictFuture",
    "assert_close",
    "capture_non_tensor_stack",
    "default_is_leaf",
    "expand_as_right",
    "expand_right",
    "get_printoptions",
    "is_bool",
    "is_floating",
    "is_inexact",
    "is_integer",
    "is_leaf_nontensor",
    "is_non_tensor",
    "isin",
    "list_to_stack",
    "parse_tensor_dict_string",
    "print_directory_tree",
    "remove_duplicates",
    "set_capture_non_tensor_stack",
    "set_list_to_stack",
    "set_printoptions",
    "strtobool",
    "unravel_key_list",
    "unravel_key_to_tuple",
]


def _directory_size(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def _format_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024.0 or unit == "TB":
            return f"{size:.2f} {unit}"
        size /= 1024.0
    raise AssertionError("unreachable")


def print_directory_tree(
    path: str | os.PathLike, indent: str = "", display_metadata: bool = True
) -> str:
    """Print a directory as an indented tree: ``name/`` for directories, files beneath.

    This is how the files of a memory-mapped TensorDict are laid out. Entries are
    listed directories first, then files, each in name order (so the output does
    not depend on the file system). ``memmap_like`` files are sparse: the size
    reported is their apparent size.

    Args:
        path: the directory (or file) to show.
        indent: prefix of the first line; each level adds four spaces.
        display_metadata: also report the total size of the files, as a
            ``"Directory size: ..."`` record on the ``"tdfunc"`` logger at INFO level
            (the printed tree stays exactly the documentation's; enable logging to see it).

    Returns:
        The printed lines, joined by newlines (as tensordict returns them).

    Raises:
        FileNotFoundError: ``path`` does not exist.

    Example:
        >>> import tempfile, torch
        >>> from tdfunc import TensorDict
        >>> path = tempfile.mkdtemp()
        >>> _ = TensorDict({"a": torch.zeros(2), "b": {"c": torch.zeros(2)}}, [2]).memmap(path)
        >>> tree = print_directory_tree(path)  # doctest: +ELLIPSIS
        tmp.../
            b/
                c.memmap
                meta.json
            a.memmap
            meta.json
        >>> tree.splitlines()[1:3]
        ['    b/', '        c.memmap']
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"print_directory_tree: no such file or directory: {path!r}.")
    if display_metadata and os.path.isdir(path):
        logger.info("Directory size: %s", _format_size(_directory_size(path)))
    lines: list[str] = []
    _tree_lines(path, indent, lines)
    for line in lines:
        print(line)
    return "\n".join(lines)


def _tree_lines(path: str, indent: str, lines: list[str]) -> None:
    name = os.path.basename(os.path.normpath(path))
    if not os.path.isdir(path):
        lines.append(indent + name)
        return
    lines.append(indent + name + "/")
    with os.scandir(path) as scan:
        entries = sorted(scan, key=lambda entry: (not entry.is_dir(), entry.name))
    for entry in entries:
        _tree_lines(entry.path, indent + "    ", lines)
