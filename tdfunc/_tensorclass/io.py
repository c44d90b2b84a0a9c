"""Reading, writing and converting TensorClass instances.

``get``/``set``/``update`` (writes cast by the class flags), conversion to and
from TensorDicts, ``state_dict``, and printing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from .._core.container import TensorDict
from .._core.frozen import freeze
from .._core.keys import key_parts, missing_key_error
from .._core.nontensor import NonTensorData
from .._core.registry import class_name
from .._core.repr import is_shared, leaf_repr
from .fields import MISSING
from .methods import _NO_DEFAULT, TensorClassOps

if TYPE_CHECKING:
    from collections.abc import Iterator

    from typing_extensions import Self

    from .fields import Field


def _is_tensorclass_instance(value: Any) -> bool:
    return getattr(type(value), "_tc_ready", False)


class TensorClassIO(TensorClassOps):
    """Key access, conversion, ``state_dict`` and printing."""

    __slots__ = ()
    if TYPE_CHECKING:
        _tc_fields: ClassVar[tuple[Field, ...]]
        _tc_field_names: ClassVar[frozenset[str]]
        _tc_flags: ClassVar[dict[str, bool]]
        _tc_converters: ClassVar[dict[str, Any]]

        def _write_field(self, name: str, value: Any) -> None: ...

    # ------------------------------------------------------------------ reading
    def get(self, key: Any, default: Any = _NO_DEFAULT) -> Any:
        """The value at ``key`` (a field name, or a tuple walking nested fields).

        A field holding ``None`` reads ``None``; a missing key raises ``KeyError``
        unless ``default`` is given.

        Example:
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            ...     y: Any = None
            >>> foo = Foo(x=torch.zeros(2), batch_size=[2])
            >>> foo.get("x").shape, foo.get("y"), foo.get("z", "nothing")
            (torch.Size([2]), None, 'nothing')
        """
        if type(key) is str and key in self._tc_field_names and key not in self._td._data:
            return None
        if default is _NO_DEFAULT:
            try:
                return self._td.get(key)
            except KeyError:
                raise self._missing(key) from None
        return self._td.get(key, default)

    def _missing(self, key: Any) -> KeyError:
        names = sorted(set(self._tc_field_names) | set(self._td._data))
        return missing_key_error(key, names, f" in {type(self).__name__}")

    def __contains__(self, key: Any) -> bool:
        return key in self._td

    def keys(self, include_nested: bool = False, leaves_only: bool = False) -> Any:
        """The keys that hold a value (fields set to ``None`` are not listed)."""
        return self._td.keys(include_nested, leaves_only)

    def values(self, include_nested: bool = False, leaves_only: bool = False) -> Iterator[Any]:
        return self._td.values(include_nested, leaves_only)

    def items(self, include_nested: bool = False, leaves_only: bool = False) -> Iterator:
        return self._td.items(include_nested, leaves_only)

    def is_empty(self) -> bool:
        return self._td.is_empty()

    # ------------------------------------------------------------------ writing
    def set(self, key: Any, value: Any, inplace: bool = False, non_blocking: bool = False) -> Self:
        """Write field ``key`` (cast by the class flags); returns self.

        A tuple key writes into a nested field: ``tc.set(("a", "b"), v)`` is
        ``tc.a.set("b", v)``. With ``inplace=True`` an existing tensor is
        overwritten in place (its storage is kept).

        Example:
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            >>> foo = Foo(x=torch.zeros(3), batch_size=[3])
            >>> foo.set("x", torch.ones(3)).x
            tensor([1., 1., 1.])
        """
        self._check_mutable("set")
        parts = key_parts(key)
        if len(parts) > 1:
            head = self.get(parts[0])
            if not getattr(type(head), "_is_tensor_collection", False):
                raise KeyError(
                    f"{type(self).__name__}.set: cannot write {key!r}: field {parts[0]!r} holds "
                    f"a {type(head).__name__}, not a TensorDict or tensorclass."
                )
            head.set(parts[1:], value, inplace=inplace)
            return self
        name = parts[0]
        if name not in self._tc_field_names:
            if name in self._td._data:  # a key that is not a field (from_tensordict)
                self._td.set(name, value, inplace=inplace)
                return self
            raise AttributeError(
                f"{type(self).__name__}.set: {name!r} is not a field; the fields are "
                f"{sorted(self._tc_field_names)}."
            )
        existing = self._td._data.get(name)
        if inplace and isinstance(existing, torch.Tensor) and value is not None:
            self._td.set(name, value, inplace=True)
            return self
        self._write_field(name, value)
        return self

    def set_(self, key: Any, value: Any) -> Self:
        """Copy ``value`` into the existing entry at ``key`` (in place)."""
        self._check_mutable("set_")
        self._td.set_(key, value)
        return self

    def update(self, other: Mapping | Any, *, inplace: bool = False) -> Self:
        """Write every entry of ``other`` (a mapping or a container); fields are cast."""
        self._check_mutable("update")
        source = (
            other._to_tensordict_view()._data if hasattr(other, "_to_tensordict_view") else other
        )
        passthrough = {}
        for key, value in source.items():
            if type(key) is str and key in self._tc_field_names and not isinstance(value, Mapping):
                if type(value) is NonTensorData:
                    value = value.data
                self.set(key, value, inplace=inplace)
            else:
                passthrough[key] = value
        if passthrough:
            self._td.update(passthrough, inplace=inplace)
        return self

    def update_(self, other: Mapping | Any) -> Self:
        """Copy every entry of ``other`` into the existing entries (in place)."""
        self._check_mutable("update_")
        self._td.update_(other)
        return self

    def del_(self, key: Any) -> Self:
        self._check_mutable("del_")
        self._td.del_(key)
        return self

    def __delitem__(self, key: Any) -> None:
        self.del_(key)

    def pop(self, key: Any, default: Any = _NO_DEFAULT) -> Any:
        self._check_mutable("pop")
        if default is _NO_DEFAULT:
            return self._td.pop(key)
        return self._td.pop(key, default)

    def select(self, *keys: Any, strict: bool = True) -> Self:
        """An instance holding only ``keys`` (other fields read ``None``), sharing tensors."""
        return self._wrap_td(self._td.select(*keys, strict=strict))

    def exclude(self, *keys: Any) -> Self:
        """An instance without ``keys`` (those fields read ``None``), sharing tensors."""
        return self._wrap_td(self._td.exclude(*keys))

    # ------------------------------------------------------------------ locking
    @property
    def is_locked(self) -> bool:
        """Frozen instances are always locked: keys cannot be added, removed or replaced."""
        return self._tc_frozen or self._td._is_locked

    def lock_(self) -> Self:
        self._td.lock_()
        return self

    def unlock_(self) -> Self:
        """Unlock the inner TensorDict; a frozen instance stays locked (a no-op)."""
        if not self._tc_frozen:
            self._td.unlock_()
        return self

    # ------------------------------------------------------------------ converting
    def to_dict(self, *, retain_none: bool = True) -> dict:
        """A nested ``dict`` of the values (``None`` fields included unless asked not to)."""
        out = self._td.to_dict()
        if retain_none:
            for field in self._tc_fields:
                out.setdefault(field.name, None)
        return out

    def to_tensordict(self, *, retain_none: bool | None = None) -> TensorDict:
        """A copy as a plain ``TensorDict`` (tensors cloned, nested tensorclasses converted).

        Args:
            retain_none: if ``True`` (the default), fields holding ``None`` are
                written as non-tensor ``None`` entries; if ``False`` they are left out.

        Example:
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            ...     y: Any = None
            >>> sorted(Foo(x=torch.zeros(2)).to_tensordict(retain_none=False).keys())
            ['x']
        """
        retain = True if retain_none is None else retain_none
        td = self._td
        data: dict = {}
        for key, value in td._data.items():
            if _is_tensorclass_instance(value):
                data[key] = value.to_tensordict(retain_none=retain_none)
            elif getattr(type(value), "_is_tensor_collection", False):
                data[key] = value.to_tensordict()
            elif isinstance(value, torch.Tensor):
                data[key] = value.clone()
            else:
                data[key] = NonTensorData._make(value.data, value.batch_size, value.device)
        if retain:
            for field in self._tc_fields:
                if field.name not in data:
                    data[field.name] = NonTensorData._make(None, td._batch_size, td._device)
        return TensorDict._new_unsafe(data, td._batch_size, td._device, td._names)

    @classmethod
    def from_tensordict(
        cls, tensordict: Any, non_tensordict: Mapping | None = None, safe: bool = True
    ) -> Self:
        """Wrap ``tensordict`` (shared, not copied) in this class.

        Args:
            tensordict: the TensorDict whose entries become the fields.
            non_tensordict: more field values (non-tensor data, nested
                tensorclasses), cast by the class flags.
            safe: raise a ``TypeError`` when ``tensordict`` is not a TensorDict.

        Fields missing from both get their default, or ``None``.

        Example:
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            ...     label: str = "none"
            >>> foo = Foo.from_tensordict(TensorDict({"x": torch.zeros(2)}, [2]), {"label": "a"})
            >>> foo.label, foo.batch_size
            ('a', torch.Size([2]))
        """
        if not getattr(cls, "_tc_ready", False):
            raise TypeError(f"{cls.__name__}.from_tensordict: call it on a tensorclass subclass.")
        if _is_tensorclass_instance(tensordict):
            tensordict = tensordict._td
        if safe and not isinstance(tensordict, TensorDict):
            raise TypeError(
                f"{cls.__name__}.from_tensordict: expected a TensorDict, got "
                f"{type(tensordict).__name__}. Pass safe=False to wrap another container."
            )
        if cls._tc_flags["tensor_only"]:
            for key, value in tensordict._data.items():
                if isinstance(value, NonTensorData):
                    raise TypeError(
                        f"{cls.__name__}.from_tensordict: {cls.__name__} is tensor_only but key "
                        f"{key!r} holds non-tensor data ({type(value.data).__name__})."
                    )
        out = object.__new__(cls)
        object.__setattr__(out, "_td", tensordict)
        if cls._tc_frozen:
            freeze(tensordict)
        for name, value in (non_tensordict or {}).items():
            TensorClassIO._write_unchecked(out, name, value)
        for field in cls._tc_fields:
            if field.name in tensordict._data or (non_tensordict and field.name in non_tensordict):
                continue
            if field.default_factory is not MISSING:
                TensorClassIO._write_unchecked(out, field.name, field.default_factory())
            elif field.default is not MISSING:
                TensorClassIO._write_unchecked(out, field.name, field.default)
        return out

    def _write_unchecked(self, name: str, value: Any) -> None:
        """Write a field at construction time (no frozen check)."""
        cls = type(self)
        if name not in cls._tc_field_names:
            raise AttributeError(
                f"{cls.__name__}: {name!r} is not a field; the fields are "
                f"{sorted(cls._tc_field_names)}."
            )
        if value is None:
            self._td._data.pop(name, None)
            return
        td = self._td
        converter = cls._tc_converters[name]
        td._data[name] = converter(cls.__name__, name, value, td._batch_size, td._device)

    # ------------------------------------------------------------------ state dict
    def state_dict(
        self,
        destination: dict | None = None,
        prefix: str = "",
        keep_vars: bool = False,
        flatten: bool = True,
    ) -> dict[str, Any]:
        """Tensors under their logical (dotted) keys; non-tensor fields and types in ``_metadata``.

        Besides what ``TensorDict.state_dict`` records, ``_metadata`` holds the
        class (``"type"``), the classes of nested tensorclasses (``"types"``) and
        the fields holding ``None`` (``"none_fields"``).

        Example:
            >>> class Foo(TensorClass):
            ...     x: torch.Tensor
            ...     label: str
            >>> sd = Foo(x=torch.zeros(2), label="a", batch_size=[2]).state_dict()
            >>> list(sd), sorted(sd["_metadata"]["non_tensor"]), sd["_metadata"]["type"][-4:]
            (['x', '_metadata'], ['label'], '.Foo')
        """
        out = self._td.state_dict(destination, prefix, keep_vars)
        meta = out[prefix + "_metadata"]
        meta["type"] = class_name(type(self))
        types: dict[str, str] = {}
        none_fields: list[str] = []
        for path, node in _tensorclass_nodes(self, ()):
            for field in node._tc_fields:
                if field.name not in node._td._data:
                    none_fields.append(".".join((*path, field.name)))
            if path:
                types[".".join(path)] = class_name(type(node))
        meta["types"] = types
        meta["none_fields"] = none_fields
        if not flatten:
            return _unflatten_state(out, prefix)
        return out

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        strict: bool = True,
        assign: bool = False,
        from_flatten: bool | None = None,
    ) -> Self:
        """Load a dict made by :meth:`state_dict` (flat or nested) into this instance."""
        self._check_mutable("load_state_dict")
        flat = dict(_flatten_state(state_dict))
        nones = (flat.get("_metadata") or {}).get("none_fields", ())
        self._td.load_state_dict(flat, strict=strict, assign=assign)
        for key in nones:
            parts = tuple(key.split("."))
            if parts in self._td or (len(parts) == 1 and parts[0] in self._td._data):
                self._td.del_(parts if len(parts) > 1 else parts[0])
        return self

    # ------------------------------------------------------------------ printing
    def __repr__(self) -> str:
        td = self._td
        data = td._data
        items = [f"{key}={leaf_repr(data[key])}" for key in sorted(data)]
        items += [f"{f.name}=None" for f in self._tc_fields if f.name not in data]
        tail = [f"batch_size={td._batch_size}", f"device={td._device}"]
        if td._names is not None:
            tail.append(f"names={list(td._names)}")
        tail.append(f"is_shared={is_shared(td)}")
        body = textwrap.indent(",\n".join(items + tail), "    ")
        return f"{type(self).__name__}(\n{body})"


def _tensorclass_nodes(node: Any, path: tuple) -> Iterator[tuple[tuple, Any]]:
    """(path, instance) for ``node`` and every tensorclass nested below it."""
    if _is_tensorclass_instance(node):
        yield path, node
    for key, value in node._to_tensordict_view()._data.items():
        if getattr(type(value), "_is_tensor_collection", False):
            yield from _tensorclass_nodes(value, (*path, key))


def _unflatten_state(flat: dict, prefix: str) -> dict:
    """``{"a.b": t}`` -> ``{"a": {"b": t}}`` (``_metadata`` stays at the top)."""
    nested: dict = {}
    for key, value in flat.items():
        name = key[len(prefix) :]
        parts = [name] if name == "_metadata" else name.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return {prefix + key: value for key, value in nested.items()}


def _flatten_state(state: Mapping, path: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in state.items():
        if key == "_metadata" and not path:
            yield key, value
        elif isinstance(value, Mapping):
            yield from _flatten_state(value, f"{path}{key}.")
        else:
            yield f"{path}{key}", value
