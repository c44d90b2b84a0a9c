"""``TensorClassCore``: typed, dataclass-like containers built on a TensorDict.

The public ``TensorClass`` (and the ``@tensorclass`` decorator) is composed from
this class and the features' mixins in ``tdfunc/_assembly.py``.

A subclass declares its fields with annotations; the class gets a generated
``__init__`` and one property per field (reading straight from the inner
TensorDict). Every TensorDict operation comes from the same shared mixins as
``TensorDict``'s (:class:`~tdfunc._core.ops.TensorOps`, through
:mod:`tdfunc._tensorclass.state`) and returns the same class. An instance holds
one TensorDict (``_td``) and nothing else: assigning a name that is not a field
raises ``AttributeError`` (subclasses get empty ``__slots__``).

Flags come from brackets (``TensorClass["frozen", "nocast"]``), class keywords
(``class Foo(TensorClass, autocast=True)``) or the :func:`tensorclass`
decorator. Each subclass is registered as a pytree node (``vmap``, ``grad`` and
``torch.compile`` see through it: the composed class's ``_tc_register`` hook does
it) and in the class registry (persistence).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from typing_extensions import dataclass_transform

from .._core.helpers.class_names import register_class
from .._core.helpers.codegen import define
from .._core.helpers.frozen import FROZEN, freeze
from .._core.helpers.nontensor import NonTensorData
from .._core.helpers.sizes import as_size
from .convert import TensorClassConvert
from .fields import (
    FLAGS,
    MISSING,
    Field,
    check_tensor_only_annotations,
    collect_fields,
    convert_default,
    convert_nocast,
    convert_non_tensor,
    convert_tensor_only,
    holds_non_tensor,
    init_order,
    make_autocast,
    mapping_aware,
    parse_bracket_flags,
    resolve_flags,
)
from .state import _set_td

if TYPE_CHECKING:
    from collections.abc import Sequence

    from typing_extensions import Self

    FlagName = Literal[
        "autocast", "nocast", "tensor_only", "frozen", "shadow", "skip_post_init_on_rebuild"
    ]

    # For type checkers only: a dataclass_transform metaclass makes every
    # subclass a dataclass with a generated __init__ (fields, then the keyword
    # arguments below). TensorClass names it directly, so (PEP 681) it is
    # neither frozen nor non-frozen, and subclasses may be either.
    @dataclass_transform(eq_default=False, field_specifiers=(dataclasses.field,))
    class _Meta(type): ...

    class _BatchSizeArg:
        def __get__(self, obj: object, owner: Any) -> torch.Size: ...
        def __set__(self, obj: object, value: Sequence[int] | torch.Size | int | None) -> None: ...

    class _DeviceArg:
        def __get__(self, obj: object, owner: Any) -> torch.device | None: ...
        def __set__(self, obj: object, value: torch.device | str | int | None) -> None: ...

    class _NamesArg:
        def __get__(self, obj: object, owner: Any) -> list[str | None] | None: ...
        def __set__(self, obj: object, value: Sequence[str | None] | None) -> None: ...

else:

    class _Meta(type):
        """Gives every subclass empty ``__slots__``: a typo (``foo.xx = 5``) is an error."""

        def __new__(mcs, name: str, bases: tuple, namespace: dict, **kwargs: Any):
            namespace.setdefault("__slots__", ())
            return super().__new__(mcs, name, bases, namespace, **kwargs)


FrozenInstanceError = dataclasses.FrozenInstanceError
_FACTORY = object()  # placeholder default of a field with a default_factory
_RESERVED: list[frozenset[str]] = []
_CARRIERS: dict[tuple, type] = {}
_UNSET: Any = object()  # a class keyword not given (None is a value: cast every leaf)


class TensorClassCore(TensorClassConvert, metaclass=_Meta):
    """What every TensorClass is, below the features (the public class adds them).

    The public ``TensorClass`` derives from it and sets ``_tc_abstract = True``
    (it is a base, not a tensorclass) and the ``_tc_register`` hook.

    Example:
        >>> issubclass(TensorClass, TensorClassCore), is_tensorclass(TensorClass)
        (True, False)
    """

    __slots__ = ("__weakref__",)
    if TYPE_CHECKING:
        # keyword arguments of the generated __init__ (read back as properties)
        batch_size: _BatchSizeArg = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
        device: _DeviceArg = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
        names: _NamesArg = dataclasses.field(default=None, kw_only=True)  # type: ignore[assignment]
    _is_tensor_collection: ClassVar[bool] = True
    _tc_flags: ClassVar[dict[str, bool]] = dict.fromkeys(FLAGS, False)
    _tc_fields: ClassVar[tuple[Field, ...]] = ()
    _tc_field_names: ClassVar[frozenset[str]] = frozenset()
    _tc_converters: ClassVar[dict[str, Callable]] = {}
    _tc_frozen: ClassVar[bool] = False
    # the casting flags under tensordict's class attribute names (code written for
    # tensordict reads them); ``_tc_flags`` holds every flag
    _autocast: ClassVar[bool] = False
    _nocast: ClassVar[bool] = False
    _get_reads_value: ClassVar[bool] = True  # tensordict: a tensorclass's get gives the value
    _tc_ready: ClassVar[bool] = False  # a real tensorclass (not TensorClass, not a flag carrier)
    _tc_init: ClassVar[Callable[..., None]]
    _tc_init_vars: ClassVar[tuple[tuple[str, Any], ...]] = ()  # (name, default) of InitVars
    # the default cast_filter of to() and the dtype shorthands (None: every leaf is cast)
    _tc_cast_filter: ClassVar[Callable[[tuple, torch.Tensor], bool] | None] = None

    def __init_subclass__(
        cls,
        *,
        autocast: bool | None = None,
        nocast: bool | None = None,
        tensor_only: bool | None = None,
        frozen: bool | None = None,
        shadow: bool | None = None,
        skip_post_init_on_rebuild: bool | None = None,
        cast_filter: Any = _UNSET,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        requested = {
            "autocast": autocast,
            "nocast": nocast,
            "tensor_only": tensor_only,
            "frozen": frozen,
            "shadow": shadow,
            "skip_post_init_on_rebuild": skip_post_init_on_rebuild,
        }
        if cast_filter is not _UNSET:
            if cast_filter is not None and not callable(cast_filter):
                raise TypeError(
                    f"{cls.__name__}: cast_filter must be a function (key, value) -> bool or "
                    f"None, got {type(cast_filter).__name__}."
                )
            # staticmethod: a function stored on the class must not bind to instances
            cls._tc_cast_filter = None if cast_filter is None else staticmethod(cast_filter)
        cls._tc_flags = resolve_flags(cls, requested, TensorClassCore)
        # a flag carrier (TensorClass["frozen"]) or the public TensorClass: bases, not tensorclasses
        if cls.__dict__.get("_tc_carrier") or cls.__dict__.get("_tc_abstract"):
            cls._tc_ready = False
            return
        _build_class(cls, cls._tc_flags, _defining_locals(cls))

    def __class_getitem__(cls, item: FlagName | tuple[FlagName, ...]) -> type[Self]:
        """``TensorClass["frozen", "nocast"]``: a base class with those flags turned on."""
        flags = parse_bracket_flags(cls.__name__, item)
        key = (cls, tuple(sorted(flags)))
        carrier = _CARRIERS.get(key)
        if carrier is None:
            label = ", ".join(repr(flag) for flag in flags)
            namespace = {
                "__slots__": (),
                "__module__": cls.__module__,
                "__qualname__": f"{cls.__qualname__}[{label}]",
                "__doc__": cls.__doc__,
                "_tc_carrier": True,
            }
            metaclass: Any = type(cls)
            carrier = metaclass(f"{cls.__name__}[{label}]", (cls,), namespace, **flags)
            _CARRIERS[key] = carrier
        return carrier

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        if not cls._tc_ready:
            raise TypeError(
                f"{cls.__name__} is not a tensorclass itself: subclass it and declare fields, "
                f"e.g. `class Batch({cls.__name__}): x: torch.Tensor`."
            )
        cls._tc_init(self, *args, **kwargs)

    # ------------------------------------------------------------------ copying
    def __getstate__(self) -> dict[str, Any]:
        return {"_td": self._td}

    def __setstate__(self, state: dict[str, Any]) -> None:
        _set_td(self, state["_td"])

    def __deepcopy__(self, memo: dict) -> Self:
        import copy

        out = object.__new__(type(self))
        _set_td(out, copy.deepcopy(self._td, memo))
        return out


def _reserved_names(cls: type) -> frozenset[str]:
    """Names a field may not take: every attribute of TensorClass and of TensorDict."""
    if not _RESERVED:
        # "data" is free: tensordict's saving tutorial declares a field named data
        # without the shadow flag ("sub" too: a common field name; the field wins).
        free = {"data", "sub"}
        # the features' methods are the plain TensorDict's too
        names = frozenset(dir(TensorClassCore)) | frozenset(dir(cls._plain_tensordict()))
        _RESERVED.append(names - free)
    return _RESERVED[0]


def _defining_locals(cls: type) -> dict | None:
    """Locals of the scope running the class statement that string annotations name."""
    wanted = set()
    for annotation in inspect.get_annotations(cls).values():
        if isinstance(annotation, str):
            wanted.update(re.findall(r"[A-Za-z_]\w*", annotation))
    if not wanted:
        return None
    frame: Any = sys._getframe(2)
    while frame is not None and str(frame.f_globals.get("__name__")).startswith("tdfunc."):
        frame = frame.f_back  # the decorator form: skip tdfunc's frames (and its public wrapper)
    if frame is None or frame.f_locals is frame.f_globals:
        return None
    local_vars = frame.f_locals
    return {name: local_vars[name] for name in wanted if name in local_vars}


def _build_class(cls: type[TensorClassCore], flags: dict[str, bool], localns: dict | None) -> None:
    """Fields, properties, ``__init__``, hashing, and the pytree/registry entries."""
    fields = collect_fields(cls, _reserved_names(cls), flags["shadow"], localns)
    if flags["tensor_only"]:
        check_tensor_only_annotations(cls, fields)
        converter = convert_tensor_only
    elif flags["nocast"]:
        converter = convert_nocast
    else:
        converter = convert_default
    cls._tc_fields = fields
    cls._tc_field_names = frozenset(field.name for field in fields)
    plain = cls._plain_tensordict()
    cls._tc_converters = {
        field.name: mapping_aware(
            field,
            convert_non_tensor
            if flags["tensor_only"] and holds_non_tensor(field)
            else (make_autocast(field) if flags["autocast"] else converter),
            plain,
        )
        for field in fields
    }
    cls._tc_frozen = cls._frozen = flags["frozen"]
    cls._autocast, cls._nocast = flags["autocast"], flags["nocast"]
    cls._field_names = cls._tc_field_names
    cls._tc_ready = True
    cls.__dataclass_fields__ = _dataclass_fields(fields)  # type: ignore[attr-defined]
    for field in fields:
        setattr(cls, field.name, _field_property(field.name, flags["tensor_only"]))
    init = _make_init(cls, fields, flags)
    cls._tc_init = init
    if "__init__" not in cls.__dict__:
        cls.__init__ = init  # type: ignore[method-assign]
    if "__match_args__" not in cls.__dict__:
        setattr(cls, "__match_args__", tuple(field.name for field in fields))  # noqa: B010
    if flags["frozen"]:
        if cls.__dict__.get("__hash__") is None:
            cls.__hash__ = object.__hash__  # type: ignore[assignment]
        # a class's own __setattr__ stays: its super() call reaches the field
        # properties, which refuse on a frozen class (TensorClassState._check_mutable)
        if "__setattr__" not in cls.__dict__:
            cls.__setattr__ = _frozen_setattr  # type: ignore[method-assign, assignment]
        if "__delattr__" not in cls.__dict__:
            cls.__delattr__ = _frozen_delattr  # type: ignore[method-assign, assignment]
    cls._tc_register(cls)  # the pytree registration, wired in by the composed class
    register_class(cls)


_STATE = frozenset({"_td", "_data", "_batch_size", "_device", "_names", "_is_locked"})


def _dataclass_fields(fields: tuple[Field, ...]) -> dict[str, dataclasses.Field]:
    """``__dataclass_fields__``: ``dataclasses.is_dataclass`` and ``fields`` see the fields."""
    out = {}
    for field in fields:
        if field.default_factory is not MISSING:
            spec: Any = dataclasses.field(default_factory=field.default_factory)
        elif field.default is not MISSING:
            spec = dataclasses.field(default=field.default)
        else:
            spec = dataclasses.field()
        spec.name = field.name
        spec.type = field.annotation
        spec._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
        out[field.name] = spec
    # the constructor's keywords, as init-only pseudo-fields: ``dataclasses.replace``
    # passes them on (the copy keeps the batch size, device and names), while
    # ``dataclasses.fields`` and ``asdict`` list only the fields
    for name in ("batch_size", "device", "names"):
        if name in out:  # a field of that name (shadow) takes the keyword's place
            continue
        spec = dataclasses.field(default=None)
        spec.name = name
        spec.type = dataclasses.InitVar
        spec._field_type = dataclasses._FIELD_INITVAR  # type: ignore[attr-defined]
        out[name] = spec
    return out


def _frozen_setattr(self: TensorClassCore, name: str, value: Any) -> None:
    if name in _STATE:  # the shared mixins' state (e.g. the device of a new result)
        object.__setattr__(self, name, value)
        return
    td = getattr(self, "_td", None)
    if td is not None and td._is_locked != FROZEN and name in self._tc_field_names:
        # still being built: __post_init__
        hint = (
            f"In __post_init__, use object.__setattr__(self, {name!r}, value), as in a "
            f"frozen dataclass."
        )
    else:
        hint = (
            "Build a new instance instead (frozen instances are immutable parameter sets "
            "and batches)."
        )
    raise FrozenInstanceError(f"{type(self).__name__} is frozen: cannot assign {name!r}. {hint}")


def _frozen_delattr(self: TensorClassCore, name: str) -> None:
    raise FrozenInstanceError(f"{type(self).__name__} is frozen: cannot delete {name!r}.")


_PROPERTY_SOURCE = """
def fget(self):
    try:
        value = self._td._data[{name!r}]
    except KeyError:
        return None
    if type(value) is Tensor:
        return value
    if isinstance(value, NonTensorData):
        return value._value()  # a stack inside a transform refuses to be read
    return value
"""

_TENSOR_ONLY_SOURCE = """
def fget(self):
    try:
        return self._td._data[{name!r}]
    except KeyError:
        return None
"""


def _field_property(name: str, tensor_only: bool) -> property:
    """A property reading the field straight from the inner TensorDict's dict."""
    namespace: dict[str, Any] = {"Tensor": torch.Tensor, "NonTensorData": NonTensorData}
    source = (_TENSOR_ONLY_SOURCE if tensor_only else _PROPERTY_SOURCE).format(name=name)
    namespace.update(define(source, f"field {name}", namespace))

    def fset(self: TensorClassCore, value: Any) -> None:
        self._write_field(name, value)

    def fdel(self: TensorClassCore) -> None:
        self._write_field(name, None)

    return property(namespace["fget"], fset, fdel, doc=f"The field {name!r}.")


def _make_init(cls: type[TensorClassCore], fields: tuple[Field, ...], flags: dict[str, bool]):
    """Generate ``__init__(self, <fields>, *, batch_size=None, device=None, names=None)``.

    Every name the generated code uses besides the parameters starts with ``_tc_``,
    a prefix field names cannot have, so no field can shadow it.
    """
    names = [field.name for field in fields]
    api = cls.__name__
    namespace: dict[str, Any] = {
        "_tc_Size": torch.Size,
        "_tc_Tensor": torch.Tensor,
        "_tc_as_size": as_size,
        "_tc_device": torch.device,
        "_tc_new_td": cls._plain_tensordict()._new_unsafe,
        "_tc_set_td": _set_td,
        "_tc_FACTORY": _FACTORY,
        "_tc_api": api,
        "_tc_freeze": freeze,
    }
    params = []
    by_name = {field.name: field for field in fields}
    order = init_order(cls)
    if [name for name, is_var, _ in order if not is_var] != names:
        # fields declared where the annotations do not show them: fields first, as stored
        order = [(n, False, None) for n in names] + [o for o in order if o[1]]
    init_vars = tuple((name, default) for name, is_var, default in order if is_var)
    cls._tc_init_vars = init_vars
    post_init = "_tc_self.__post_init__(" + ", ".join(name for name, _ in init_vars) + ")"
    seen_default = None
    for name, is_var, default in order:
        if is_var:  # an InitVar: a parameter for __post_init__, not stored
            if default is not MISSING:
                namespace[f"_tc_default_{name}"] = default
                params.append(f"{name}=_tc_default_{name}")
                seen_default = name
            elif seen_default is not None:
                raise TypeError(
                    f"{api}: non-default InitVar {name!r} follows default {seen_default!r}; "
                    f"give it a default or move it before."
                )
            else:
                params.append(name)
            continue
        field = by_name[name]
        if field.has_default:
            seen_default = name
        elif seen_default is not None:  # after a default InitVar (fields alone are checked)
            raise TypeError(
                f"{api}: non-default field {name!r} follows default {seen_default!r}; give "
                f"it a default or move it before."
            )
        if field.default is not MISSING:
            namespace[f"_tc_default_{field.name}"] = field.default
            params.append(f"{field.name}=_tc_default_{field.name}")
        elif field.default_factory is not MISSING:
            namespace[f"_tc_factory_{field.name}"] = field.default_factory
            params.append(f"{field.name}=_tc_FACTORY")
        else:
            params.append(field.name)
    extra = [k for k in ("batch_size", "device", "names") if k not in names]
    signature = ", ".join(["_tc_self", *params])
    if extra:
        signature += ", *, " + ", ".join(f"{k}=None" for k in extra)
    body = []
    if "batch_size" in extra:
        # a torch.Size is checked too: it may hold negative dims or numpy integers
        body.append("_tc_size = _tc_as_size(batch_size, _tc_api)")
    else:
        body.append("_tc_size = _tc_Size()")
    if "device" in extra:
        body.append("_tc_dev = None if device is None else _tc_device(device)")
    else:
        body.append("_tc_dev = None")
    body += [
        "_tc_data = {}",
        "_tc_n = len(_tc_size)",
        # one batch dim (the common case) is checked without slicing a torch.Size
        "_tc_s0 = _tc_size[0] if _tc_n == 1 else (-2 if _tc_n == 0 else -1)",
    ]
    fast = not flags["autocast"]  # a tensor is stored as it is unless autocast casts it
    if not flags["frozen"] and _own_setattr(cls):
        # a class's own __setattr__ sees every field the constructor sets, as a dataclass's
        # does: start empty, then assign each given field through it
        body += [
            "_tc_td = _tc_new_td(_tc_data, _tc_size, _tc_dev, None)",
            _names_line(cls) if "names" in extra else "pass",
            "_tc_set_td(_tc_self, _tc_td)",
        ]
        for field in fields:
            if field.default_factory is not MISSING:
                body.append(
                    f"if {field.name} is _tc_FACTORY: {field.name} = _tc_factory_{field.name}()"
                )
            body.append(f"if {field.name} is not None: _tc_self.{field.name} = {field.name}")
        if hasattr(cls, "__post_init__"):
            body.append(post_init)
        return _compile_init(cls, fields, signature, body, namespace)
    for field in fields:
        name = field.name
        namespace[f"_tc_convert_{name}"] = cls._tc_converters[name]
        if field.default_factory is not MISSING:
            body.append(f"if {name} is _tc_FACTORY: {name} = _tc_factory_{name}()")
        convert = (
            f"_tc_data[{name!r}] = _tc_convert_{name}(_tc_api, {name!r}, {name}, _tc_size, _tc_dev)"
        )
        if fast:
            body += [
                "try:",  # a strided nested tensor has no .shape: it takes the converter
                f"    _tc_fast = type({name}) is _tc_Tensor and _tc_dev is None and (_tc_s0 == -2 "
                f"or (_tc_s0 >= 0 and {name}.ndim and {name}.shape[0] == _tc_s0) "
                f"or (_tc_s0 == -1 and {name}.shape[:_tc_n] == _tc_size))",
                "except RuntimeError:",
                "    _tc_fast = False",
                "if _tc_fast:",
                f"    _tc_data[{name!r}] = {name}",
                f"elif {name} is not None:",
                f"    {convert}",
            ]
        else:
            body += [f"if {name} is not None:", f"    {convert}"]
    body.append("_tc_td = _tc_new_td(_tc_data, _tc_size, _tc_dev, None)")
    if "names" in extra:  # before freezing: naming the dims is part of building
        body.append(_names_line(cls))
    body.append("_tc_set_td(_tc_self, _tc_td)")
    if hasattr(cls, "__post_init__"):
        body.append(post_init)
    if flags["frozen"]:
        # after __post_init__, which may set a field with object.__setattr__ (the idiom of
        # a frozen dataclass); ``self.field = ...`` refuses there, as in a dataclass
        body.append("_tc_freeze(_tc_td)")
    return _compile_init(cls, fields, signature, body, namespace)


def _own_setattr(cls: type) -> bool:
    """True when the class, or a user base of it, defines ``__setattr__``."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("tdfunc."):
            return False
        if "__setattr__" in klass.__dict__ and klass.__dict__["__setattr__"] is not _frozen_setattr:
            return True
    return False


def _names_line(cls: type) -> str:
    """The constructor's naming of the dims: its errors name the class, not TensorDict."""
    return f"if names is not None: _tc_td._set_names(names, {cls.__name__ + '.names'!r})"


def _compile_init(cls: type, fields: tuple[Field, ...], signature: str, body: list, namespace):
    api = cls.__name__
    source = f"def __init__({signature}):\n" + "\n".join("    " + line for line in body)
    namespace.update(define(source, f"{api}.__init__", namespace))
    init = namespace["__init__"]
    # the declared annotations (strings under ``from __future__ import annotations``), so
    # ``inspect.signature`` reads like a dataclass: ``(x: 'torch.Tensor', ..., *, batch_size=...)``
    init.__annotations__ = {field.name: field.annotation for field in fields}
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    return init


# ---------------------------------------------------------------------- public helpers
def is_tensorclass(obj: Any) -> bool:
    """True for a tensorclass (a subclass of ``TensorClass`` with fields) or an instance.

    Example:
        >>> class Foo(TensorClass):
        ...     x: torch.Tensor
        >>> is_tensorclass(Foo), is_tensorclass(Foo(x=torch.zeros(()))), is_tensorclass(TensorClass)
        (True, True, False)
    """
    cls = obj if isinstance(obj, type) else type(obj)
    return issubclass(cls, TensorClassCore) and cls._tc_ready


def decorate(root: type, cls: type | None, flags: dict[str, bool], options: dict) -> Any:
    """The ``@tensorclass`` decorator's work: ``cls`` (or, when None, a decorator) rebuilt
    as a subclass of ``root`` (the public TensorClass) with ``flags`` turned on and the
    class keywords ``options`` (``cast_filter``) given."""
    requested = {name: value or None for name, value in flags.items()}
    parse_bracket_flags("tensorclass", tuple(k for k, v in requested.items() if v))

    def wrap(target: type) -> Any:
        return _from_plain_class(target, requested, root, options)

    return wrap if cls is None else wrap(cls)


def _from_plain_class(
    target: type, requested: Mapping[str, bool | None], root: type, options: dict
) -> Any:
    if not isinstance(target, type):
        raise TypeError(f"tensorclass: expected a class, got {type(target).__name__}.")
    if issubclass(target, root):
        raise TypeError(
            f"tensorclass: {target.__name__} is already a TensorClass; pass flags as class "
            f"keywords instead, e.g. class {target.__name__}(Base, frozen=True)."
        )
    namespace = {k: v for k, v in target.__dict__.items() if k not in ("__dict__", "__weakref__")}
    if dataclasses.is_dataclass(target):
        _drop_dataclass_members(namespace)
        # @dataclass removes a field's class attribute when it has a default_factory;
        # the field declaration carries it back
        for field in dataclasses.fields(target):
            if field.default_factory is not dataclasses.MISSING and field.name not in namespace:
                namespace[field.name] = dataclasses.field(default_factory=field.default_factory)
    namespace["__qualname__"] = target.__qualname__
    bases = tuple(base for base in target.__bases__ if base is not object) + (root,)
    flags = {k: v for k, v in requested.items() if v is not None}
    new = type(target.__name__, bases, namespace, **flags, **options)
    _retarget_class_cells(namespace, target, new)
    return new


# What ``@dataclass`` adds to a class; the TensorClass machinery builds its own.
_DATACLASS_MEMBERS = frozenset(
    ["__dataclass_fields__", "__dataclass_params__", "__match_args__"]
    + ["__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"]
    + ["__lt__", "__le__", "__gt__", "__ge__", "__replace__", "__getstate__", "__setstate__"]
)


def _drop_dataclass_members(namespace: dict) -> None:
    """Remove from a dataclass's namespace what ``@dataclass`` generated (its ``__init__``
    would bypass the container); methods written in the class body stay. A generated
    function's code comes from ``exec`` (its file name is ``<string>``), under any
    wrapper (``__repr__`` is wrapped against recursion)."""
    for name in _DATACLASS_MEMBERS & namespace.keys():
        value = namespace[name]
        code = getattr(inspect.unwrap(value) if callable(value) else value, "__code__", None)
        if code is None or code.co_filename.startswith("<"):
            del namespace[name]


def _retarget_class_cells(namespace: dict, old: type, new: type) -> None:
    """Point the ``__class__`` cells of methods (zero-argument ``super()``) at ``new``."""
    for value in namespace.values():
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        functions = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [value]
        for function in functions:
            function = inspect.unwrap(function) if callable(function) else function
            for cell in getattr(function, "__closure__", None) or ():
                try:
                    if cell.cell_contents is old:
                        cell.cell_contents = new
                except ValueError:  # an empty cell
                    continue
