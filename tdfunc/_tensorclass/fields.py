"""Fields of a TensorClass: declaration, flags, and how a value is stored.

A field is declared by an annotation in the class body. What a value becomes
when it is written depends on the class's casting flag:

- default: tensors and containers are stored as they are; numbers and arrays
  become tensors (a Python number that cannot carry the batch dims is kept as
  a Python value); anything else is kept as a Python value (``NonTensorData``).
- ``autocast``: the value is cast to the field's annotation when it is written
  (an ``int`` field keeps Python ints; a tensor given to it becomes an int).
- ``nocast``: numbers and arrays are kept as Python values.
- ``tensor_only``: only tensors, containers and values ``torch.as_tensor``
  accepts; anything else is a ``TypeError``.

A field holding ``None`` has no entry in the inner TensorDict.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .._core.helpers.mixin import is_tensor_collection
from .._core.helpers.nontensor import NonTensorData, NonTensorStack
from .._core.helpers.sizes import BatchSizeMismatchError, leaf_shape
from .._core.helpers.writes import stacked_list, stacked_tensors

FLAGS = ("autocast", "nocast", "tensor_only", "frozen", "shadow", "skip_post_init_on_rebuild")
CASTING_FLAGS = ("autocast", "nocast", "tensor_only")
MISSING: Any = dataclasses.MISSING

_SCALARS = (int, float, bool, complex, np.ndarray, np.generic)
_PY_NUMBERS = (int, float, bool, complex)


class Field:
    """One declared field: its name, annotation and default (or default factory)."""

    __slots__ = (
        "annotation",
        "default",
        "default_factory",
        "localns",
        "name",
        "owner",
        "target",
    )

    def __init__(
        self,
        name: str,
        annotation: Any,
        default: Any,
        default_factory: Any,
        owner: type,
        localns: dict | None = None,
    ) -> None:
        self.name = name
        self.annotation = annotation
        self.default = default
        self.default_factory = default_factory
        self.owner = owner  # the class whose body declared the field
        self.localns = localns  # locals where the class was defined (string annotations)
        self.target: Any = MISSING  # resolved annotation, computed on first use

    @property
    def has_default(self) -> bool:
        return self.default is not MISSING or self.default_factory is not MISSING

    def __repr__(self) -> str:
        return f"Field({self.name!r}, {self.annotation!r})"


# ---------------------------------------------------------------------- flags
def parse_bracket_flags(cls_name: str, item: Any) -> dict[str, bool]:
    """``TensorClass["nocast", "frozen"]`` -> ``{"nocast": True, "frozen": True}``."""
    items = item if isinstance(item, tuple) else (item,)
    flags: dict[str, bool] = {}
    for flag in items:
        if not isinstance(flag, str):
            raise TypeError(
                f"{cls_name}[...]: flags are strings among {list(FLAGS)}, got "
                f"{type(flag).__name__} {flag!r}. Example: {cls_name}['frozen']."
            )
        if flag not in FLAGS:
            raise ValueError(
                f"{cls_name}[...]: unknown flag {flag!r}; the flags are {list(FLAGS)}."
            )
        flags[flag] = True
    check_casting(cls_name, flags)
    return flags


def check_casting(cls_name: str, flags: Mapping[str, bool]) -> None:
    on = [name for name in CASTING_FLAGS if flags.get(name)]
    if len(on) > 1:
        raise TypeError(
            f"{cls_name}: the casting flags {on} are mutually exclusive; keep one of "
            f"autocast, nocast and tensor_only (a subclass can turn an inherited one off "
            f"with e.g. autocast=False)."
        )


def resolve_flags(cls, requested: dict[str, bool | None], root: type) -> dict[str, bool]:
    """The flags of a new class: those of its bases (below ``root``), updated by its keywords."""
    flags = dict.fromkeys(FLAGS, False)
    frozen_base = None
    for base in cls.__mro__[1:]:
        if not issubclass(base, root) or "_tc_flags" not in base.__dict__:
            continue
        for name, value in base._tc_flags.items():
            flags[name] = flags[name] or value
        if base._tc_flags.get("frozen") and frozen_base is None:
            frozen_base = base
    for name, value in requested.items():
        if value is None:
            continue
        if name == "frozen" and not value and frozen_base is not None:
            raise TypeError(
                f"{cls.__name__}: a subclass of the frozen tensorclass "
                f"{frozen_base.__name__} must be frozen too; drop frozen=False."
            )
        flags[name] = bool(value)
    check_casting(cls.__name__, flags)
    return flags


# ---------------------------------------------------------------------- fields
def _is_classvar(annotation: Any) -> bool:
    if isinstance(annotation, str):
        text = annotation.replace(" ", "").strip("'\"")
        return text.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar"))
    if annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar:
        return True
    return isinstance(annotation, dataclasses.InitVar) or annotation is dataclasses.InitVar


def _is_init_var(annotation: Any) -> bool:
    if isinstance(annotation, str):
        text = annotation.replace(" ", "").strip("'\"")
        return text.startswith(("InitVar", "dataclasses.InitVar"))
    return isinstance(annotation, dataclasses.InitVar) or annotation is dataclasses.InitVar


def init_order(cls) -> list[tuple[str, bool, Any]]:
    """``(name, is_init_var, default)`` of the constructor's parameters, in declaration
    order (bases first; a redeclared name keeps its first place), as a dataclass orders
    them. An ``InitVar`` is passed to ``__post_init__``, not stored."""
    order: dict[str, tuple[bool, Any]] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or "__annotations__" not in klass.__dict__:
            continue
        for name, annotation in inspect.get_annotations(klass).items():
            if _is_init_var(annotation):
                order[name] = (True, klass.__dict__.get(name, MISSING))
            elif not _is_classvar(annotation) and name in cls._tc_field_names:
                order[name] = (False, None)
    return [(name, is_var, default) for name, (is_var, default) in order.items()]


def collect_fields(
    cls, reserved: frozenset[str], shadow: bool, localns: dict | None = None
) -> tuple[Field, ...]:
    """Fields of the bases (in order), then those of the class body, dataclass-style."""
    fields: dict[str, Field] = {}
    for base in reversed(cls.__mro__[1:]):
        for field in base.__dict__.get("_tc_fields", ()):
            fields[field.name] = field
    annotations = inspect.get_annotations(cls)
    for name, annotation in annotations.items():
        if _is_classvar(annotation):
            continue
        if name.startswith("_tc_"):
            raise AttributeError(
                f"{cls.__name__}: field names cannot start with '_tc_' (reserved for "
                f"TensorClass internals); rename {name!r}."
            )
        if not shadow and name in reserved:
            raise AttributeError(
                f"{cls.__name__}: the field name {name!r} clashes with a TensorClass "
                f"attribute of that name. Rename the field, or allow it with "
                f"TensorClass['shadow'] (then {name!r} reads the field, not the attribute)."
            )
        default = cls.__dict__.get(name, MISSING)
        factory = MISSING
        if isinstance(default, dataclasses.Field):
            factory = default.default_factory
            default = default.default
        elif isinstance(default, (list, dict, set)):
            raise ValueError(
                f"{cls.__name__}: mutable default {type(default).__name__} for field "
                f"{name!r} is not allowed; use dataclasses.field(default_factory=...)."
            )
        fields[name] = Field(name, annotation, default, factory, cls, localns)
    seen_default = None
    for field in fields.values():
        if field.has_default:
            seen_default = field.name
        elif seen_default is not None:
            raise TypeError(
                f"{cls.__name__}: non-default field {field.name!r} follows default field "
                f"{seen_default!r}; give it a default or move it before."
            )
    return tuple(fields.values())


def _resolve(field: Field) -> Any:
    """The field's annotation as a type (``None`` while it cannot be resolved)."""
    if field.target is not MISSING:
        return field.target
    annotation = field.annotation
    # a quoted annotation under ``from __future__ import annotations`` ("'Node'") is a
    # string twice: evaluate until it is not a string
    for _ in range(3):
        if not isinstance(annotation, str):
            break
        module = sys.modules.get(field.owner.__module__)
        localns = dict(field.localns or {})
        localns.setdefault(field.owner.__name__, field.owner)
        try:
            annotation = eval(annotation, vars(module) if module else {}, localns)
        except Exception:  # a forward reference not defined yet: try again next time
            return None
    field.target = annotation
    return annotation


def check_tensor_only_annotations(cls, fields: tuple[Field, ...]) -> None:
    """``tensor_only`` classes declare tensor-compatible fields (checked when resolvable).

    Inherited fields are checked too: a base that is not ``tensor_only`` may declare
    a ``str`` field, which a ``tensor_only`` subclass could never store.
    """
    for field in fields:
        target = _resolve(field)
        if target is None:
            continue
        if not _tensor_compatible_annotation(target):
            where = "" if field.owner is cls else f" (inherited from {field.owner.__name__})"
            raise TypeError(
                f"{cls.__name__}(tensor_only): field {field.name!r}{where} is annotated "
                f"{target!r}, "
                f"which is not a tensor type. tensor_only fields hold tensors (or "
                f"Optional[Tensor], numbers, arrays, TensorDict/TensorClass, NonTensorData for a "
                f"wrapped value); drop "
                f"tensor_only to store other Python values."
            )


def _tensor_compatible_annotation(target: Any) -> bool:
    if target is type(None) or target is typing.Any:
        return target is type(None)
    origin = typing.get_origin(target)
    if origin is typing.Union or (origin is not None and _is_union(target)):
        return all(_tensor_compatible_annotation(a) for a in typing.get_args(target))
    if isinstance(target, type):
        return issubclass(target, (torch.Tensor, *_SCALARS, NonTensorData)) or getattr(
            target, "_is_tensor_collection", False
        )
    return False


def holds_non_tensor(field: Field) -> bool:
    """True for a field annotated ``NonTensorData``: a ``tensor_only`` class keeps its value
    wrapped (reading the field gives the ``NonTensorData``), as tensordict does."""
    target = _resolve(field)
    return isinstance(target, type) and issubclass(target, NonTensorData)


def convert_non_tensor(owner: str, name: str, value: Any, size: torch.Size, device, plain) -> Any:
    """The converter of a ``NonTensorData`` field of a ``tensor_only`` class."""
    if isinstance(value, NonTensorData):
        value = value.data
    return NonTensorData._make(value, size, device)


def _is_union(target: Any) -> bool:
    import types

    return isinstance(target, types.UnionType)


# ---------------------------------------------------------------------- converting
def fit_tensor(owner: str, name: str, value: torch.Tensor, size: torch.Size, device):
    shape = leaf_shape(value)  # -1 at a nested tensor's ragged dims
    if shape[: len(size)] != size:
        raise BatchSizeMismatchError(
            f"{owner}: the tensor for field {name!r} has shape {list(shape)}, which does "
            f"not start with the batch size {list(size)}. Pass batch_size=... matching the "
            f"leading dims of every field."
        )
    if device is not None and value.device != device:
        value = value.to(device)
    return value


def fit_collection(owner: str, name: str, value: Any, size: torch.Size, device):
    if value.batch_size[: len(size)] != size:
        raise BatchSizeMismatchError(
            f"{owner}: the {type(value).__name__} for field {name!r} has batch size "
            f"{list(value.batch_size)}, which does not start with {list(size)}."
        )
    if device is not None and value.device != device:
        value = value.to(device)
    return value


def _nested_from_mapping(value: Mapping, size: torch.Size, device, plain: type):
    return plain(value, batch_size=size, device=device)


def convert_default(
    owner: str, name: str, value: Any, size: torch.Size, device, plain: type
) -> Any:
    """What a value becomes under the default casting rules."""
    if isinstance(value, torch.Tensor):
        return fit_tensor(owner, name, value, size, device)
    if is_tensor_collection(value) or isinstance(value, NonTensorStack):
        # a stack holds one value per element: it stays a stack (not one list value)
        return fit_collection(owner, name, value, size, device)
    if isinstance(value, NonTensorData):
        return NonTensorData._make(value.data, size, device)
    if isinstance(value, _SCALARS):
        if size and isinstance(value, _PY_NUMBERS):
            # a 0-d tensor cannot carry the batch dims: keep the Python number
            return NonTensorData._make(value, size, device)
        return fit_tensor(owner, name, torch.as_tensor(value, device=device), size, device)
    if isinstance(value, Mapping):
        return _nested_from_mapping(value, size, device, plain)
    if isinstance(value, (list, tuple)):
        tensor = stacked_tensors(value)  # tensors of one shape: their stack, as tensordict
        if tensor is not None:
            return fit_tensor(owner, name, tensor, size, device)
    stack = stacked_list(value, size, device, owner, name)  # a list: one item per element
    if stack is not None:
        return stack
    return NonTensorData._make(value, size, device)


def convert_nocast(owner: str, name: str, value: Any, size: torch.Size, device, plain: type) -> Any:
    if isinstance(value, _SCALARS):
        return NonTensorData._make(value, size, device)
    return convert_default(owner, name, value, size, device, plain)


def convert_tensor_only(
    owner: str, name: str, value: Any, size: torch.Size, device, plain: type
) -> Any:
    if isinstance(value, torch.Tensor):
        return fit_tensor(owner, name, value, size, device)
    if is_tensor_collection(value):
        return fit_collection(owner, name, value, size, device)
    if isinstance(value, _SCALARS):
        return fit_tensor(owner, name, torch.as_tensor(value, device=device), size, device)
    if isinstance(value, Mapping):
        return _nested_from_mapping(value, size, device, plain)
    if isinstance(value, (list, tuple)):
        # tensor-compatible (a list of numbers, of tensors...): cast, as the flag promises
        try:
            tensor = stacked_tensors(value)
            if tensor is None:
                tensor = torch.as_tensor(value, device=device)
        except (TypeError, ValueError, RuntimeError):
            pass
        else:
            return fit_tensor(owner, name, tensor, size, device)
    raise TypeError(
        f"{owner}(tensor_only): field {name!r} expects a tensor (or a value torch.as_tensor "
        f"accepts), got {type(value).__name__} {value!r}. Drop the tensor_only flag to store "
        f"non-tensor values."
    )


def make_autocast(field: Field) -> Callable:
    """The converter of one field of an ``autocast`` class."""

    def convert(owner: str, name: str, value: Any, size: torch.Size, device, plain: type) -> Any:
        target = _resolve(field)
        return _cast_to(target, owner, name, value, size, device, plain)

    return convert


def _unwrap_optional(target: Any) -> Any:
    if typing.get_origin(target) is typing.Union or _is_union(target):
        args = [a for a in typing.get_args(target) if a is not type(None)]
        return args[0] if len(args) == 1 else tuple(args)
    return target


def _cast_to(target: Any, owner: str, name: str, value: Any, size, device, plain: type) -> Any:
    if typing.get_origin(target) is typing.Union or _is_union(target):
        # tensordict's rule: a union (Optional included) names no one type to cast to,
        # so the value is kept as given (a dict stays a dict, a number a number)
        if isinstance(value, Mapping) and not is_tensor_collection(value):
            return NonTensorData._make(value, size, device)
        return convert_nocast(owner, name, value, size, device, plain)
    origin = typing.get_origin(target)
    if origin is not None and isinstance(origin, type):
        target = origin
    if target is None or target is typing.Any or not isinstance(target, type):
        return convert_default(owner, name, value, size, device, plain)
    if isinstance(value, NonTensorStack) and not issubclass(target, torch.Tensor):
        return fit_collection(owner, name, value, size, device)  # one value per element
    if isinstance(value, NonTensorData):
        value = value.data
    if issubclass(target, torch.Tensor):
        stacked = stacked_tensors(value) if isinstance(value, (list, tuple)) else None
        if stacked is not None:
            value = stacked
        if not isinstance(value, torch.Tensor):
            value = _call_cast(torch.as_tensor, value, target, owner, name)
        return fit_tensor(owner, name, value, size, device)
    if getattr(target, "_is_tensor_collection", False):
        return fit_collection(
            owner, name, _to_collection(target, value, size, device, plain), size, device
        )
    if is_tensor_collection(value) or (isinstance(value, torch.Tensor) and target is object):
        return convert_default(owner, name, value, size, device, plain)
    if not isinstance(value, target):
        value = _call_cast(target, value, target, owner, name)
    return NonTensorData._make(value, size, device)


def _to_collection(target: Any, value: Any, size, device, plain: type) -> Any:
    if is_tensor_collection(value):
        if isinstance(value, target):
            return value
        if issubclass(target, plain):
            return value.to_tensordict() if not isinstance(value, plain) else value
        view = value._to_tensordict_view()
        return target.from_tensordict(view)
    if isinstance(value, Mapping):
        if issubclass(target, plain):
            return plain(value, batch_size=size, device=device)
        # fields the dict leaves out get their default, or None (as tensordict does)
        return target.from_tensordict(plain({}, batch_size=size, device=device), value)
    raise TypeError(
        f"autocast: cannot cast a {type(value).__name__} to {target.__name__}; give a "
        f"{target.__name__} or a dict of its fields."
    )


def _call_cast(fn: Callable, value: Any, target: type, owner: str, name: str) -> Any:
    try:
        return fn(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{owner}(autocast): cannot cast the {type(value).__name__} given for field "
            f"{name!r} to its annotation {target.__name__}: {error}"
        ) from None


_MAPPING_TYPES = (dict, Mapping, typing.MutableMapping, object)


def keeps_mappings(field: Field) -> bool:
    """True when the field is annotated ``dict`` (``Mapping``, ``Any``, ``object``...).

    A dict given to such a field is a Python value (non-tensor data), as in
    tensordict; other fields turn a dict into a nested TensorDict.
    """
    target = _unwrap_optional(_resolve(field))
    if target is typing.Any:
        return True
    if isinstance(target, tuple):  # a union: keep when one of its members keeps mappings
        return any(t is typing.Any or (typing.get_origin(t) or t) in _MAPPING_TYPES for t in target)
    return (typing.get_origin(target) or target) in _MAPPING_TYPES


def mapping_aware(field: Field, converter: Callable, plain: type) -> Callable:
    """``converter``, except that a mapping given to a ``dict``/``Any`` field stays a value.

    ``plain`` is the TensorDict class a nested mapping becomes (the class's
    ``_plain_tensordict()``).
    """

    def convert(owner: str, name: str, value: Any, size: torch.Size, device) -> Any:
        if type(value) is not torch.Tensor and isinstance(value, Mapping) and keeps_mappings(field):
            return NonTensorData._make(value, size, device)  # the object given, as tensordict
        return converter(owner, name, value, size, device, plain)

    return convert
