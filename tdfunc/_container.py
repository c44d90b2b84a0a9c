"""``TensorDict``: a dict of tensors sharing leading batch dimensions.

Validation happens here, at the boundary (the public constructor, ``set``,
``__setitem__``, ``update``). Every derived result (indexing, ``apply``,
shape operations, ``stack``) is built through :meth:`TensorDict._new_unsafe`,
which trusts its inputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ._apply import ApplyMixin
from ._arith import ArithmeticMixin
from ._distributed import DistributedMixin
from ._keys import is_key, key_parts, missing_key_error, unravel_key
from ._map import MapMixin
from ._module_swap import ModuleSwapMixin
from ._nontensor import NonTensorData
from ._persist import PersistMixin
from ._pytree import register as _register_pytree
from ._registry import register_class
from ._repr import td_repr
from ._shape_ops import ShapeOpsMixin
from ._shapes import as_size
from ._torch_function import TorchFunctionMixin

_NO_DEFAULT = object()
_SCALARS = (int, float, bool, complex, np.ndarray, np.generic)


def is_tensor_collection(obj: object) -> bool:
    """True for a ``TensorDict`` or a ``TensorClass`` instance."""
    return getattr(type(obj), "_is_tensor_collection", False)


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

    Example:
        >>> td = TensorDict({"a": torch.zeros(3, 4), "b": {"c": torch.ones(3)}}, [3])
        >>> td["b", "c"].shape
        torch.Size([3])
        >>> td[1:].batch_size
        torch.Size([2])
    """

    __slots__ = ("__weakref__", "_batch_size", "_data", "_device", "_is_locked", "_names")
    _is_tensor_collection = True

    def __init__(
        self,
        source: Mapping | None = None,
        batch_size=None,
        device=None,
        names=None,
        *,
        lock: bool = False,
    ) -> None:
        self._data: dict[str, Any] = {}
        self._batch_size = as_size(batch_size)
        self._device = None if device is None else torch.device(device)
        self._names = None
        self._is_locked = False
        if names is not None:
            self.names = names
        if source is not None:
            if not isinstance(source, Mapping):
                raise TypeError(
                    f"TensorDict: source must be a mapping (dict, TensorDict, ...), got "
                    f"{type(source).__name__}."
                )
            self.update(source)
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
        return type(self)._new_unsafe(
            data,
            self._batch_size if batch_size is None else batch_size,
            self._device,
            self._names if names is _NO_DEFAULT else names,
        )

    @classmethod
    def _from_pytree(cls, data: dict, batch_size: torch.Size, device, names):
        """Rebuild after a pytree transform (see ``_pytree.unflatten``)."""
        return cls._new_unsafe(data, batch_size, device, names)

    @classmethod
    def fromkeys(cls, keys, value: Any = 0, batch_size=None, device=None) -> TensorDict:
        """A TensorDict with every key in ``keys`` holding ``value``.

        Example:
            >>> TensorDict.fromkeys(["a", ("nested", "e")], 0)["nested", "e"]
            tensor(0)
        """
        out = cls({}, batch_size=batch_size, device=device)
        for key in keys:
            out.set(key, value.clone() if isinstance(value, torch.Tensor) else value)
        return out

    # ------------------------------------------------------------------ shape
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value) -> None:
        size = as_size(value)
        for key, item in self._data.items():
            if item.shape[: len(size)] != size:
                raise ValueError(
                    f"TensorDict.batch_size: cannot set batch size {list(size)}: key {key!r} "
                    f"has shape {list(item.shape)}."
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
    def names(self) -> list | None:
        if self._names is None:
            return None if not self._batch_size else [None] * len(self._batch_size)
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
        self._names = None if all(n is None for n in value) else value

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
            value = self._get_nested(key_parts(key))
        if value is _NO_DEFAULT:
            if default is _NO_DEFAULT:
                raise self._missing(key)
            return default
        if type(value) is NonTensorData:
            return value.data
        return value

    def _get_nested(self, parts: tuple) -> Any:
        node: Any = self
        for part in parts:
            if type(node) is not TensorDict:
                if not is_tensor_collection(node):
                    return _NO_DEFAULT
                node = node._to_tensordict_view()
            node = node._data.get(part, _NO_DEFAULT)
            if node is _NO_DEFAULT:
                return node
        return node

    def _get_leaf(self, key) -> Any:
        """The stored value (``NonTensorData`` not unwrapped), or raise ``KeyError``."""
        value = (
            self._data.get(key, _NO_DEFAULT)
            if type(key) is str
            else self._get_nested(key_parts(key))
        )
        if value is _NO_DEFAULT:
            raise self._missing(key)
        return value

    def _missing(self, key) -> KeyError:
        parts = key_parts(key)
        node: Any = self
        for depth, part in enumerate(parts):
            data = node._data if type(node) is TensorDict else None
            if data is None or part not in data:
                where = "" if depth == 0 else f" under {parts[:depth]!r}"
                return missing_key_error(part if depth else key, data or (), where)
            node = data[part]
        return missing_key_error(key, ())

    def __getitem__(self, index) -> Any:
        if type(index) is str:
            value = self._data.get(index, _NO_DEFAULT)
            if value is _NO_DEFAULT:
                raise self._missing(index)
            return value.data if type(value) is NonTensorData else value
        if is_key(index):
            return self.get(index)
        return self._index(index)

    def __contains__(self, key) -> bool:
        if type(key) is str:
            return key in self._data
        try:
            return self._get_nested(key_parts(key)) is not _NO_DEFAULT
        except TypeError:
            return False

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> _KeysView:
        """The keys; nested keys (as tuples) too with ``include_nested=True``."""
        return _KeysView(self, include_nested, leaves_only)

    def values(self, include_nested: bool = False, leaves_only: bool = False):
        for key in self.keys(include_nested, leaves_only):
            yield self.get(key)

    def items(self, include_nested: bool = False, leaves_only: bool = False):
        for key in self.keys(include_nested, leaves_only):
            yield key, self.get(key)

    def _iter_keys(self, prefix: tuple, include_nested: bool, leaves_only: bool):
        for key, value in self._data.items():
            full = prefix + (key,) if prefix else key
            nested = is_tensor_collection(value)
            if not (nested and leaves_only):
                yield full
            if nested and include_nested:
                inner = value if type(value) is TensorDict else value._to_tensordict_view()
                yield from inner._iter_keys(
                    full if type(full) is tuple else (full,), include_nested, leaves_only
                )

    def is_empty(self) -> bool:
        """True when there is no tensor leaf, at any depth."""
        return not any(True for _ in self.keys(True, True))

    # ------------------------------------------------------------------ writing
    def _check_writable(self, api: str, key) -> None:
        if self._is_locked:
            raise RuntimeError(
                f"TensorDict.{api}: cannot add, delete or rename key {key!r}: the TensorDict "
                f"is locked. Write in place (td.set_(key, value)) or call td.unlock_() first."
            )

    def _convert(self, key, value: Any, batch_size: torch.Size) -> Any:
        """Validate one value against ``batch_size`` and return what is stored."""
        if isinstance(value, torch.Tensor):
            if value.shape[: len(batch_size)] != batch_size:
                raise ValueError(
                    f"TensorDict.set: the value at key {key!r} has shape {list(value.shape)}, "
                    f"which does not start with the batch size {list(batch_size)}."
                )
            if self._device is not None and value.device != self._device:
                value = value.to(self._device)
            return value
        if is_tensor_collection(value):
            if value.batch_size[: len(batch_size)] != batch_size:
                raise ValueError(
                    f"TensorDict.set: the {type(value).__name__} at key {key!r} has batch size "
                    f"{list(value.batch_size)}, which does not start with {list(batch_size)}."
                )
            if self._device is not None and value.device != self._device:
                value = value.to(self._device)
            return value
        if isinstance(value, Mapping):
            return TensorDict(value, batch_size=batch_size, device=self._device)
        if isinstance(value, NonTensorData):
            return NonTensorData._make(value.data, batch_size, self._device)
        if isinstance(value, _SCALARS):
            return self._convert(key, torch.as_tensor(value, device=self._device), batch_size)
        return NonTensorData._make(value, batch_size, self._device)

    def _plan_set(self, key, value: Any, inplace: bool) -> tuple:
        """Validate one write without performing it: (node parts, last key, value, inplace)."""
        parts = key_parts(key)
        node: Any = self
        batch_size = self._batch_size
        for depth, part in enumerate(parts[:-1]):
            inner = node._data.get(part) if node is not None else None
            if inner is None:
                node = None  # created at commit time with the parent's batch size
                continue
            if type(inner) is not TensorDict:
                if not is_tensor_collection(inner):
                    raise KeyError(
                        f"TensorDict.set: cannot write {key!r}: {parts[: depth + 1]!r} holds a "
                        f"{type(inner).__name__}, not a TensorDict."
                    )
                inner = inner._to_tensordict_view()
            node = inner
            batch_size = inner._batch_size
        last = parts[-1]
        existing = node._data.get(last) if node is not None else None
        if existing is not None and (inplace or (node._is_locked)):
            if isinstance(existing, torch.Tensor):
                value = torch.as_tensor(value, device=existing.device)
                if value.shape != existing.shape and (
                    torch.broadcast_shapes(value.shape, existing.shape) != existing.shape
                ):
                    raise ValueError(
                        f"TensorDict.set_: cannot write a value of shape {list(value.shape)} in "
                        f"place into key {key!r} of shape {list(existing.shape)}."
                    )
                return parts, value, True
        elif existing is None and inplace == "strict":
            raise self._missing(key)
        if existing is None and node is not None:
            node._check_writable("set", key)
        return parts, self._convert(key, value, batch_size), False

    def _commit_set(self, parts: tuple, value: Any, inplace: bool) -> None:
        node = self
        for part in parts[:-1]:
            inner = node._data.get(part)
            if inner is None:
                node._check_writable("set", parts)
                inner = TensorDict._new_unsafe({}, node._batch_size, node._device)
                inner._is_locked = node._is_locked
                node._data[part] = inner
            elif type(inner) is not TensorDict:
                inner = inner._to_tensordict_view()
            node = inner
        if inplace:
            existing = node._data[parts[-1]]
            if isinstance(existing, torch.Tensor):
                existing.copy_(value)
                return
        node._data[parts[-1]] = value

    def set(self, key, value: Any, *, inplace: bool = False) -> TensorDict:
        """Write ``value`` at ``key`` (creating nested TensorDicts as needed); returns self.

        Example:
            >>> td = TensorDict({}, [2])
            >>> td.set(("a", "b"), torch.zeros(2, 5))["a", "b"].shape
            torch.Size([2, 5])
        """
        if type(key) is str and not inplace and not self._is_locked:
            # fast path: a top-level, out-of-place write
            if type(value) is torch.Tensor and self._device is None:
                if value.shape[: len(self._batch_size)] != self._batch_size:
                    self._convert(key, value, self._batch_size)  # raises the clear error
                self._data[key] = value
                return self
            self._data[key] = self._convert(key, value, self._batch_size)
            return self
        self._commit_set(*self._plan_set(key, value, inplace))
        return self

    def set_(self, key, value: Any) -> TensorDict:
        """Copy ``value`` into the existing entry at ``key`` (in place)."""
        existing = self._get_leaf(key)
        if is_tensor_collection(existing):
            existing.update_(value)
            return self
        if isinstance(existing, NonTensorData):
            existing.data = value.data if isinstance(value, NonTensorData) else value
            return self
        self._commit_set(*self._plan_set(key, value, "strict"))
        return self

    def __setitem__(self, index, value: Any) -> None:
        if type(index) is str or is_key(index):
            self.set(index, value)
        else:
            self._set_at_index(index, value)

    def update(self, other: Mapping, *, inplace: bool = False) -> TensorDict:
        """Write every entry of ``other``; on a bad value nothing is written."""
        if isinstance(other, TensorDict):
            items = list(other._data.items())
        elif is_tensor_collection(other):
            items = list(other._to_tensordict_view()._data.items())
        else:
            items = list(other.items())
        plans = []
        for key, value in items:
            if (
                isinstance(value, Mapping)
                and not is_tensor_collection(value)
                and unravel_key(key) in self
            ):
                current = self._get_leaf(key)
                if isinstance(current, TensorDict):
                    # merge nested dicts into the existing sub-TensorDict
                    for sub_key, sub_value in value.items():
                        plans.append(
                            self._plan_set(key_parts(key) + key_parts(sub_key), sub_value, inplace)
                        )
                    continue
            plans.append(self._plan_set(key, value, inplace))
        for plan in plans:
            self._commit_set(*plan)
        return self

    def update_(self, other: Mapping) -> TensorDict:
        """Copy every entry of ``other`` into the existing entries (in place)."""
        source = (
            other._data
            if isinstance(other, TensorDict)
            else (other._to_tensordict_view()._data if is_tensor_collection(other) else other)
        )
        for key in source:
            self._get_leaf(key)  # all keys must exist before anything is written
        for key, value in source.items():
            if type(value) is NonTensorData:
                value = value.data
            self.set_(key, value)
        return self

    def __delitem__(self, key) -> None:
        self.del_(key)

    def del_(self, key) -> TensorDict:
        """Remove ``key`` (nested keys too)."""
        parts = key_parts(key)
        node = self._get_leaf(parts[:-1]) if len(parts) > 1 else self
        if type(node) is not TensorDict:
            node = node._to_tensordict_view()
        if parts[-1] not in node._data:
            raise self._missing(key)
        node._check_writable("del_", key)
        del node._data[parts[-1]]
        return self

    def pop(self, key, default: Any = _NO_DEFAULT) -> Any:
        """Remove ``key`` and return its value (or ``default`` when missing)."""
        if key not in self:
            if default is _NO_DEFAULT:
                raise self._missing(key)
            return default
        value = self.get(key)
        self.del_(key)
        return value

    def rename_key_(self, old_key, new_key, safe: bool = False) -> TensorDict:
        """Rename ``old_key`` to ``new_key`` in place."""
        value = self._get_leaf(old_key)
        if safe and new_key in self:
            raise KeyError(f"TensorDict.rename_key_: key {new_key!r} already exists.")
        self._check_writable("rename_key_", old_key)
        self.del_(old_key)
        self._commit_set(key_parts(new_key), value, False)
        return self

    # ------------------------------------------------------------------ key views
    def select(self, *keys, strict: bool = True, inplace: bool = False) -> TensorDict:
        """A TensorDict holding only ``keys`` (sharing the tensors)."""
        out = self._like({})
        for key in keys:
            parts = key_parts(key)
            value = self._get_nested(parts)
            if value is _NO_DEFAULT:
                if strict:
                    raise self._missing(key)
                continue
            out._copy_path(self, parts, value)
        if inplace:
            self._check_writable("select", keys)
            self._data = out._data
            return self
        return out

    def _copy_path(self, source: TensorDict, parts: tuple, value: Any) -> None:
        node, src = self, source
        for part in parts[:-1]:
            src = src._data[part]
            if part not in node._data:
                node._data[part] = src._like({})
            node = node._data[part]
        node._data[parts[-1]] = value

    def exclude(self, *keys, inplace: bool = False) -> TensorDict:
        """A TensorDict without ``keys`` (sharing the tensors)."""
        out = self if inplace else self._shallow_copy()
        if inplace:
            self._check_writable("exclude", keys)
        for key in keys:
            parts = key_parts(key)
            node = out
            for part in parts[:-1]:
                inner = node._data.get(part)
                if not isinstance(inner, TensorDict):
                    node = None
                    break
                node = inner
            if node is not None:
                node._data.pop(parts[-1], None)
        return out

    def _shallow_copy(self) -> TensorDict:
        """A copy of the key structure (nested TensorDicts too) sharing the leaves."""
        return self._like(
            {k: v._shallow_copy() if type(v) is TensorDict else v for k, v in self._data.items()}
        )

    def copy(self) -> TensorDict:
        return self._shallow_copy()

    def empty(self, recurse: bool = False) -> TensorDict:
        """A TensorDict with the same batch size and no keys."""
        if not recurse:
            return self._like({})
        return self._like(
            {k: v.empty(True) for k, v in self._data.items() if is_tensor_collection(v)}
        )

    def flatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDict:
        """Flatten nested keys into single keys joined by ``separator``.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}}, [])
            >>> list(td.flatten_keys("."). keys())
            ['a.b']
        """
        data: dict = {}
        for key in self.keys(True, True):
            name = key if type(key) is str else separator.join(key)
            if name in data:
                raise KeyError(f"TensorDict.flatten_keys: two keys flatten to {name!r}.")
            data[name] = self._get_leaf(key)
        if inplace:
            self._check_writable("flatten_keys", separator)
            self._data = data
            return self
        return self._like(data)

    def unflatten_keys(self, separator: str = ".", inplace: bool = False) -> TensorDict:
        """Split keys on ``separator`` into nested TensorDicts."""
        out = self._like({})
        for key, value in self._data.items():
            parts = tuple(key.split(separator)) if separator in key else (key,)
            if is_tensor_collection(value) and type(value) is TensorDict:
                value = value.unflatten_keys(separator)
            out._commit_set(parts, value, False)
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
        """Refuse new, deleted and renamed keys (in-place writes stay allowed)."""
        self._is_locked = True
        for value in self._data.values():
            if is_tensor_collection(value):
                value.lock_()
        return self

    def unlock_(self) -> TensorDict:
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
            k: v.to_dict()
            if is_tensor_collection(v)
            else (v.data if type(v) is NonTensorData else v)
            for k, v in self._data.items()
        }

    def to_tensordict(self) -> TensorDict:
        """A copy as a plain ``TensorDict`` (tensors cloned)."""
        return TensorDict._new_unsafe(
            {
                k: v.to_tensordict()
                if is_tensor_collection(v)
                else (v.clone() if isinstance(v, torch.Tensor) else v)
                for k, v in self._data.items()
            },
            self._batch_size,
            self._device,
            self._names,
        )

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        """A flat dict of tensors with dotted keys, plus ``_metadata`` for the structure."""
        from ._state_dict import td_state_dict

        return td_state_dict(self, destination, prefix, keep_vars)

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """Load a dict made by :meth:`state_dict` into this TensorDict."""
        from ._state_dict import td_load_state_dict

        return td_load_state_dict(self, state_dict, strict, assign)

    def __repr__(self) -> str:
        return td_repr(self)

    __hash__ = None  # type: ignore[assignment]


class _KeysView:
    """The keys of a TensorDict; membership accepts any nested-tuple spelling."""

    __slots__ = ("_include_nested", "_leaves_only", "_td")

    def __init__(self, td: TensorDict, include_nested: bool, leaves_only: bool) -> None:
        self._td = td
        self._include_nested = include_nested
        self._leaves_only = leaves_only

    def __iter__(self):
        if not self._include_nested and not self._leaves_only:
            return iter(self._td._data)
        return self._td._iter_keys((), self._include_nested, self._leaves_only)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key) -> bool:
        try:
            parts = key_parts(key)
        except TypeError:
            return False
        if len(parts) > 1 and not self._include_nested:
            return False
        value = self._td._get_nested(parts)
        if value is _NO_DEFAULT:
            return False
        return not (self._leaves_only and is_tensor_collection(value))

    def __repr__(self) -> str:
        return f"_KeysView({list(self)})"

    def __eq__(self, other) -> bool:
        return set(self) == set(other)


_register_pytree(TensorDict)
register_class(TensorDict)
