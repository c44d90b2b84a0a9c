"""``TensorDict``: a dict of tensors sharing leading batch dimensions.

Validation happens here, at the boundary (the public constructor, ``set``,
``__setitem__``, ``update``). Every derived result (indexing, ``apply``,
shape operations, ``stack``) is built through :meth:`TensorDict._new_unsafe`,
which trusts its inputs.

Writes are atomic: a ``set`` or ``update`` that fails (a bad value, a locked
container, a missing key) leaves the container as it was. Structural writes
are recorded in an undo log; in-place copies are validated first and performed
only once every entry has been checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .._distributed.collectives import DistributedMixin
from .._distributed.map import MapMixin
from .._functional.module_swap import ModuleSwapMixin
from .._functional.pytree import register as _register_pytree
from .._persist.api import PersistMixin
from .apply import ApplyMixin
from .arith import ArithmeticMixin
from .fastpath import contains_missed, get_path, lookup_nested, pop_fast, set_fast
from .keys import MISSING, KeysView, is_key, key_parts, missing_key_error, unravel_key
from .nontensor import NonTensorData, NonTensorStack
from .registry import register_class
from .repr import td_repr
from .shape_ops import ShapeOpsMixin
from .shapes import SIZE_CACHE, as_size, size_info
from .torch_function import TorchFunctionMixin
from .writes import build_fast, full_key, items_of, rename_key, write, write_path

_NO_DEFAULT = MISSING
_Tensor = torch.Tensor


def is_tensor_collection(obj: object) -> bool:
    """True for a ``TensorDict`` or a ``TensorClass`` instance."""
    return getattr(type(obj), "_is_tensor_collection", False)


def _read(value: Any) -> Any:
    """What reading a stored value returns: non-tensor leaves give their Python value."""
    if isinstance(value, NonTensorData):
        return value.tolist()
    return value


class TensorDict(
    ShapeOpsMixin,
    ArithmeticMixin,
    ApplyMixin,
    TorchFunctionMixin,
    ModuleSwapMixin,
    PersistMixin,
    DistributedMixin,
    MapMixin,
):
    """A dictionary of tensors that share leading batch dimensions.

    Args:
        source: a mapping from keys (``str`` or tuples of ``str``) to tensors,
            nested mappings, ``TensorDict`` instances or any Python object.
        batch_size: the leading dims every value shares. Defaults to ``[]``.
        device: if given, every value written is moved to this device.
        names: optional names of the batch dims.
        lock: lock the result (see :meth:`lock_`).

    Example:
        >>> td = TensorDict({"a": torch.zeros(3, 4), "b": {"c": torch.ones(3)}}, [3])
        >>> td["b", "c"].shape
        torch.Size([3])
        >>> td[1:].batch_size
        torch.Size([2])
    """

    __slots__ = ("__weakref__", "_batch_size", "_data", "_device", "_is_locked", "_names")
    _is_tensor_collection = True
    _is_tensordict = True  # TensorDict and its subclasses (not TensorClass)

    def __init__(
        self,
        source: Mapping | None = None,
        batch_size=None,
        device=None,
        names=None,
        *,
        lock: bool = False,
    ) -> None:
        if type(source) is dict and device is None:
            # fast path: str keys, plain tensors and dicts (anything else takes the full path)
            info = None
            if type(batch_size) is list:
                try:
                    info = SIZE_CACHE.get(tuple(batch_size))
                except TypeError:  # unhashable items: size_info gives the error
                    info = None
            size, ndim, first, second = info or size_info(batch_size)
            data = build_fast(TensorDict, source, size, ndim, first, second)
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
        given: Any = source
        inherit = batch_size is None and is_tensor_collection(given)
        size = given.batch_size if inherit else as_size(batch_size)
        self._data = {}
        self._batch_size = size
        self._device = None if device is None else torch.device(device)
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

    # Rebuild after a pytree transform (``_pytree_rebuild.py``): trusted, like _new_unsafe.
    _from_pytree = _new_unsafe

    @classmethod
    def fromkeys(cls, keys, value: Any = 0, batch_size=None, device=None) -> TensorDict:
        """A TensorDict with every key in ``keys`` holding ``value`` (tensors are cloned).

        Example:
            >>> TensorDict.fromkeys(["a", ("nested", "e")], 0)["nested", "e"]
            tensor(0)
        """
        out = cls({}, batch_size=batch_size, device=device)
        items = [(k, value.clone() if isinstance(value, _Tensor) else value) for k in keys]
        out._write(items, False, True, "fromkeys")
        return out

    # ------------------------------------------------------------------ shape
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value) -> None:
        size = as_size(value, "TensorDict.batch_size")
        ndim = len(size)
        for key, item in self._data.items():
            if isinstance(item, NonTensorData):
                continue
            if item.shape[:ndim] != size:
                raise ValueError(
                    f"TensorDict.batch_size: cannot set batch size {list(size)}: the value at "
                    f"key {key!r} has shape {list(item.shape)}."
                )
        for key, item in self._data.items():
            if type(item) is NonTensorData:
                self._data[key] = NonTensorData._make(item.data, size, item.device)
            elif isinstance(item, NonTensorStack) and item.batch_size[:ndim] != size:
                raise ValueError(
                    f"TensorDict.batch_size: cannot set batch size {list(size)}: the "
                    f"non-tensor stack at key {key!r} has batch size {list(item.batch_size)}."
                )
        if self._names is not None and len(size) != len(self._names):
            self._names = None
        self._batch_size = size

    @property
    def shape(self) -> torch.Size:
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        return len(self._batch_size)

    ndim = batch_dims

    def dim(self) -> int:
        return len(self._batch_size)

    def numel(self) -> int:
        return self._batch_size.numel()

    def size(self, dim: int | None = None):
        return self._batch_size if dim is None else self._batch_size[dim]

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def names(self) -> list:
        """Names of the batch dims (``None`` for an unnamed dim), one per batch dim."""
        if self._names is None:
            return [None] * len(self._batch_size)
        return list(self._names)

    @names.setter
    def names(self, value) -> None:
        if value is None:
            self._names = None
            return
        value = tuple(value)
        if len(value) != len(self._batch_size):
            raise ValueError(
                f"TensorDict.names: expected {len(self._batch_size)} names for batch size "
                f"{list(self._batch_size)}, got {list(value)}."
            )
        for name in value:
            if name is not None and not isinstance(name, str):
                raise TypeError(f"TensorDict.names: names must be str or None, got {name!r}.")
        given = [n for n in value if n is not None]
        if len(set(given)) != len(given):
            raise ValueError(f"TensorDict.names: names must be unique, got {list(value)}.")
        self._names = value if given else None

    def refine_names(self, *names) -> TensorDict:
        """Set the names of the batch dims in place (``...`` is not supported); returns self."""
        self.names = names[0] if len(names) == 1 and isinstance(names[0], (list, tuple)) else names
        return self

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator[TensorDict]:
        if not self._batch_size:
            raise TypeError(
                "TensorDict: iteration over a TensorDict with batch_size=[] is not "
                "possible; iterate over td.keys() or td.items() instead."
            )
        return iter(self.unbind(0))

    def __bool__(self) -> bool:
        raise RuntimeError(
            "TensorDict: the truth value of a TensorDict is ambiguous; use .all() or .any()."
        )

    # ------------------------------------------------------------------ reading
    def __getitem__(self, index) -> Any:
        kind = type(index)
        if kind is str:
            try:
                value = self._data[index]
            except KeyError:
                raise self._missing(index, "__getitem__") from None
        elif kind is tuple:
            value = lookup_nested(self, index)  # fast path: flat tuples of str, any depth
            if value is _NO_DEFAULT:
                if not is_key(index):
                    return self._index(index)
                value = self._get_leaf(index, "__getitem__")
        else:
            return self._index(index)
        return value if type(value) is _Tensor else _read(value)

    def get(self, key, default: Any = _NO_DEFAULT) -> Any:
        """The value at ``key`` (a ``str`` or nested tuple); non-tensor leaves give their value.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}}, [])
            >>> td.get(("a", "b"))
            tensor(0.)
            >>> td.get("missing", None) is None
            True
        """
        if type(key) is str:
            value = self._data.get(key, _NO_DEFAULT)
        else:
            value = lookup_nested(self, key)  # fast path: flat tuples of str, any depth
            if value is _NO_DEFAULT:
                value = self._get_nested(key_parts(key, "TensorDict.get"))
        if value is _NO_DEFAULT:
            if default is _NO_DEFAULT:
                raise self._missing(key, "get")
            return default
        return value if type(value) is _Tensor else _read(value)

    def _get_nested(self, parts: tuple) -> Any:
        """The stored value at ``parts``, or ``_NO_DEFAULT`` (also when a leaf is in the way)."""
        return get_path(self, parts)

    def _get_leaf(self, key, api: str = "get") -> Any:
        """The stored value (``NonTensorData`` not unwrapped), or raise ``KeyError``."""
        if type(key) is str:
            value = self._data.get(key, _NO_DEFAULT)
        else:
            value = self._get_nested(key_parts(key, f"TensorDict.{api}"))
        if value is _NO_DEFAULT:
            raise self._missing(key, api)
        return value

    def _missing(self, key, api: str = "get", prefix: tuple = ()) -> KeyError:
        """A ``KeyError`` for ``key`` naming where the path stops and the closest keys."""
        parts = key_parts(key, f"TensorDict.{api}")
        node: Any = self
        for depth, part in enumerate(parts):
            if not is_tensor_collection(node):
                return KeyError(
                    f"TensorDict.{api}: key {full_key(prefix, parts)!r} not found: "
                    f"{prefix + parts[:depth]!r} holds a {type(node).__name__}, not a TensorDict."
                )
            data = node._to_tensordict_view()._data
            if part not in data:
                above = prefix + parts[:depth]
                where = f" under {above!r}" if above else ""
                return missing_key_error(part, data, where, f"TensorDict.{api}")
            node = data[part]
        return KeyError(f"TensorDict.{api}: key {full_key(prefix, parts)!r} not found.")

    def __contains__(self, key) -> bool:
        if type(key) is str:
            return key in self._data
        return lookup_nested(self, key) is not _NO_DEFAULT or contains_missed(self, key)

    def keys(
        self, include_nested: bool = False, leaves_only: bool = False, *, sort: bool = False
    ) -> KeysView:
        """The keys; nested keys (as tuples) too with ``include_nested=True``.

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(())}})
            >>> list(td.keys(include_nested=True, leaves_only=True))
            ['a', ('b', 'c')]
        """
        return KeysView(self, include_nested, leaves_only, sort)

    def values(self, include_nested: bool = False, leaves_only: bool = False):
        """The values, in key order (non-tensor leaves as their Python values)."""
        for _, value in self._iter_items((), include_nested, leaves_only):
            yield _read(value)

    def items(self, include_nested: bool = False, leaves_only: bool = False):
        """``(key, value)`` pairs, in key order (non-tensor leaves as their Python values)."""
        for key, value in self._iter_items((), include_nested, leaves_only):
            yield key, _read(value)

    def _iter_items(self, prefix: tuple, include_nested: bool, leaves_only: bool):
        """``(key, stored value)`` pairs; keys are tuples below the top level."""
        for key, value in self._data.items():
            full = prefix + (key,) if prefix else key
            nested = is_tensor_collection(value)
            if not (nested and leaves_only):
                yield full, value
            if nested and include_nested:
                inner = value if type(value) is TensorDict else value._to_tensordict_view()
                yield from inner._iter_items(
                    full if type(full) is tuple else (full,), include_nested, leaves_only
                )

    def _iter_keys(self, prefix: tuple, include_nested: bool, leaves_only: bool):
        for key, _ in self._iter_items(prefix, include_nested, leaves_only):
            yield key

    def is_empty(self) -> bool:
        """True when there is no leaf, at any depth."""
        return not any(True for _ in self._iter_items((), True, True))

    # ------------------------------------------------------------------ writing
    def _check_writable(self, api: str, key) -> None:
        if self._is_locked:
            raise RuntimeError(
                f"TensorDict.{api}: cannot add, delete or rename key {key!r}: the TensorDict "
                f"is locked. Write in place (td.set_(key, value)) or call td.unlock_() first."
            )

    def _write(self, items, inplace, merge: bool, api: str, prefix: tuple = ()) -> None:
        """Write ``(key, value)`` pairs atomically (see ``_writes.write``)."""
        write(self, items, inplace, merge, api, prefix)

    def set(self, key, value: Any, *, inplace: bool = False) -> TensorDict:
        """Write ``value`` at ``key`` (creating nested TensorDicts as needed); returns self.

        With ``inplace=True`` an existing tensor is written in place. On a locked
        TensorDict existing entries are always written in place.

        Example:
            >>> td = TensorDict({}, [2])
            >>> td.set(("a", "b"), torch.zeros(2, 5))["a", "b"].shape
            torch.Size([2, 5])
        """
        if not inplace and set_fast(self, key, value):  # a tensor under existing levels
            return self
        self._write(((key, value),), inplace, False, "set")
        return self

    def set_(self, key, value: Any) -> TensorDict:
        """Copy ``value`` into the existing entry at ``key`` (in place); returns self.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> before = td["a"]
            >>> _ = td.set_("a", torch.ones(2))
            >>> before.tolist()
            [1.0, 1.0]
        """
        self._write(((key, value),), "strict", False, "set_")
        return self

    def __setitem__(self, index, value: Any) -> None:
        kind = type(index)
        if (kind is str or kind is tuple) and set_fast(self, index, value):
            return  # fast path: a tensor under existing, unlocked levels
        if kind is str or is_key(index):
            self.set(index, value)
        else:
            self._set_at_index(index, value)

    def update(self, other: Mapping, *, inplace: bool = False) -> TensorDict:
        """Write every entry of ``other``; nested mappings merge into nested TensorDicts.

        Atomic: when an entry is invalid, nothing is written.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}})
            >>> sorted(td.update({"a": {"c": torch.ones(())}}).keys(True, True))
            [('a', 'b'), ('a', 'c')]
        """
        self._write(items_of(other, "update"), inplace, True, "update")
        return self

    def update_(self, other: Mapping) -> TensorDict:
        """Copy every entry of ``other`` into the existing entries (in place, atomic)."""
        self._write(items_of(other, "update_"), "strict", True, "update_")
        return self

    def setdefault(self, key, default: Any) -> Any:
        """The value at ``key``; if missing, write ``default`` there first."""
        if key not in self:
            self.set(key, default)
        return self.get(key)

    def __delitem__(self, key) -> None:
        self.del_(key)

    def del_(self, key) -> TensorDict:
        """Remove ``key`` (nested keys too); returns self."""
        parts = key_parts(key, "TensorDict.del_")
        node = self._get_leaf(parts[:-1], "del_") if len(parts) > 1 else self
        if not is_tensor_collection(node):
            raise self._missing(key, "del_")
        node = node._to_tensordict_view()
        if parts[-1] not in node._data:
            raise self._missing(key, "del_")
        node._check_writable("del_", unravel_key(key))
        del node._data[parts[-1]]
        return self

    def pop(self, key, default: Any = _NO_DEFAULT) -> Any:
        """Remove ``key`` and return its value (or ``default`` when missing)."""
        value = pop_fast(self, key)  # fast path: unlocked TensorDicts all the way
        if value is not _NO_DEFAULT:
            return value if type(value) is _Tensor else _read(value)
        value = self._get_nested(key_parts(key, "TensorDict.pop"))
        if value is _NO_DEFAULT:
            if default is _NO_DEFAULT:
                raise self._missing(key, "pop")
            return default
        self.del_(key)
        return _read(value)

    def clear(self) -> TensorDict:
        """Remove every key; returns self."""
        if self._data:
            self._check_writable("clear", list(self._data))
        self._data.clear()
        return self

    def rename_key_(self, old_key, new_key, safe: bool = False) -> TensorDict:
        """Rename ``old_key`` to ``new_key`` in place (atomic); returns self.

        With ``safe=True`` an existing ``new_key`` is an error instead of being replaced.

        Example:
            >>> td = TensorDict({"a": torch.zeros(())})
            >>> list(td.rename_key_("a", ("b", "c")).keys(True, True))
            [('b', 'c')]
        """
        rename_key(self, old_key, new_key, safe)
        return self

    # ------------------------------------------------------------------ key views
    def select(self, *keys, strict: bool = True, inplace: bool = False) -> TensorDict:
        """A TensorDict holding only ``keys`` (sharing the tensors).

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(()), "d": 0}})
            >>> list(td.select("a", ("b", "c")).keys(True, True))
            ['a', ('b', 'c')]
        """
        out = self._like({})
        for key in keys:
            parts = key_parts(key, "TensorDict.select")
            value = self._get_nested(parts)
            if value is _NO_DEFAULT:
                if strict:
                    raise self._missing(key, "select")
                continue
            node, source = out, self
            for part in parts[:-1]:
                source = source._data[part]._to_tensordict_view()
                if part not in node._data:
                    node._data[part] = source._like({})
                node = node._data[part]
            node._data[parts[-1]] = value._shallow_copy() if type(value) is TensorDict else value
        if inplace:
            self._check_writable("select", keys)
            self._data = out._data
            return self
        return out

    def exclude(self, *keys, inplace: bool = False) -> TensorDict:
        """A TensorDict without ``keys`` (sharing the tensors); missing keys are ignored."""
        if inplace and keys:
            self._check_writable("exclude", keys)
        out = self if inplace else self._shallow_copy()
        for key in keys:
            parts = key_parts(key, "TensorDict.exclude")
            node: Any = out
            for part in parts[:-1]:
                node = node._data.get(part)
                if type(node) is not TensorDict:
                    node = None
                    break
            if node is not None:
                node._data.pop(parts[-1], None)
        return out

    def _shallow_copy(self) -> TensorDict:
        """A copy of the key structure (nested TensorDicts too) sharing the leaves."""
        return self._like(
            {k: v._shallow_copy() if type(v) is TensorDict else v for k, v in self._data.items()}
        )

    def copy(self) -> TensorDict:
        """A shallow copy: new (nested) TensorDicts holding the same tensors."""
        return self._shallow_copy()

    __copy__ = copy

    def empty(self, recurse: bool = False) -> TensorDict:
        """A TensorDict with the same batch size and no keys (no leaves with ``recurse``)."""
        if not recurse:
            return self._like({})
        return self._like(
            {
                k: v._to_tensordict_view().empty(True)
                for k, v in self._data.items()
                if is_tensor_collection(v)
            }
        )

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDict:
        """Flatten nested keys into single keys joined by ``separator``.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}}, [])
            >>> list(td.flatten_keys(".").keys())
            ['a.b']
        """
        data: dict = {}
        for key, value in self._iter_items((), True, True):
            name = key if type(key) is str else separator.join(key)
            if name in data:
                raise KeyError(
                    f"TensorDict.flatten_keys: two keys flatten to {name!r}; choose another "
                    f"separator than {separator!r}."
                )
            data[name] = value
        if inplace:
            self._check_writable("flatten_keys", separator)
            self._data = data
            return self
        return self._like(data)

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDict:
        """Split keys on ``separator`` into nested TensorDicts.

        Example:
            >>> td = TensorDict({"a.b": torch.zeros(()), "c": torch.zeros(())})
            >>> list(td.unflatten_keys(".").keys(True, True))
            [('a', 'b'), 'c']
        """
        out = self._like({})
        for key, value in self._data.items():
            parts = tuple(key.split(separator)) if separator in key else (key,)
            if type(value) is TensorDict:
                value = value.unflatten_keys(separator)
            write_path(out, parts, value, False, True, "unflatten_keys", [], [], ())
        if inplace:
            self._check_writable("unflatten_keys", separator)
            self._data = out._data
            return self
        return out

    # ------------------------------------------------------------------ locking
    @property
    def is_locked(self) -> bool:
        return self._is_locked

    def lock_(self) -> TensorDict:
        """Refuse new, deleted and renamed keys (in-place writes stay allowed); returns self.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2]).lock_()
            >>> td["a"] = torch.ones(2)  # written in place
            >>> td.is_locked
            True
        """
        self._is_locked = True
        for value in self._data.values():
            if is_tensor_collection(value):
                value.lock_()
        return self

    def unlock_(self) -> TensorDict:
        """Allow structural changes again (nested TensorDicts too); returns self."""
        self._is_locked = False
        for value in self._data.values():
            if is_tensor_collection(value):
                value.unlock_()
        return self

    # ------------------------------------------------------------------ misc
    def _to_tensordict_view(self) -> TensorDict:
        return self

    def to_dict(self) -> dict:
        """A nested ``dict`` of the values (non-tensor leaves as their Python values)."""
        return {
            k: v.to_dict() if is_tensor_collection(v) else _read(v) for k, v in self._data.items()
        }

    def to_tensordict(self) -> TensorDict:
        """A copy as a plain ``TensorDict`` (tensors cloned)."""
        return TensorDict._new_unsafe(
            {
                k: v.to_tensordict()
                if is_tensor_collection(v)
                else (v.clone() if isinstance(v, (_Tensor, NonTensorData)) else v)
                for k, v in self._data.items()
            },
            self._batch_size,
            self._device,
            self._names,
        )

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        """A flat dict of tensors with dotted keys, plus ``_metadata`` for the structure."""
        from .state_dict import td_state_dict

        return td_state_dict(self, destination, prefix, keep_vars)

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """Load a dict made by :meth:`state_dict` into this TensorDict (in place); returns self."""
        from .state_dict import td_load_state_dict

        return td_load_state_dict(self, state_dict, strict, assign)

    def __repr__(self) -> str:
        return td_repr(self)

    __hash__ = None  # type: ignore[assignment]


_register_pytree(TensorDict)
register_class(TensorDict)
