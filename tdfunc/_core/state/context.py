"""Containers as context managers: ``with td.unlock_():``, ``with td.flatten_keys() as f:``.

As in tensordict, some calls return a container whose ``with`` block undoes
them on exit: ``lock_`` / ``unlock_`` restore the lock, and the shape
operations (``flatten_keys``, ``unflatten_keys``, ``permute``, ``transpose``,
``view``, ``reshape``, ``flatten``, ``unflatten``, ``squeeze``, ``unsqueeze``)
write what the block changed back into the container they came from, through
the inverse operation. The pending action is stored in the ``_last_op`` slot
of the returned container; a call made without ``with`` leaves it unused.
``__enter__`` moves it onto a stack (the ``_exits`` slot) and ``__exit__``
pops it, so blocks on one container nest: ``with td.unlock_(): with
td.lock_(): ...`` restores, at each exit, the state its own call found
(:class:`LockState`), not a single "last operation".

Nested locks: ``lock_`` records, in every nested container it locks, a weak
reference to the container that locked it (the ``_parent`` slot), so
that unlocking a nested container while its parent is still locked is refused
(tensordict's rule).
"""

from __future__ import annotations

from typing import Any

from ..helpers.mixin import ContainerMixin
from ..helpers.parents import _holder

# pending exit actions, entered blocks and the weak link to a parent are not state
_NOT_STATE = ("__weakref__", "_last_op", "_parent", "_exits")


class ContextMixin(ContainerMixin):
    """``__enter__`` / ``__exit__`` and the ``is_locked`` setter of ``TensorDict``.

    Example:
        >>> td = TensorDict({"a": {"b": torch.zeros(2)}}, [2])
        >>> with td.flatten_keys() as flat:
        ...     flat["a.c"] = torch.ones(2)
        >>> sorted(td.keys(True, True))
        [('a', 'b'), ('a', 'c')]
        >>> with td.lock_():
        ...     td.is_locked
        True
        >>> td.is_locked
        False
    """

    __slots__ = ()

    def __enter__(self):
        # the pending exit action of the call that made this container goes on the stack
        holder = _holder(self)
        action = getattr(holder, "_last_op", None)
        try:
            holder._last_op = None
            stack = getattr(holder, "_exits", None)
            if stack is None:
                holder._exits = [action]
            else:
                stack.append(action)
        except AttributeError:  # a container without the slots: no context-manager form
            pass
        return self

    def __getstate__(self) -> dict[str, Any]:
        slots = {}
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name not in ("__weakref__", "_last_op", "_parent", "_exits") and hasattr(
                    self, name
                ):
                    slots[name] = getattr(self, name)
        return (getattr(self, "__dict__", None) or None, slots)

    def __exit__(self, exc_type, exc, traceback) -> None:
        holder = _holder(self)
        stack = getattr(holder, "_exits", None)
        if stack:
            action = stack.pop()
        else:  # __exit__ called without __enter__: the pending action, as before
            action = getattr(holder, "_last_op", None)
        if action is not None:
            holder._last_op = None
            try:
                if type(action) is tuple:
                    source, inverse = action
                    back = self.reshape(source.batch_size) if inverse is None else inverse(self)
                    # a locked source keeps its tensors: the block's values are copied in
                    source.update(back, inplace=bool(source._is_locked))
                else:
                    action(self)
            finally:
                holder._last_op = None

    @property
    def is_locked(self) -> bool:
        return bool(self._is_locked)

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        if value:
            self.lock_()  # type: ignore[attr-defined]
        else:
            self.unlock_()  # type: ignore[attr-defined]
