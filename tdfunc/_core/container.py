"""``TensorDictCore``: the state and construction of ``TensorDict``.

This class holds construction only: every other method comes from the shared
mixins of :class:`~tdfunc._core.ops.TensorOps` (which ``TensorClass`` shares) and
from the features; the public ``TensorDict`` is composed from them in
``tdfunc/_assembly.py``.
Validation happens at the boundary (the public constructor, ``set``,
``__setitem__``, ``update``). Every derived result (indexing, ``apply``,
shape operations, ``stack``) is built through :meth:`TensorDict._new_unsafe`,
which trusts its inputs.

Writes are atomic: a ``set`` or ``update`` that fails (a bad value, a locked
container, a missing key) leaves the container as it was. Structural writes
are recorded in an undo log; in-place copies are validated first and performed
only once every entry has been checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .helpers.device import as_device
from .helpers.hooks import HOOKS
from .helpers.mixin import is_tensor_collection
from .helpers.nested_keys import MISSING
from .helpers.sizes import SIZE_CACHE, as_size, size_info
from .helpers.update import moved
from .helpers.writes import build_fast, items_of
from .ops import TensorOps

_NO_DEFAULT = MISSING
_Tensor = torch.Tensor
_Size = torch.Size


class TensorDictCore(TensorOps):
    """The state (slots) and construction of ``TensorDict``, over the core operations.

    The public ``TensorDict`` adds the features' methods and the hooks that name
    the composed classes (``tdfunc/_assembly.py``); its docstring lists the
    arguments of ``__init__`` below.

    Example:
        >>> issubclass(TensorDict, TensorDictCore), type(TensorDict({}, [])) is TensorDict
        (True, True)
    """

    __slots__ = (
        "__weakref__",
        "_batch_size",
        "_consolidation",  # the storage consolidate() packed the leaves into (unset: none)
        "_data",
        "_device",
        "_exits",  # the exit actions of the `with` blocks entered, innermost last (context.py)
        "_is_locked",
        "_last_op",  # a pending `with` exit action (context.py)
        "_names",
        "_parent",  # weak reference to the container holding this one (context.py)
    )
    _is_tensor_collection = True
    _is_tensordict = True  # TensorDict and its subclasses (not TensorClass)

    def __init__(
        self,
        source: Mapping | None = None,
        batch_size=None,
        device=None,
        names=None,
        non_blocking: bool | None = None,
        lock: bool = False,
        **entries: Any,
    ) -> None:
        if entries:  # TensorDict(a=tensor, b=tensor, batch_size=[3]), as in tensordict
            if source is not None:
                raise ValueError(
                    "TensorDict: pass the entries either as source or as keyword arguments, "
                    f"not both (got source and {sorted(entries)})."
                )
            source = entries
        if type(source) is dict and device is None:
            # fast path: str keys, plain tensors and dicts (anything else takes the full path)
            info = None
            kind = type(batch_size)
            if kind is list or kind is tuple or kind is _Size:  # size_key inlined (why only ints)
                for item in batch_size:
                    if type(item) is not int:
                        break
                else:
                    info = SIZE_CACHE.get(tuple(batch_size))
            size, ndim, first, second = info or size_info(batch_size)
            data = build_fast(type(self), source, size, ndim, first, second)
            if data is not None:
                self._data = data
                self._batch_size = size
                self._device = None
                self._names = None
                self._is_locked = False
                if names is not None:
                    self.names = names
                if lock:
                    self.lock_()
                return
        if non_blocking and device is not None and isinstance(source, Mapping):
            source = moved(source, torch.device(device))
        given: Any = source
        inherit = batch_size is None and is_tensor_collection(given)
        size = given.batch_size if inherit else as_size(batch_size)
        self._data = {}
        self._batch_size = size
        self._device = None if device is None else as_device(device)
        self._names = given._to_tensordict_view()._names if inherit else None
        self._is_locked = False
        if names is not None:
            self.names = names
        if source is not None:
            if not isinstance(source, Mapping) and not is_tensor_collection(source):
                raise TypeError(
                    f"TensorDict: source must be a mapping (dict, TensorDict, ...), got "
                    f"{type(source).__name__}."
                )
            self._write(items_of(source, "__init__"), False, True, "__init__")
        if lock:
            self.lock_()

    @classmethod
    def _new_unsafe(cls, data: dict, batch_size: torch.Size, device=None, names=None):
        """Build from trusted parts: no copy, no validation."""
        self = object.__new__(cls)
        self._data = data
        self._batch_size = batch_size
        self._device = device
        self._names = names
        self._is_locked = False
        return self

    def _like(self, data: dict, batch_size: torch.Size | None = None, names=_NO_DEFAULT):
        """A new container of the same kind with ``data`` (trusted)."""
        out = object.__new__(type(self))
        out._data = data
        out._batch_size = self._batch_size if batch_size is None else batch_size
        out._device = self._device
        out._names = self._names if names is _NO_DEFAULT else names
        out._is_locked = False
        return out

    # Rebuild after a pytree transform (``_pytree/rebuild.py``): trusted, like _new_unsafe.
    _from_pytree = _new_unsafe

    __hash__ = None  # type: ignore[assignment]


def __getattr__(name: str) -> Any:
    # Pickles written before the composition root name ``tdfunc._core.container.TensorDict``:
    # that path resolves to the public class (by its stable name, without an import).
    if name == "TensorDict":
        return HOOKS.tensordict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
