"""``LinkedList``: the list a ``NonTensorStack`` entry reads as; item writes reach the stack."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .leaves import NonTensorData


class LinkedList(list):
    """The list that reading a ``NonTensorStack`` entry returns; item writes reach the stack.

    Writing an item (``td["a"][0] = "x"``) writes it into the stack the list was read
    from; a change of length (``append``, ``extend``, ...) cannot, so it detaches
    the list (``_td()`` is then None) and changes only the list.

    Example:
        >>> td = TensorDict({"a": NonTensorStack("foo", "bar")}, [2])
        >>> td["a"][0] = "baz"
        >>> td["a"]
        LinkedList(['baz', 'bar'])
    """

    __slots__ = ("_ref",)

    def __init__(self, stack: NonTensorData) -> None:
        super().__init__(stack.data)
        self._ref: Any = weakref.ref(stack)

    def _td(self) -> NonTensorData | None:
        """The stack this list writes to, or None once detached."""
        return None if self._ref is None else self._ref()

    def __setitem__(self, index: Any, value: Any) -> None:
        before = len(self)
        list.__setitem__(self, index, value)
        stack = self._td()
        if stack is None:
            return
        if len(self) != before:  # a slice write that changed the length: the stack cannot
            self._ref = None
            return
        stack._set_value(list(self))

    def _detached(name: str):
        method = getattr(list, name)

        def detach(self, *args: Any, **kwargs: Any) -> Any:
            self._ref = None
            return method(self, *args, **kwargs)

        detach.__name__ = name
        detach.__doc__ = f"``list.{name}``; the list no longer writes to the stack after it."
        return detach

    append = _detached("append")
    extend = _detached("extend")
    insert = _detached("insert")
    pop = _detached("pop")
    remove = _detached("remove")
    clear = _detached("clear")
    __delitem__ = _detached("__delitem__")
    __iadd__ = _detached("__iadd__")
    __imul__ = _detached("__imul__")
    del _detached

    def tolist(self) -> list:
        """The values as plain nested lists (a copy: writes to it reach nothing)."""
        return _plain_lists(self)

    def __repr__(self) -> str:
        return f"LinkedList({list.__repr__(self)})"

    __str__ = __repr__

    def __reduce__(self) -> Any:  # pickles as the plain list it holds
        return list, (list(self),)


def _plain_lists(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain_lists(item) for item in value]
    return value
