"""Containers as context managers: ``with td.unlock_():``, ``with td.flatten_keys() as f:``.

As in tensordict, some calls return a container whose ``with`` block undoes
them on exit: ``lock_`` / ``unlock_`` restore the lock, and the shape
operations (``flatten_keys``, ``unflatten_keys``, ``permute``, ``transpose``,
``view``, ``reshape``, ``flatten``, ``unflatten``, ``squeeze``, ``unsqueeze``)
write what the block changed back into the container they came from, through
the inverse operation. The pending action is stored in the ``_last_op`` slot
of the returned container; a call made without ``with`` leaves it unused.

Nested locks: ``lock_`` records, in every nested container it locks, a weak
reference to the container that locked it (the ``_lock_parent`` slot), so
that unlocking a nested container while its parent is still locked is refused
(tensordict's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .mixin import ContainerMixin


def remember(out: Any, action: Callable[[Any], None]) -> Any:
    """Make ``with out:`` run ``action(out)`` on exit; returns ``out``."""
    try:  # noqa: SIM105 (contextlib.suppress costs more on this hot path)
        out._last_op = action
    except AttributeError:  # a container without the slot: no context-manager form
        pass
    return out


def write_back(out: Any, source: Any, inverse: Callable[[Any], Any] | None = None) -> Any:
    """Make ``with out:`` write back into ``source``: ``source.update(inverse(out))``.

    ``inverse`` defaults to reshaping ``out`` to ``source``'s batch size. The pair
    is stored as it is (no closure), so shape operations pay a slot write only.
    """
    try:  # noqa: SIM105 (contextlib.suppress costs more on this hot path)
        out._last_op = (source, inverse)
    except AttributeError:
        pass
    return out


def record_lock(parent_ref: Any, child: Any) -> None:
    """Remember that the container behind ``parent_ref`` (a weak reference) locked ``child``."""
    try:  # noqa: SIM105 (contextlib.suppress costs more on this path)
        child._lock_parent = parent_ref
    except AttributeError:  # a container without the slot (a TensorClass)
        pass


def locking_parent(child: Any) -> Any:
    """The locked container that holds ``child`` and locked it, or None."""
    ref = getattr(child, "_lock_parent", None)
    parent = None if ref is None else ref()
    if parent is None or not parent._is_locked:
        return None
    return parent if any(value is child for value in parent._data.values()) else None


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
        return self

    def __getstate__(self) -> dict[str, Any]:
        # a pending exit action (and the container it writes back to) is not state
        slots = {}
        for cls in type(self).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name not in ("__weakref__", "_last_op", "_lock_parent") and hasattr(self, name):
                    slots[name] = getattr(self, name)
        return (getattr(self, "__dict__", None) or None, slots)

    def __exit__(self, exc_type, exc, traceback) -> None:
        action = getattr(self, "_last_op", None)
        if action is not None:
            self._last_op = None
            try:
                if type(action) is tuple:
                    source, inverse = action
                    back = self.reshape(source.batch_size) if inverse is None else inverse(self)
                    source.update(back)
                else:
                    action(self)
            finally:
                self._last_op = None

    @property
    def is_locked(self) -> bool:
        return bool(self._is_locked)

    @is_locked.setter
    def is_locked(self, value: bool) -> None:
        if value:
            self.lock_()  # type: ignore[attr-defined]
        else:
            self.unlock_()  # type: ignore[attr-defined]
