"""``rename_keys``: several keys renamed at once into a new container.

Every source is read before any destination is written, so swaps and chains work; the
result is a new tree of containers sharing the leaves. A nested container that the
renaming leaves empty is removed (a TensorClass field is never removed: it is unset).

Example:
    >>> td = TensorDict(a=torch.zeros(()), b=torch.ones(()))
    >>> out = rename_keys(td, {"a": "b", "b": "a"}, True)
    >>> out["a"].item(), td["a"].item()
    (1.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .mixin import is_tensor_collection
from .nested_keys import key_parts, unravel_key
from .writes import check_field


def _shown(parts: tuple) -> Any:
    return parts[0] if len(parts) == 1 else parts


def _check_pairs(pairs: list, api: str) -> None:
    destinations = [new for _, new in pairs]
    for side, keys in (("source", [old for old, _ in pairs]), ("destination", destinations)):
        for a in keys:
            for b in keys:
                if a != b and b[: len(a)] == a:
                    raise ValueError(
                        f"{api}: the {side} {_shown(b)!r} lies inside the {side} "
                        f"{_shown(a)!r}; rename the outer key only, or both in two calls."
                    )
    seen: dict = {}
    for old, new in pairs:
        if new in seen:
            raise ValueError(
                f"{api}: the sources {_shown(seen[new])!r} and {_shown(old)!r} have the same "
                f"destination {_shown(new)!r}."
            )
        seen[new] = old


def _node(root: Any, parts: tuple) -> Any:
    node = root
    for part in parts:
        node = node._to_tensordict_view()._data[part]
    return node


def rename_keys(td: Any, mapping: Mapping, strict: bool) -> Any:
    """See ``TensorDict.rename_keys``."""
    api = f"{type(td).__name__}.rename_keys"
    if not isinstance(mapping, Mapping):
        raise TypeError(
            f"{api}: expected a mapping of old keys to new keys, got {type(mapping).__name__}."
        )
    pairs = [(key_parts(old, api), key_parts(new, api)) for old, new in mapping.items()]
    _check_pairs(pairs, api)
    present = []
    for old, new in pairs:
        if old in td:
            present.append((old, new))
        elif strict:
            td._get_leaf(old, "rename_keys")  # the KeyError that names the closest keys
    frozen = getattr(td, "_frozen", False)
    if frozen:
        # a frozen instance gives a new frozen instance: rename in a thawed copy of its
        # levels (new objects nobody else holds), then build the instance from them
        out = td._to_tensordict_view().copy()
        _thaw(out)
    else:
        out = td.copy()  # a new tree of containers holding the same leaves
        if out.is_locked:
            out.unlock_()
    moved = [(new, _node(out, old)) for old, new in present]
    emptied = set()
    for old, _ in present:
        del _node(out, old[:-1])._to_tensordict_view()._data[old[-1]]
        emptied.update(old[:depth] for depth in range(1, len(old)))
    for parts in sorted(emptied, key=len, reverse=True):
        parent = _node(out, parts[:-1])
        child = parent._to_tensordict_view()._data.get(parts[-1])
        if (
            is_tensor_collection(child)
            and not child._to_tensordict_view()._data
            and getattr(type(parent), "_tc_field_names", None) is None
        ):
            del parent._to_tensordict_view()._data[parts[-1]]
    for new, _ in moved:
        if new in out:
            raise ValueError(
                f"{api}: the destination {unravel_key(new)!r} is already present and is not "
                f"renamed away; rename or exclude it first."
            )
        parent = _node(out, new[:-1]) if len(new) > 1 and new[:-1] in out else out
        if parent is out:
            check_field(td if frozen else out, new[0], "rename_keys")
        else:
            check_field(parent, new[-1], "rename_keys")
    for new, value in moved:
        out.set(new, value)
    return td._like(out._data) if frozen else out


def _thaw(node: Any) -> None:
    node._is_locked = False
    for value in node._data.values():
        if is_tensor_collection(value):
            _thaw(value._to_tensordict_view())
