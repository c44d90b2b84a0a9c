"""The composition root: the public classes, put together from the core and the features.

Read from the ground up, tdfunc is built in floors (each imports only floors below it):

1. ``tdfunc._core``: the container core (keys, shapes and indexing, leafwise math,
   apply, non-tensor data, frozen/lock state). It imports nothing of tdfunc above it.
2. The features, built on the core: ``_persist`` (memory-mapped persistence),
   ``_distributed`` (messages and ``map``), ``_modules`` (module swapping,
   ``functional_call``), ``_pytree`` (pytree registration, ``dims_like``) and
   ``_tensorclass`` (the TensorClass machinery).
3. This module: it composes ``TensorDict``, ``TensorClass``, ``TensorDictBase`` and
   ``ModuleSwap`` from the core classes and the features' mixins, registers them as
   pytree nodes and under their stable names, and is the only module that imports
   every feature.
4. On top: ``Ensemble`` and its batched engine (``_ensemble``), ``tdfunc.optim``, the demo.

The core and the features reach the composed classes only through hooks on
``self``/``cls``: ``_plain_tensordict()`` (the public ``TensorDict``), ``_swap_handle``
(what ``to_module`` returns) and ``TensorClass._tc_register`` (called for every new
tensorclass); helpers with no ``self`` read ``HOOKS`` (``_core/helpers/hooks.py``),
which this module binds once its classes exist. The composed classes say
``__module__ = "tdfunc"``: pickles and class names name them by their public path.

Example:
    >>> from tdfunc import TensorClass, TensorDict
    >>> TensorDict.__module__, TensorDict({}, [])._plain_tensordict() is TensorDict
    ('tdfunc', True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any, ClassVar, TypeVar, overload

from typing_extensions import dataclass_transform

from ._core.base import TensorDictBaseCore
from ._core.container import TensorDictCore
from ._core.helpers.arrow import from_arrow as from_arrow
from ._core.helpers.arrow import to_arrow as to_arrow
from ._core.helpers.by_value import group_by as group_by
from ._core.helpers.class_names import register_class
from ._core.helpers.collating import collate as collate
from ._core.helpers.hooks import bind as bind_core_hooks
from ._core.helpers.legacy_paths import register as register_legacy_paths
from ._core.helpers.mixin import TensorCollection as TensorCollection
from ._core.helpers.mixin import is_tensor_collection_or_class as is_tensor_collection  # noqa: F401 - re-exported by tdfunc/__init__.py
from ._core.helpers.nested_keys import NestedKey as NestedKey
from ._core.helpers.nested_keys import unravel_key as unravel_key
from ._core.helpers.nontensor import NonTensorData as NonTensorData
from ._core.helpers.nontensor import NonTensorStack as NonTensorStack
from ._core.helpers.nontensor import is_non_tensor as is_non_tensor
from ._core.helpers.options import get_printoptions as get_printoptions
from ._core.helpers.options import set_capture_non_tensor_stack as set_capture_non_tensor_stack
from ._core.helpers.options import set_list_to_stack as set_list_to_stack
from ._core.helpers.options import set_printoptions as set_printoptions
from ._core.helpers.packing import PackLayout as PackLayout
from ._core.helpers.padding import pad as pad
from ._core.helpers.padding import pad_sequence as pad_sequence
from ._core.helpers.repr import parse_tensor_dict_string as parse_tensor_dict_string
from ._core.helpers.unpadding import unpad_sequence as unpad_sequence
from ._core.shape.combine import cat as cat
from ._core.shape.combine import merge_tensordicts as merge_tensordicts
from ._core.shape.combine import stack as stack
from ._distributed import DistributedMixin, GatherMixin, MapMixin, RemoteMixin
from ._distributed import DistributedWork as DistributedWork
from ._distributed.sharded import gather_members as gather_members
from ._distributed.sharded import shard_ensemble as shard_ensemble
from ._distributed.sharded import shard_range as shard_range
from ._modules.functional_call import functional_call as functional_call
from ._modules.module_swap import ModuleSwapMixin
from ._modules.swap_handle import SwapHandle
from ._persist import MemoryMappedTensor as MemoryMappedTensor
from ._persist import PersistMixin
from ._persist import memmap as memmap
from ._persist.to_process import reduce_collection_for_process
from ._pytree.dims import dims_like as dims_like
from ._pytree.node import register as register_pytree_node
from ._tensorclass.tensorclass import TensorClassCore, _Meta, decorate
from ._tensorclass.tensorclass import is_tensorclass as is_tensorclass


class Features(ModuleSwapMixin, PersistMixin, DistributedMixin, GatherMixin, RemoteMixin, MapMixin):
    """The methods the features give every container (TensorDict and TensorClass)."""

    __slots__ = ()


class TensorDict(TensorDictCore, Features):
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

    __module__ = "tdfunc"
    __slots__ = ()

    @classmethod
    def _plain_tensordict(cls) -> type[TensorDict]:
        return TensorDict


class ModuleSwap(SwapHandle, TensorDict):
    """The values a module held before ``td.to_module(module)``; restores them on exit.

    A ``TensorDict`` (batch size ``[]``, the keys of the TensorDict that was
    loaded) and a context manager: leaving the ``with`` block (also on an
    exception) puts exactly the previous objects back, the same ``Parameter``
    instances and ties. Results of its methods are plain TensorDicts.

    Example:
        >>> model = nn.Linear(2, 2)
        >>> zeros = TensorDict.from_module(model).apply(torch.zeros_like)
        >>> with zeros.to_module(model):
        ...     model.weight.abs().sum().item()
        0.0
        >>> model.weight.abs().sum().item() > 0
        True
        >>> old = zeros.to_module(model)  # without `with`: loaded for good
        >>> model.weight.abs().sum().item()
        0.0
        >>> _ = old.to_module(model)  # the previous values, put back
        >>> model.weight.abs().sum().item() > 0
        True
    """

    __module__ = "tdfunc"
    __slots__ = ()


class TensorClass(TensorClassCore, Features, metaclass=_Meta):
    """Base class of typed tensor containers (the inheritance form of ``@tensorclass``).

    Subclass it and annotate fields; instances behave like a TensorDict
    (indexing, reshaping, ``torch.stack``, ``to``, ``apply``, memmap) and every
    derived result is an instance of the same class. ``TensorClass`` itself is
    not a tensorclass: only its subclasses are.

    Keyword Args:
        batch_size: the leading dims every field shares. Defaults to ``[]``.
        device: if given, every tensor written is moved to this device.
        names: optional names of the batch dims.

    Example:
        >>> from typing import Any
        >>> class Foo(TensorClass):
        ...     tensor: torch.Tensor
        ...     non_tensor: Any
        ...     nested: Any = None
        >>> foo = Foo(tensor=torch.randn(3), non_tensor="a string!", batch_size=[3])
        >>> foo[1:].tensor.shape, foo.non_tensor
        (torch.Size([2]), 'a string!')
        >>> class Params(TensorClass["frozen"]):
        ...     weight: torch.Tensor
        >>> hash(Params(weight=torch.ones(2))) is not None
        True
    """

    __module__ = "tdfunc"
    __slots__ = ()
    _tc_abstract: ClassVar[bool] = True  # a base: only its subclasses are tensorclasses
    # every new tensorclass becomes a pytree node (vmap, grad, torch.compile see through it)
    _tc_register = staticmethod(register_pytree_node)

    @classmethod
    def _plain_tensordict(cls) -> type[TensorDict]:
        return TensorDict


class TensorAttrs(TensorClass):
    """The device, dtype and shape of one tensor, as :meth:`TensorDict.attrs` records them.

    A container of them, passed to ``to``, casts each leaf to its own device and
    dtype. The fields are prefixed ``tgt_`` so they do not hide the container's own
    ``device``, ``dtype`` and ``shape``; a field not recorded is ``None``.

    Example:
        >>> td = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3, dtype=torch.int32)}, [3])
        >>> attrs = td.attrs()
        >>> attrs["a"].tgt_device, attrs["a"].tgt_dtype
        (device(type='cpu'), torch.float32)
    """

    __module__ = "tdfunc"
    tgt_device: Any = None
    tgt_dtype: Any = None
    tgt_shape: Any = None

    @classmethod
    def from_tensor(cls, tensor: Any, *, fields: Any = ("device", "dtype", "shape")) -> TensorAttrs:
        """The attributes of ``tensor`` named in ``fields`` (the others ``None``).

        Example:
            >>> TensorAttrs.from_tensor(torch.zeros(2), fields=("shape",)).tgt_shape
            torch.Size([2])
        """
        from ._core.convert.attrs import describe

        return describe(tensor, tuple(fields))


# what to_module returns, for TensorDict and TensorClass: a class attribute rather
# than a call, as to_module reads it on every swap
Features._swap_handle = ModuleSwap


class TensorDictBase(TensorDictBaseCore):
    """Abstract type of ``TensorDict`` (and its subclasses); not instantiable.

    Example:
        >>> import tempfile, torch
        >>> from tdfunc import TensorDict, TensorDictBase
        >>> path = tempfile.mkdtemp()
        >>> _ = TensorDict({"a": torch.ones(2)}, [2]).memmap(path)
        >>> loaded = TensorDictBase.load_memmap(path)
        >>> type(loaded).__name__, loaded["a"].tolist()
        ('TensorDict', [1.0, 1.0])
    """

    __module__ = "tdfunc"
    __slots__ = ()
    _marks_tensordicts = True  # TensorDict and its subclasses are virtual subclasses

    # One implementation of loading: the classmethods of PersistMixin (a TensorClass
    # saved on disk comes back as that TensorClass; nothing is converted).
    load_memmap = PersistMixin.__dict__["load_memmap"]
    load = PersistMixin.__dict__["load"]


# a TensorDict everywhere: transforms flatten the handle (and rebuild plain TensorDicts),
# and a checkpoint or state_dict written from it loads (as a plain TensorDict)
for _cls in (TensorDict, ModuleSwap):
    register_pytree_node(_cls)
    register_class(_cls)
# pickles written before the core's reorganisation name old module paths
register_legacy_paths()
# the classes that helpers below this module build without importing them
# multiprocessing sends file-backed leaves by file, never by torch's shared-memory path
ForkingPickler.register(TensorDict, reduce_collection_for_process)


_T = TypeVar("_T")


@overload
def tensorclass(cls: type[_T], /) -> type[_T]: ...


@overload
def tensorclass(
    cls: None = None,
    /,
    *,
    autocast: bool = False,
    nocast: bool = False,
    tensor_only: bool = False,
    frozen: bool = False,
    shadow: bool = False,
    skip_post_init_on_rebuild: bool = False,
    cast_filter: Callable[[tuple, Any], bool] | None = None,
) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(eq_default=False)
def tensorclass(
    cls: type[_T] | None = None,
    /,
    *,
    autocast: bool = False,
    nocast: bool = False,
    tensor_only: bool = False,
    frozen: bool = False,
    shadow: bool = False,
    skip_post_init_on_rebuild: bool = False,
    cast_filter: Callable[[tuple, Any], bool] | None = None,
) -> Any:
    """Decorator form of :class:`TensorClass`: ``@tensorclass`` or ``@tensorclass(frozen=True)``.

    The decorated class is rebuilt as a subclass of ``TensorClass`` (its own bases
    come first), so it has every TensorClass method. Prefer the inheritance form
    for type checking: checkers do not know the decorated class's TensorDict
    methods or its ``batch_size`` argument.

    ``cast_filter`` is the class's default ``cast_filter`` of ``to()`` and the dtype
    shorthands (a predicate ``fn(key, value) -> bool``; subclasses inherit it).
    ``skip_post_init_on_rebuild`` is accepted for tensordict's code: tdfunc runs
    ``__post_init__`` on the data that comes in (the constructor, ``from_tensordict``,
    ``from_dict``, loads), never when an operation rebuilds an instance from an
    existing one (indexing, ``clone``, ``to``, ``apply``, stacking), with the flag or
    without it.

    ``cast_filter`` keeps the integer fields out of dtype casts:

        >>> @tensorclass(cast_filter=is_inexact)
        ... class Mesh:
        ...     points: torch.Tensor
        ...     cells: torch.Tensor
        >>> mesh = Mesh(points=torch.zeros(4, 3), cells=torch.zeros(2, 3, dtype=torch.long))
        >>> mesh.bfloat16().points.dtype, mesh.bfloat16().cells.dtype
        (torch.bfloat16, torch.int64)
        >>> mesh.bfloat16(cast_filter=None).cells.dtype
        torch.bfloat16

    Example:
        >>> @tensorclass
        ... class MyData:
        ...     image: torch.Tensor
        ...     label: torch.Tensor
        >>> data = MyData(torch.zeros(4, 3), torch.arange(4), batch_size=[4])
        >>> data[data.label > 1].batch_size
        torch.Size([2])
    """
    flags = {
        "autocast": autocast,
        "nocast": nocast,
        "tensor_only": tensor_only,
        "frozen": frozen,
        "shadow": shadow,
        "skip_post_init_on_rebuild": skip_post_init_on_rebuild,
    }
    options = {} if cast_filter is None else {"cast_filter": cast_filter}
    return decorate(TensorClass, cls, flags, options)


def from_dataclass(
    obj: Any,
    *,
    dest_cls: type | None = None,
    auto_batch_size: bool = False,
    batch_dims: int | None = None,
    batch_size: Any = None,
    frozen: bool = False,
    autocast: bool = False,
    nocast: bool = False,
    inplace: bool = False,
    shadow: bool = False,
    tensor_only: bool = False,
    device: Any = None,
) -> Any:
    """A tensorclass from a dataclass type, or an instance of one from a dataclass instance.

    Given a type, returns a new TensorClass with the same name and fields (the
    flags as in :func:`tensorclass`). Given an instance, builds an instance of
    ``dest_cls`` (default: the tensorclass made from the instance's type) from its
    fields; ``batch_size``, ``auto_batch_size``, ``batch_dims`` and ``device`` as in
    :meth:`TensorDict.from_dict`. ``inplace=True`` (change the dataclass itself) is
    refused: a TensorClass is built as a new class.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class X:
        ...     a: int
        ...     b: torch.Tensor
        >>> x2 = from_dataclass(X(0, torch.zeros(3)), auto_batch_size=True)
        >>> type(x2).__name__, x2.batch_size, x2.a
        ('X', torch.Size([]), tensor(0))
        >>> X2 = from_dataclass(X, autocast=True)
        >>> X2(a=0, b=0).a
        0
    """
    if not dataclasses.is_dataclass(obj):
        raise TypeError(
            f"from_dataclass: expected a dataclass or a dataclass instance, got "
            f"{obj!r:.80}; use tensorclass(cls) for a plain class."
        )
    if isinstance(obj, type):
        if issubclass(obj, TensorClass):
            return obj  # already a tensorclass
        if inplace:
            raise ValueError(
                "from_dataclass: inplace=True cannot turn the dataclass itself into a "
                "tensorclass; use the class it returns (inplace=False)."
            )
        flags = {"autocast": autocast, "nocast": nocast, "tensor_only": tensor_only}
        return tensorclass(obj, frozen=frozen, shadow=shadow, **flags)
    if dest_cls is None:
        flags = {"autocast": autocast, "nocast": nocast, "tensor_only": tensor_only}
        dest_cls = from_dataclass(type(obj), frozen=frozen, shadow=shadow, **flags)
    elif not (isinstance(dest_cls, type) and issubclass(dest_cls, (TensorClass, TensorDict))):
        raise TypeError(
            f"from_dataclass: dest_cls must be a TensorClass subclass (or TensorDict), got "
            f"{dest_cls!r:.80}."
        )
    return dest_cls.from_dataclass(  # type: ignore[attr-defined]
        obj,
        auto_batch_size=auto_batch_size,
        batch_dims=batch_dims,
        batch_size=batch_size,
        device=device,
    )


bind_core_hooks(tensordict=TensorDict, tensor_attrs=TensorAttrs, from_dataclass=from_dataclass)

# tensordict's module-level constructors (``from tensordict import from_dict``): the
# classmethods of TensorDict themselves, so each behaviour has one home.
from_any = TensorDict.from_any
from_consolidated = TensorDict.from_consolidated
from_csv = TensorDict.from_csv
from_dict = TensorDict.from_dict
from_json = TensorDict.from_json


def from_module(
    module, as_module: bool = False, lock: bool = True, use_state_dict: bool = False
) -> TensorDict:
    """``TensorDict.from_module``, locked by default (``lock=True``) as tensordict's
    function is; the method's default is ``lock=False``.

    Example:
        >>> from torch import nn
        >>> params = from_module(nn.Linear(2, 3))
        >>> params.is_locked, TensorDict.from_module(nn.Linear(2, 3)).is_locked
        (True, False)
    """
    return TensorDict.from_module(
        module, as_module=as_module, lock=lock, use_state_dict=use_state_dict
    )


from_modules = TensorDict.from_modules
from_namedtuple = TensorDict.from_namedtuple
from_pandas = TensorDict.from_pandas
from_parquet = TensorDict.from_parquet
from_pytree = TensorDict.from_pytree
from_struct_array = TensorDict.from_struct_array
from_tuple = TensorDict.from_tuple


def make_tensordict(
    input_dict=None, batch_size=None, device=None, auto_batch_size=None, **kwargs
) -> TensorDict:
    """A TensorDict from ``input_dict`` and keyword entries (``input_dict`` wins on a shared
    key), as :meth:`TensorDict.from_dict` builds it; the batch size is ``[]`` unless given
    or ``auto_batch_size``.

    Example:
        >>> import torch
        >>> td = make_tensordict({"a": torch.zeros(3)}, b={"c": torch.zeros(3, 4)},
        ...                      auto_batch_size=True)
        >>> td.batch_size, td["b"].batch_size
        (torch.Size([3]), torch.Size([3, 4]))
    """
    entries = dict(kwargs)
    if input_dict is not None:
        entries.update(input_dict.items())
    return TensorDict.from_dict(
        entries, batch_size=batch_size, device=device, auto_batch_size=bool(auto_batch_size)
    )


# The composed classes say ``__module__ = "tdfunc"``, so doctest would not look for
# their examples here: name them.
__test__ = {
    "from_module": from_module,
    "make_tensordict": make_tensordict,
    "TensorDict": TensorDict,
    "ModuleSwap": ModuleSwap,
    "TensorClass": TensorClass,
    "TensorDictBase": TensorDictBase,
}
