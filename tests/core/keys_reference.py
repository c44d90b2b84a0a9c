"""A reference for key operations written without tdfunc: nested ``dict`` trees.

Levels are dicts, leaves are plain tensors or Python values (a TensorDict's
non-tensor entries). Each function says which rule of tensordict's it models; an
operation the reference refuses raises ``Refused(kind)`` with the exception class
the container must raise. Used by ``test_keys_differential.py``.
"""

from __future__ import annotations

import copy

import torch


class Refused(Exception):
    """The reference refuses the operation with ``kind`` (an exception class)."""

    def __init__(self, kind: type[BaseException]) -> None:
        super().__init__(kind.__name__)
        self.kind = kind


class ClassLevel(dict):
    """A level that models a TensorClass instance with fields ``a`` and ``b``: only its
    fields are keys (another key is an ``AttributeError``); an unset field reads
    ``None`` and is not a key."""

    FIELDS = ("a", "b")


def is_level(value) -> bool:
    return isinstance(value, dict)


def check_field(level: dict, key: str) -> None:
    if isinstance(level, ClassLevel) and key not in ClassLevel.FIELDS:
        raise Refused(AttributeError)


def node_at(tree: dict, path: tuple):
    """The value at ``path``; ``Refused(KeyError)`` when missing or a leaf is in the way."""
    node = tree
    for key in path:
        if not is_level(node) or key not in node:
            raise Refused(KeyError)
        node = node[key]
    return node


def has(tree: dict, path: tuple) -> bool:
    try:
        node_at(tree, path)
    except Refused:
        return False
    return True


def parent_for_write(tree: dict, path: tuple) -> dict:
    """The dict that will hold ``path[-1]``, creating the missing levels.

    Checks the whole path before creating anything (a refused write changes nothing).
    """
    node = tree
    for key in path[:-1]:
        if key not in node:
            check_field(node, key)
            break
        node = node[key]
        if not is_level(node):
            raise Refused(KeyError)
    else:
        check_field(node, path[-1])
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    return node


def walk(tree: dict, prefix: tuple = (), enter=is_level):
    """``(path, value)`` depth first, each level before what it holds (dict order);
    ``enter(value)`` says which levels the walk goes into."""
    for key, value in tree.items():
        yield (*prefix, key), value
        if is_level(value) and enter(value):
            yield from walk(value, (*prefix, key), enter)


def kind_of(value) -> str:
    if isinstance(value, torch.Tensor):
        return "tensor"
    return "level" if is_level(value) else "value"


def kind_of_class(cls: type) -> str:
    if issubclass(cls, torch.Tensor):
        return "tensor"
    return "level" if getattr(cls, "_is_tensor_collection", False) else "value"


LEAF_RULES = {
    "everything": lambda kind: True,
    "not a level": lambda kind: kind != "level",
    "tensors": lambda kind: kind == "tensor",
    "levels": lambda kind: kind == "level",
}


def spelled(path: tuple):
    """The key as tdfunc's ``unravel_key`` gives it back."""
    return path[0] if len(path) == 1 else path


def structure_copy(tree: dict) -> dict:
    return type(tree)((k, structure_copy(v) if is_level(v) else v) for k, v in tree.items())


def leaf_paths(tree: dict) -> list:
    return [path for path, value in walk(tree) if isinstance(value, torch.Tensor)]


def tree_map(tree: dict, fn, prefix=()):
    return type(tree)(
        (k, tree_map(v, fn, (*prefix, k)) if is_level(v) else fn((*prefix, k), v))
        for k, v in tree.items()
    )


def write(ref: dict, items: list, inplace: bool, merge_levels: bool, locked: bool) -> None:
    """The write engine of the reference: ``set`` (one item) and ``update``.

    Atomic: every item is checked (in order; the first problem is the error) before
    anything is written. A leaf where a level is needed is a ``KeyError``, a value that
    cannot go in place into the entry it meets is a ``TypeError`` (both reported
    before the lock: the request is wrong whatever the lock), and a locked container
    refuses to add or replace an entry (``RuntimeError``); writing a tensor into an
    existing tensor, or a value into an existing non-tensor value, in place is allowed.
    """
    scratch = copy.deepcopy(ref)  # an item is checked against what the items before it wrote
    for path, value in items:
        check_write(scratch, path, value, inplace, merge_levels, locked)
        apply_write(parent_for_write(scratch, path), path[-1], value, inplace, merge_levels)
    for path, value in items:
        apply_write(parent_for_write(ref, path), path[-1], value, inplace, merge_levels)


def check_write(ref: dict, path: tuple, value, inplace: bool, merge_levels: bool, locked: bool):
    node = ref
    for key in path[:-1]:
        check_field(node, key)
        if key not in node:
            if locked:
                raise Refused(RuntimeError)
            return
        node = node[key]
        if not is_level(node):
            raise Refused(KeyError)
    check_field(node, path[-1])
    if path[-1] not in node:
        if locked:
            raise Refused(RuntimeError)
        return
    existing = node[path[-1]]
    if merge_levels and is_level(existing) and is_level(value):
        for key, inner in value.items():
            check_write(existing, (key,), inner, inplace, merge_levels, locked)
        return
    if inplace and isinstance(existing, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            raise Refused(TypeError)
        return
    if inplace and is_level(existing):
        raise Refused(TypeError)
    if locked and not (inplace and isinstance(existing, str) and isinstance(value, str)):
        raise Refused(RuntimeError)


def apply_write(parent: dict, key: str, value, inplace: bool, merge_levels: bool) -> None:
    existing = parent.get(key)
    if merge_levels and is_level(existing) and is_level(value):
        for inner_key, inner in value.items():
            apply_write(existing, inner_key, inner, inplace, merge_levels)
    elif inplace and isinstance(existing, torch.Tensor):
        existing.copy_(value)
    else:
        parent[key] = copy.deepcopy(value) if is_level(value) else value


def limited_items(dest: dict, items: list, wanted: list, prefix: tuple = ()) -> list:
    """The writes of ``update(items, keys_to_update=wanted)`` (tensordict's documented rule).

    An entry whose first key no wanted key starts with is skipped; one that meets a
    nested level of ``dest`` goes into it, limited to the wanted keys below that level
    (all of them when the level itself is wanted); anything else (a missing level, a
    leaf in the way) is written whole at its key. Each entry is judged against ``dest``
    as it was before the update (tensordict goes entry by entry, so there an entry that
    creates a level changes how a later entry under it is limited).
    """
    out = []
    for key, value in items:
        first, rest = key[0], key[1:]
        if not any(w[0] == first for w in wanted):
            continue
        target = dest.get(first)
        if is_level(target) and (rest or is_level(value)):
            inner_items = [(rest, value)] if rest else [((k,), v) for k, v in value.items()]
            if (first,) in wanted:
                out += [((*prefix, first, *k), v) for k, v in inner_items]
            else:
                inner = [w[1:] for w in wanted if w[0] == first and len(w) > 1]
                out += limited_items(target, inner_items, inner, (*prefix, first))
            continue
        out.append(((*prefix, *key), value))
    return out


def unflatten(flat: dict, separator: str):
    """The nested dict that ``flat``'s keys split on ``separator`` describe, or ``Refused``."""
    out: dict = {}
    for key, value in flat.items():
        path = tuple(key.split(separator))
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not is_level(node):
                return Refused
        if path[-1] in node:
            return Refused
        node[path[-1]] = value
    return out
