"""Locking: ``lock_`` and ``unlock_`` of a container and every level below it.

A locked container refuses new, replaced, deleted and renamed keys; writes into the
existing tensors stay allowed. A nested level is kept locked by the parent that locked
it, so it cannot be unlocked on its own.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ..helpers.fastpath import node_kind
from ..helpers.frozen import FROZEN
from ..helpers.locks import end_consolidation
from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData
from ..helpers.parents import (
    PLAIN_TENSORS,
    LockState,
    locking_parent,
    parent_ref,
    remember,
    save_tree,
)

if TYPE_CHECKING:
    from typing_extensions import Self


class LockingMixin(ContainerMixin):
    """``lock_`` / ``unlock_`` (methods of ``TensorDict``)."""

    __slots__ = ()

    def lock_(self) -> Self:
        """Refuse new, replaced, deleted and renamed keys; returns self.

        Writes into the existing tensors stay allowed (``set_``, ``update_``,
        ``set(..., inplace=True)``); ``set``, ``td[key] = value`` and ``update``
        raise ``RuntimeError``, as they would replace the stored tensor. Used as
        ``with td.lock_():``, the lock state from before the call is restored when
        the block exits (blocks nest like a stack).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2]).lock_()
            >>> _ = td.set_("a", torch.ones(2))  # written in place
            >>> td.is_locked, td["a"].tolist()
            (True, [1.0, 1.0])
        """
        saved: dict = {}  # the state before, saved level by level as the walk locks it
        _lock_tree(self, saved)
        return remember(self, LockState(saved=saved).restore)

    def unlock_(self) -> Self:
        """Allow structural changes again (nested TensorDicts too); returns self.

        Used as ``with td.unlock_():``, the lock state from before the call (of
        this TensorDict and every nested one) is restored when the block exits;
        such blocks nest (``with td.unlock_(): with td.lock_(): ...``). A nested
        TensorDict cannot be unlocked while the TensorDict that locked it is
        locked. A frozen TensorClass stays locked (a no-op on it).
        """
        if self._frozen or self._is_locked == FROZEN:
            return self
        _refuse_locked_by_parent(self)
        saved: dict = {}  # (as in lock_)
        _unlock_tree(self, True, saved)
        return remember(self, LockState(saved=saved).restore)


def _lock_tree(node, saved: dict) -> None:
    view = node._to_tensordict_view()
    if id(view) not in saved:  # (save_level, inlined: this walk visits every level)
        saved[id(view)] = (view, view._is_locked, parent_ref(view))
    if node._is_locked != FROZEN:
        node._is_locked = True
    ref = None
    for value in node._data.values():
        kind = type(value)
        if kind in PLAIN_TENSORS:
            continue
        how = node_kind[kind]  # 1: a TensorDict (its own view), 2: a TensorClass, 0: a leaf
        if how:
            _lock_tree(value, saved)
            if ref is None:
                ref = weakref.ref(node)
            # (record_parent, inlined) a TensorClass: its inner TensorDict
            try:  # noqa: SIM105 (contextlib.suppress costs more on this path)
                (value if how == 1 else value._to_tensordict_view())._parent = ref
            except AttributeError:  # a container without the slot
                pass
        elif isinstance(value, NonTensorData):
            value._is_locked = True  # its update() refuses, as a locked entry's set does


def _unlock_tree(node, checked: bool = False, saved: dict | None = None) -> None:
    if node._frozen or node._is_locked == FROZEN:
        if saved is not None:  # left as it is, but restored on exit like every level
            save_tree(node, saved)
        return
    view = node._to_tensordict_view()
    if saved is not None and id(view) not in saved:  # (save_level, inlined)
        saved[id(view)] = (view, view._is_locked, parent_ref(view))
    if not checked:  # (unlock_ has checked the container it was called on)
        _refuse_locked_by_parent(view)
    node._is_locked = False
    end_consolidation(view)
    for value in node._data.values():
        kind = type(value)
        if kind in PLAIN_TENSORS:
            continue
        if node_kind[kind]:  # a TensorDict or a TensorClass
            _unlock_tree(value, False, saved)
        elif isinstance(value, NonTensorData):
            value.__dict__.pop("_is_locked", None)


def _refuse_locked_by_parent(node) -> None:
    view = node._to_tensordict_view()
    ref = parent_ref(view)  # (the common answer, no parent or an unlocked one, inlined)
    parent = None if ref is None else ref()
    if parent is not None and parent._is_locked and locking_parent(view) is not None:
        raise RuntimeError(
            "TensorDict.unlock_: this TensorDict is an entry of a locked TensorDict, which "
            "keeps it locked; unlock that parent first (with parent.unlock_(): ...)."
        )
