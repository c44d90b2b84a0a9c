"""What a TensorClass instance adds to the shared operations: its state and its own rules.

An instance holds one TensorDict (``_td``). The mixins of
:class:`~tdfunc._core.ops.TensorOps` (indexing, shape ops, apply, arithmetic,
keys, persistence, distributed, map) read a container through ``_data``,
``_batch_size``, ``_device``, ``_names`` and ``_is_locked``; here those are
properties of the inner TensorDict, so every TensorDict method serves every
TensorClass with the same code. What is TensorClass's own lives here, once each:

- results are built by :meth:`TensorClassState._like` in the instance's class
  (results of a frozen class are frozen);
- frozen refusal: :meth:`TensorClassState._check_mutable`;
- casting rules, unset fields and unknown names: :meth:`TensorClassState._write`
  (every write by key: ``set``, ``update``, ``[key] = ...``), through the
  class's converters (:mod:`tdfunc._tensorclass.fields`).

Example:
    >>> class Pair(TensorClass):
    ...     a: torch.Tensor
    ...     b: torch.Tensor
    >>> pair = Pair(torch.zeros(4, 3), torch.ones(4), batch_size=[4])
    >>> type(pair[1:]).__name__, pair.reshape(2, 2).a.shape
    ('Pair', torch.Size([2, 2, 3]))
    >>> (pair.apply(lambda t: t * 2) == pair * 2).all()
    True
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .._core.helpers.frozen import FROZEN, freeze
from .._core.helpers.mixin import is_tensor_collection
from .._core.helpers.nested_keys import MISSING, key_parts
from .._core.helpers.tracing import dynamo_compiling
from .._core.helpers.update import send_for_set
from .._core.helpers.writes import write
from .._core.ops import TensorOps

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Self

    from .._core.container import TensorDictCore

_NO_DEFAULT: Any = MISSING
_new = object.__new__
_setattr = object.__setattr__
# the distributed methods that receive into the tensors: a frozen instance names a way out
_RECEIVERS = frozenset({"recv", "irecv", "broadcast", "all_reduce", "reduce", "scatter"})
# Per TensorClass, its plain TensorDict's ``_new_unsafe`` (the class its
# ``_plain_tensordict`` hook names, composed above this package), found by the class's
# first rebuild: transforms rebuild instances on every call, and asking the hook each
# time costs a call.
_PLAIN_NEW: dict[type, Any] = {}


class TensorClassState(TensorOps):
    """The container state of a TensorClass instance, forwarded to its TensorDict ``_td``."""

    __slots__ = ("_td",)
    if TYPE_CHECKING:
        _tc_frozen: ClassVar[bool]
        _tc_field_names: ClassVar[frozenset[str]]
        _tc_converters: ClassVar[dict[str, Callable]]

    # ------------------------------------------------------------------ state
    @property
    def _data(self) -> dict:  # type: ignore[override]
        return self._td._data

    @_data.setter
    def _data(self, value: dict) -> None:
        self._td._data = value

    @property
    def _batch_size(self) -> torch.Size:  # type: ignore[override]
        return self._td._batch_size

    @_batch_size.setter
    def _batch_size(self, value: torch.Size) -> None:
        self._td._batch_size = value

    @property
    def _device(self) -> torch.device | None:  # type: ignore[override]
        return self._td._device

    @_device.setter
    def _device(self, value: torch.device | None) -> None:
        self._td._device = value

    @property
    def _names(self) -> tuple | None:  # type: ignore[override]
        return self._td._names

    @_names.setter
    def _names(self, value: tuple | None) -> None:
        self._td._names = value

    @property
    def _is_locked(self) -> bool:  # type: ignore[override]
        """Frozen instances are always locked: keys cannot be added, removed or replaced."""
        return self._frozen or self._td._is_locked

    @_is_locked.setter
    def _is_locked(self, value: bool) -> None:
        self._td._is_locked = FROZEN if self._frozen else value

    def _to_tensordict_view(self) -> TensorDictCore:
        """The inner TensorDict (shared, not a copy)."""
        return self._td

    @property
    def _tensordict(self) -> TensorDictCore:
        """The inner TensorDict under tensordict's attribute name (code written for
        tensordict reads ``instance._tensordict``); the same object as the instance holds."""
        return self._td

    # ------------------------------------------------------------------ building
    def _like(self, data: dict, batch_size: torch.Size | None = None, names: Any = _NO_DEFAULT):
        """A new instance of this class holding ``data`` (trusted: no copy, no validation)."""
        td = self._td
        inner = self._plain_tensordict()._new_unsafe(
            data,
            td._batch_size if batch_size is None else batch_size,
            td._device,
            td._names if names is _NO_DEFAULT else names,
        )
        if self._frozen:
            freeze(inner)  # frozen is deep: no write reaches it, not even through a parent
        out = _new(type(self))
        _setattr(out, "_td", inner)  # torch.compile traces object.__setattr__, not slot sets
        return out

    @classmethod
    def _from_pytree(cls, data: dict, batch_size: torch.Size, device=None, names=None) -> Self:
        """Rebuild after a pytree transform or a load (leaves may be ints/None in vmap specs)."""
        if dynamo_compiling():
            # dynamo must not read the cache: it would guard on the dict, and the next
            # class rebuilt anywhere would recompile every compiled function
            make = cls._plain_tensordict()._new_unsafe
        else:
            make = _PLAIN_NEW.get(cls)
            if make is None:
                make = _PLAIN_NEW[cls] = cls._plain_tensordict()._new_unsafe
        inner = make(data, batch_size, device, names)
        if cls._frozen:
            freeze(inner)
        out = _new(cls)
        _setattr(out, "_td", inner)
        return out

    @classmethod
    def _adopt(cls, loaded: Any) -> Any:
        """Data loaded from disk as an instance of this class (a plain TensorDict is wrapped)."""
        if isinstance(loaded, cls):
            return loaded
        return cls.from_tensordict(loaded._to_tensordict_view())  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ own rules
    def _check_mutable(self, api: str) -> None:
        """Frozen refusal: every write of a frozen instance raises ``FrozenInstanceError``.

        An instance of a class that is not frozen refuses too when it is held by a
        frozen one (its TensorDict is frozen: frozen is deep).
        """
        if not self._frozen:
            super()._check_mutable(api)  # type: ignore[misc]
            return
        name = type(self).__name__
        if api in _RECEIVERS:
            hint = (
                f"{api} writes the received values into its tensors. Receive into a TensorDict "
                f"(td = instance.to_tensordict(); td.{api}(...)) and rebuild the instance with "
                f"{name}.from_tensordict(td)"
            )
        else:
            hint = f"use the out-of-place version (it returns a new {name})"
        raise dataclasses.FrozenInstanceError(
            f"{name}.{api}: {name} is frozen and cannot be modified; {hint}."
        )

    def set(self, key, value: Any, *, inplace: bool = False, non_blocking: bool = False) -> Self:
        """Write ``value`` at ``key`` (a field is cast by the class flags); returns self.

        The same as ``TensorDict.set`` without its fast path, which stores a tensor
        as it is: here every write goes through the casting rules of :meth:`_write`.

        Example:
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            >>> Foo(x=torch.zeros(3), batch_size=[3]).set("x", torch.ones(3)).x
            tensor([1., 1., 1.])
        """
        if non_blocking and isinstance(value, torch.Tensor):
            value = send_for_set(self, key, value, inplace)
        if type(key) is str and not inplace and key in self._tc_field_names:
            self._write_field(key, value)  # the same rules, without the engine's bookkeeping
        else:
            self._write(((key, value),), inplace, False, "set")
        return self

    def _write(self, items, inplace, merge: bool, api: str, prefix: tuple = ()) -> None:
        """Write by key with the class's casting rules, then through the shared engine.

        A field gets its value cast by the class flags; ``None`` unsets a field; a
        name that is neither a field nor an existing key is an ``AttributeError``.
        """
        self._check_mutable(api)
        cls = type(self)
        fields = cls._tc_field_names
        td = self._td
        data = td._data
        staged = []
        unset = []
        for key, value in items:
            parts = key_parts(key, f"{cls.__name__}.{api}")
            head = parts[0]
            if head not in data:
                if head not in fields:
                    raise _unknown_name(cls, api, head)
                if len(parts) > 1:
                    raise KeyError(
                        f"{cls.__name__}.{api}: cannot write {key!r}: field {head!r} is None, "
                        f"not a TensorDict or tensorclass."
                    )
            if len(parts) > 1 or head not in fields:
                staged.append((key, value))
                continue
            if value is None:
                unset.append(head)
                continue
            existing = data.get(head)
            if (inplace and isinstance(existing, torch.Tensor)) or (
                merge and is_tensor_collection(existing) and isinstance(value, Mapping)
            ):
                staged.append((head, value))  # an in-place copy or a merge: the engine's rules
                continue
            convert = cls._tc_converters[head]
            staged.append((head, convert(cls.__name__, head, value, td._batch_size, td._device)))
        write(self, staged, inplace, merge, api, prefix)
        for name in unset:
            if name in data:
                self._check_writable(api, name)
                del data[name]

    def _write_field(self, name: str, value: Any) -> None:
        """``instance.field = value``: cast by the class flags and store (the fast path).

        A frozen class's instance takes the write only while it is built (its
        TensorDict is not frozen yet): ``object.__setattr__`` in ``__post_init__``.
        """
        td = self._td
        if self._frozen:
            if td._is_locked == FROZEN:
                self._check_mutable(name)
            self._write_unchecked(name, value)  # type: ignore[attr-defined]
            return
        if value is None or td._is_locked:
            self._write(((name, value),), False, False, name)
            return
        td._data[name] = type(self)._tc_converters[name](
            type(self).__name__, name, value, td._batch_size, td._device
        )


def _unknown_name(cls: type, api: str, name: str) -> AttributeError:
    fields = sorted(cls._tc_field_names)  # type: ignore[attr-defined]
    close = difflib.get_close_matches(name, fields, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return AttributeError(
        f"{cls.__name__}.{api}: {name!r} is not a field of {cls.__name__}; the fields are "
        f"{fields}.{hint}"
    )


def _set_td(instance: Any, td: Any) -> None:
    """Store the inner TensorDict: a slot write past the class's ``__setattr__`` (frozen
    classes too). ``object.__setattr__`` rather than the slot descriptor's ``__set__``:
    torch.compile traces the first and breaks the graph on the second."""
    _setattr(instance, "_td", td)
