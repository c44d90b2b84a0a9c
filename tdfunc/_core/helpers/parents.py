"""Parent links and lock state: how a view writes back into, or locks with, its container."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from .frozen import FROZEN
from .mixin import is_tensor_collection
from .nontensor import NonTensorData

# The classes of most values: a walk over a tree skips them before asking what else a value is.
PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})


def _holder(container: Any) -> Any:
    """Where ``container`` keeps its pending and entered exit actions: itself, or for a
    TensorClass (which has no slots of its own) its TensorDict."""
    if hasattr(type(container), "_exits"):
        return container
    return container._to_tensordict_view()


def remember(out: Any, action: Callable[[Any], None]) -> Any:
    """Make ``with out:`` run ``action(out)`` on exit; returns ``out``."""
    try:  # noqa: SIM105 (contextlib.suppress costs more on this hot path)
        _holder(out)._last_op = action
    except AttributeError:  # a container without the slot: no context-manager form
        pass
    return out


def write_back(out: Any, source: Any, inverse: Callable[[Any], Any] | None = None) -> Any:
    """Make ``with out:`` write back into ``source``: ``source.update(inverse(out))``.

    ``inverse`` defaults to reshaping ``out`` to ``source``'s batch size. The pair
    is stored as it is (no closure), so shape operations pay a slot write only.
    """
    try:  # noqa: SIM105 (contextlib.suppress costs more on this hot path)
        _holder(out)._last_op = (source, inverse)  # a TensorClass keeps it in its TensorDict
    except AttributeError:
        pass
    return out


def record_parent(parent_ref: Any, child: Any) -> None:
    """Remember that the container behind ``parent_ref`` (a weak reference) holds ``child``.

    Recorded when a container locks ``child``, stores it, or hands it out by key
    (``td["n"]``, ``td.get("n")``): the ways a caller gets hold of a nested level.
    """
    try:  # noqa: SIM105 (contextlib.suppress costs more on this path)
        child._parent = parent_ref
    except AttributeError:  # a container without the slot (a TensorClass)
        pass


def parent_ref(view: Any) -> Any:
    """The weak reference to the container known to hold ``view`` (a TensorDict), or None.

    An unset slot reads as None and is then set to None: reading an unset slot raises
    (and ``getattr`` with a default catches) an ``AttributeError``, which costs more
    than the rest of a lock walk's visit of the level; a level is read once that way.
    """
    try:
        return view._parent
    except AttributeError:
        try:  # noqa: SIM105 (contextlib.suppress costs more on this path)
            view._parent = None
        except AttributeError:  # a container without the slot
            pass
        return None


def locking_parent(child: Any) -> Any:
    """The locked container that holds ``child`` and locked it, or None."""
    ref = parent_ref(child)
    parent = None if ref is None else ref()
    if parent is None or not parent._is_locked:
        return None
    # a TensorClass is held as itself and remembered by its inner TensorDict
    held = (
        value is child or (is_tensor_collection(value) and value._to_tensordict_view() is child)
        for value in parent._data.values()
    )
    return parent if any(held) else None


def hand_out(parent: Any, child: Any) -> None:
    """``child`` (a container stored in ``parent``) is given to the caller: remember its parent."""
    record_parent(weakref.ref(parent._to_tensordict_view()), child._to_tensordict_view())


def holding_parent(child: Any) -> tuple[Any, Any] | None:
    """``(parent, key)`` of the container known to hold ``child`` (still holding it), or None."""
    view = child._to_tensordict_view()
    ref = parent_ref(view)
    parent = None if ref is None else ref()
    if parent is None:
        return None
    for key, value in parent._data.items():
        if value is child or (
            value is not None
            and is_tensor_collection(value)
            and value._to_tensordict_view() is view
        ):
            return parent, key
    return None


def check_parent_batch(child: Any, size: Any, api: str) -> None:
    """Refuse a new batch size of a nested container that its parent's would not start.

    A parent of batch ``[3]`` indexes every entry along that dim: a nested level of
    batch ``[5]`` below it would be indexed wrongly, silently.
    """
    found = holding_parent(child)
    if found is None:
        return
    parent, key = found
    outer = parent._batch_size
    if tuple(size[: len(outer)]) != tuple(outer):
        raise ValueError(
            f"{api}: cannot give batch size {list(size)} to the nested TensorDict at key "
            f"{key!r}: its parent has batch size {list(outer)}, which every entry's batch size "
            f"must start with. Change the parent's batch size first, or update through the "
            f"parent (parent.update({{{key!r}: ...}}, update_batch_size=True))."
        )


def save_level(view: Any, saved: dict) -> None:
    """Record one level's lock state and parent in ``saved`` (for :class:`LockState`),
    unless it was recorded already: a level held twice is reached again after the
    walk changed it, and what it was before the walk is what must come back."""
    if id(view) not in saved:
        saved[id(view)] = (view, view._is_locked, parent_ref(view))


def save_tree(node: Any, saved: dict) -> None:
    """:func:`save_level` for ``node`` and every container nested in it."""
    view = node._to_tensordict_view()
    saved[id(view)] = (view, view._is_locked, parent_ref(view))
    for value in view._data.values():
        kind = type(value)
        # tensors first: most values are, and a set lookup is cheaper than the class test
        if kind not in PLAIN_TENSORS and getattr(kind, "_is_tensor_collection", False):
            save_tree(value, saved)


class LockState:
    """The lock state of a container and every container nested in it, to restore later.

    ``lock_`` / ``unlock_`` take one before they change anything; ``with`` restores it
    on exit. A container added inside the block takes the restored state of its
    parent (as the parent's ``lock_`` / ``unlock_`` would); a frozen level is never
    touched.
    """

    __slots__ = ("saved",)

    def __init__(self, td: Any = None, saved: dict | None = None) -> None:
        """The state of ``td``'s tree, or ``saved`` as :func:`save_level` filled it in
        (``lock_`` / ``unlock_`` save each level as their own walk reaches it)."""
        self.saved: dict[int, tuple] = {} if saved is None else saved
        if td is not None:
            save_tree(td, self.saved)

    def restore(self, td: Any) -> None:
        self._restore(td, False, None)

    def _restore(self, node: Any, parent_locked: bool, parent_ref: Any) -> None:
        view = node._to_tensordict_view()
        entry = self.saved.get(id(view))
        if view._is_locked != FROZEN:
            if entry is not None and entry[0] is view:
                view._is_locked, parent = entry[1], entry[2]
            else:  # added inside the block: as its parent's lock_ / unlock_ would leave it
                view._is_locked = parent_locked
                parent = parent_ref
            record_parent(parent, view)
        ref = weakref.ref(view)
        locked = bool(view._is_locked)
        for value in view._data.values():
            if is_tensor_collection(value):
                self._restore(value, locked, ref)
            elif isinstance(value, NonTensorData):  # a leaf is locked with its container
                if locked:
                    value._is_locked = True
                else:
                    value.__dict__.pop("_is_locked", None)
