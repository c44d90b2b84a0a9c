"""TensorClass constructors from other containers, ``state_dict`` with classes, and printing.

These are TensorClass's own: ``from_tensordict`` (and ``from_module``,
``from_modules`` built on it) fill the fields (defaults for missing ones);
``state_dict`` records the class of every nested tensorclass and the unset
fields; ``repr`` lists the fields. Everything else comes from the shared
mixins (:mod:`tdfunc._core.ops`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from .._core.helpers.class_names import class_name
from .._core.helpers.frozen import freeze
from .._core.helpers.mixin import is_tensor_collection
from .._core.helpers.nontensor import NonTensorData
from .._core.helpers.repr import is_shared, leaf_repr
from .fields import MISSING
from .state import TensorClassState, _set_td, _unknown_name

if TYPE_CHECKING:
    from collections.abc import Iterator

    from torch import nn
    from typing_extensions import Self

    from .fields import Field


def _is_tensorclass_instance(value: Any) -> bool:
    return getattr(type(value), "_tc_ready", False)


class TensorClassConvert(TensorClassState):
    """Constructors from TensorDicts and modules, ``state_dict``, ``repr``."""

    __slots__ = ()
    if TYPE_CHECKING:
        _tc_fields: ClassVar[tuple[Field, ...]]
        _tc_flags: ClassVar[dict[str, bool]]
        _tc_init_vars: ClassVar[tuple[tuple[str, Any], ...]]

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
        if safe and not isinstance(tensordict, cls._plain_tensordict()):
            raise TypeError(
                f"{cls.__name__}.from_tensordict: expected a TensorDict, got "
                f"{type(tensordict).__name__}. Pass safe=False to wrap another container."
            )
        data = tensordict._data
        extra = data.keys() - cls._tc_field_names
        if extra:
            # an entry that is no field would ride along unseen by the class's fields
            raise ValueError(
                f"{cls.__name__}.from_tensordict: the entries {sorted(extra)} are not fields "
                f"of {cls.__name__}; its fields are {sorted(cls._tc_field_names)}. Select the "
                f"fields first (tensordict.select(...))."
            )
        for name in cls._tc_field_names & data.keys():
            value = data[name]
            if type(value) is NonTensorData and value.data is None:
                # an unset field (``to_tensordict`` keeps it as ``None``): no entry, as the
                # constructor leaves it (a tensor_only class has no non-tensor entries)
                del data[name]
        if cls._tc_flags["tensor_only"]:
            for key, value in tensordict._data.items():
                if isinstance(value, NonTensorData):
                    raise TypeError(
                        f"{cls.__name__}.from_tensordict: {cls.__name__} is tensor_only but key "
                        f"{key!r} holds non-tensor data ({type(value.data).__name__})."
                    )
        out = object.__new__(cls)
        _set_td(out, tensordict)
        if cls._tc_flags["autocast"]:
            # the entries become what the constructor makes of them (an ``int`` field
            # reads an int, a nested tensorclass field its class), as autocast promises
            for name in cls._tc_field_names & tensordict._data.keys():
                out._write_unchecked(name, tensordict._data[name])
        for name, value in (non_tensordict or {}).items():
            out._write_unchecked(name, value)
        for field in cls._tc_fields:
            if field.name in tensordict._data or (non_tensordict and field.name in non_tensordict):
                continue
            if field.default_factory is not MISSING:
                out._write_unchecked(field.name, field.default_factory())
            elif field.default is not MISSING:
                out._write_unchecked(field.name, field.default)
        if hasattr(cls, "__post_init__"):
            # its checks and normalisations hold however it is built
            missing = [name for name, default in cls._tc_init_vars if default is MISSING]
            if missing:
                raise TypeError(
                    f"{cls.__name__}.from_tensordict: __post_init__ takes the InitVars "
                    f"{missing}, which have no default; call the constructor instead, or give "
                    f"them defaults."
                )
            out.__post_init__(*(default for _, default in cls._tc_init_vars))
        if cls._frozen:
            freeze(tensordict)  # after __post_init__, as the constructor does
        return out

    def _write_unchecked(self, name: str, value: Any) -> None:
        """Write a field at construction time (no frozen check)."""
        cls = type(self)
        if name not in cls._tc_field_names:
            raise _unknown_name(cls, "from_tensordict", name)
        td = self._td
        if value is None:
            td._data.pop(name, None)
            return
        converter = cls._tc_converters[name]
        td._data[name] = converter(cls.__name__, name, value, td._batch_size, td._device)

    @classmethod
    def from_module(
        cls, module: nn.Module, as_module: bool = False, lock: bool = False, use_state_dict=False
    ) -> Self:
        """The parameters and buffers of ``module`` as an instance (fields = their names).

        Example:
            >>> class LinearParams(TensorClass["frozen"]):
            ...     weight: torch.Tensor
            ...     bias: torch.Tensor
            >>> LinearParams.from_module(torch.nn.Linear(3, 4)).weight.shape
            torch.Size([4, 3])
        """
        plain = cls._plain_tensordict()
        source = plain.from_module(module, as_module, use_state_dict=use_state_dict)
        out = cls.from_tensordict(source)
        return out.lock_() if lock else out

    @classmethod
    def from_modules(cls, *modules: nn.Module, lock: bool = True) -> Self:
        """The parameters of several identical modules, stacked along a new batch dim."""
        out = cls.from_tensordict(cls._plain_tensordict().from_modules(*modules, lock=False))
        return out.lock_() if lock else out

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
            >>> meta = sd._metadata[""]
            >>> list(sd), sorted(meta["non_tensor"]), meta["type"][-4:]
            (['x'], ['label'], '.Foo')
        """
        out = self._td.state_dict(destination, prefix, keep_vars, flatten)
        meta = out._metadata[prefix[:-1] if prefix.endswith(".") else prefix]
        meta["type"] = class_name(type(self))
        meta["_type"] = f"<class '{type(self).__module__}.{type(self).__qualname__}'>"
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
        return out

    def load_state_dict(
        self,
        state_dict: Mapping[str, Any],
        strict: bool = True,
        assign: bool = False,
        from_flatten: bool | None = None,
    ) -> Self:
        """Load a state dict (flat, nested, or legacy ``_tensordict``) into this instance."""
        self._check_mutable("load_state_dict")
        metadata = getattr(state_dict, "_metadata", None)
        root = metadata.get("", {}) if isinstance(metadata, Mapping) else {}
        nones = root.get("none_fields") or (state_dict.get("_metadata") or {}).get(
            "none_fields", ()
        )
        self._td.load_state_dict(state_dict, strict, assign, from_flatten)
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
        if is_tensor_collection(value):
            yield from _tensorclass_nodes(value, (*path, key))
