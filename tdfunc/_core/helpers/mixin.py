"""The base of the shared method mixins: what they may use of the container.

Each mixin (shape ops, apply, arithmetic, access, ...) lives in its own module and
reads the container only through the state declared here. ``TensorDict`` keeps
that state in slots; a ``TensorClass`` instance forwards it to its inner
TensorDict. Results are built with ``self._like(data, batch_size, names)`` (a
container of the same kind as ``self``) or, when the result is a plain TensorDict
whatever ``self`` is, with ``self._plain_tensordict()`` (the class is composed
above the core, in ``tdfunc/_assembly.py``: the core never imports it), structural
writes are checked with
``self._check_writable(api, key)`` and value writes with ``self._check_mutable(api)``
(a frozen TensorClass refuses both).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .fastpath import is_tensor_kind, node_kind
from .nontensor import LinkedList, NonTensorData, NonTensorStack

if TYPE_CHECKING:
    from typing_extensions import Self


for _leaf in (NonTensorData, NonTensorStack):  # met by every container with such leaves
    is_tensor_kind[_leaf], node_kind[_leaf]


def is_tensor_collection(obj: object) -> bool:
    """True for a ``TensorDict`` or a ``TensorClass`` instance.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict
        >>> is_tensor_collection(TensorDict()), is_tensor_collection({})
        (True, False)
    """
    return getattr(type(obj), "_is_tensor_collection", False)


def is_tensor_collection_or_class(obj: object) -> bool:
    """True for a ``TensorDict``, a ``TensorClass`` or a non-tensor leaf, given an instance
    or the class.

    The public ``is_tensor_collection``: tensordict documents it for classes too, and
    counts its non-tensor leaves (tensorclasses there) in; their ``keys()`` are empty.
    The core asks about values only (``is_tensor_collection``), where a class stored as
    non-tensor data must stay data, and a non-tensor leaf is a leaf.

    Example:
        >>> from tdfunc import TensorDict, is_tensor_collection
        >>> is_tensor_collection(TensorDict()), is_tensor_collection(TensorDict)
        (True, True)
        >>> is_tensor_collection({}), is_tensor_collection(dict)
        (False, False)
        >>> is_tensor_collection(NonTensorData("a")), is_tensor_collection(NonTensorStack)
        (True, True)
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return bool(getattr(cls, "_is_tensor_collection", False)) or issubclass(cls, NonTensorData)


class _CollectionCheck(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return is_tensor_collection_or_class(type(instance))

    def __subclasscheck__(cls, subclass: type) -> bool:
        return isinstance(subclass, type) and is_tensor_collection_or_class(subclass)


class TensorCollection(metaclass=_CollectionCheck):
    """ "A TensorDict or a TensorClass", for ``isinstance`` checks and type hints.

    True for ``TensorDict``, every ``TensorClass`` and the non-tensor leaves (as
    ``is_tensor_collection``); it is not a base to inherit from or to instantiate.

    Example:
        >>> import torch
        >>> from tdfunc import TensorCollection, TensorDict
        >>> isinstance(TensorDict(), TensorCollection), isinstance(torch.zeros(3), TensorCollection)
        (True, False)
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        raise TypeError(
            "TensorCollection is for isinstance checks and type hints; build a TensorDict "
            "or a TensorClass instance instead."
        )


def read_value(value: Any) -> Any:
    """What reading a stored value returns: non-tensor leaves give their Python value."""
    if isinstance(value, NonTensorData):
        if type(value) is NonTensorStack:  # item writes to the list reach the stack
            return LinkedList(value)
        return value._value()
    return value


FROZEN = 2  # the value of ``_is_locked`` in a frozen TensorClass's TensorDicts (frozen.py)

# Every refusal of a locked container carries this sentence, word for word as tensordict
# words it, so that code matching tensordict's lock errors keeps matching tdfunc's.
LOCK_ERROR = (
    "Cannot modify locked TensorDict. For in-place modification, consider using the "
    "`set_()` method and make sure the key is present."
)

# Public methods ending in "_" change the container in place, so each one asks
# ``_check_mutable`` first (wrapped below, when the class is defined: a new in-place
# method cannot forget). The exceptions, with why they are allowed on frozen data:
MUTABLE_WHEN_FROZEN = {
    "lock_": "a frozen container is locked already; locking it changes nothing",
    "unlock_": "documented as a no-op on frozen data: it stays frozen (and locked)",
}


def _is_mutator(name: str, value: Any) -> bool:
    return (
        name.endswith("_")
        and not name.startswith("_")
        and name not in MUTABLE_WHEN_FROZEN
        and isinstance(value, types.FunctionType)
        and not getattr(value, "_asks_check_mutable", False)
    )


def _checks_mutable(name: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def checked(self, *args: Any, **kwargs: Any) -> Any:
        self._check_mutable(name)
        return method(self, *args, **kwargs)

    checked._asks_check_mutable = True  # type: ignore[attr-defined]
    return checked


class ContainerMixin:
    """Declarations shared by the mixins of ``TensorDict`` and ``TensorClass``."""

    __slots__ = ()

    _batch_size: torch.Size
    _data: dict
    _device: torch.device | None
    _names: tuple | None
    _is_locked: bool
    # a frozen TensorClass refuses every write; unset fields of a TensorClass read None
    _frozen: ClassVar[bool] = False
    _field_names: ClassVar[frozenset[str]] = frozenset()
    # tensordict: a TensorDict's get gives NonTensorData, a tensorclass's the value
    _get_reads_value: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        node_kind[cls]  # classified now, not while dynamo traces (see fastpath)
        if "__torch_function__" not in vars(cls):
            # torch looks this name up with a string it builds per call, which Python's type
            # cache (keyed on the string object) never holds: every torch.stack / cat /
            # unbind of containers walked the MRO (40 classes) to the mixin defining it,
            # once per container in the list. A copy in the class's own dict ends the walk
            # at the first class. It is the inherited descriptor itself (same behaviour).
            for base in cls.__mro__[1:]:
                found = base.__dict__.get("__torch_function__")
                if found is not None:
                    cls.__torch_function__ = found
                    break
        if cls.__module__.startswith("tdfunc."):
            for name, value in list(vars(cls).items()):
                if _is_mutator(name, value):
                    setattr(cls, name, _checks_mutable(name, value))

    @classmethod
    def _plain_tensordict(cls) -> type:
        """The public ``TensorDict`` class; the composed classes (``tdfunc._assembly``) say."""
        raise NotImplementedError(
            f"{cls.__name__}: a container class must say which class is the plain TensorDict "
            f"(define _plain_tensordict); the classes composed in tdfunc._assembly do."
        )

    def _check_mutable(self, api: str) -> None:
        """The one "may this container change?" hook, asked by every mutator and setter.

        A TensorDict inside a frozen TensorClass (``_is_locked == FROZEN``) refuses;
        a frozen TensorClass overrides this to raise ``FrozenInstanceError``.
        """
        if self._is_locked == FROZEN:
            raise RuntimeError(
                f"{type(self).__name__}.{api}: this TensorDict belongs to a frozen TensorClass, "
                f"which refuses every change (values, keys, batch size, names, requires_grad); "
                f"nothing was changed. Build a new container out of place instead (clone(), "
                f"apply(...), +, ...)."
            )

    @classmethod
    def _adopt(cls, loaded: Any) -> Any:
        """``loaded`` (a container built elsewhere, e.g. from disk) as this class would give it.

        A TensorDict takes it as it is (a saved TensorClass loads as that class); a
        TensorClass wraps a plain TensorDict in itself.
        """
        return loaded

    if TYPE_CHECKING:

        def _like(
            self, data: dict, batch_size: torch.Size | None = ..., names: Any = ...
        ) -> Self: ...
        def _check_writable(self, api: str, key: Any) -> None: ...
        def _get_leaf(self, key: Any, api: str = ...) -> Any: ...
        def _shallow_copy(self) -> Any: ...
        def _apply_tree(self, fn: Any, *args: Any, **kwargs: Any) -> Any: ...
        def _tensor_leaves(self) -> Any: ...
        def _to_tensordict_view(self) -> Any: ...
        def _missing(self, key: Any, api: str = ..., prefix: tuple = ...) -> KeyError: ...
