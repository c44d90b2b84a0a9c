"""New containers from a container (``new_zeros``...), from other Python structures
(``from_dict``, ``from_dataclass``, ``from_namedtuple``, ``from_struct_array``,
``from_any``) and conversions out (``numpy``, ``to_namedtuple``), plus small
accessors (``dtype``, ``depth``, ...).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..helpers.build import _build, struct_leaf
from ..helpers.hooks import HOOKS
from ..helpers.leafwise import (
    check_in_place_write,
    is_collection,
    keep_names,
    map_leaves,
    no_names,
    tensor_leaves,
)
from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData, NonTensorStack
from ..helpers.rewrap import rewrap
from ..helpers.sizes import leaf_shape, plain_size

_Tensor = torch.Tensor


def _size_arg(size: tuple) -> torch.Size:
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        return plain_size(size[0])
    return plain_size(size)


def _regular_shape(values: list) -> torch.Size:
    """The leading dims over which the nested lists ``values`` are regular."""
    shape = []
    level = [values]
    while level and all(type(v) is list for v in level):
        lengths = {len(v) for v in level}
        if len(lengths) != 1:
            break
        shape.append(lengths.pop())
        level = [item for v in level for item in v]
    return torch.Size(shape)


def _is_dataframe(obj: Any) -> bool:
    """Whether ``obj`` is a pandas DataFrame (pandas is not imported to find out)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(obj, pandas.DataFrame)


def _is_namedtuple(obj: Any) -> bool:
    """A ``collections.namedtuple``, or a struct sequence such as torch's return types
    (``torch.max(x, 0)``), whose field names are its ``__match_args__``."""
    cls = type(obj)
    return isinstance(obj, tuple) and (hasattr(cls, "_fields") or hasattr(cls, "n_sequence_fields"))


def _named_fields(obj: tuple) -> dict:
    if hasattr(type(obj), "_fields"):
        return obj._asdict()
    return dict(zip(type(obj).__match_args__, obj, strict=False))


def _plain(obj: Any, tuples: bool = False) -> Any:
    """``obj`` with dataclasses, named tuples and structured arrays turned into dicts;
    with ``tuples`` (``from_any``), plain tuples too, keyed ``"0"``, ``"1"``, ... at any
    depth (inside a dataclass field as well)."""
    if is_collection(obj):
        return obj
    if tuples and type(obj) is tuple:
        return {str(i): _plain(v, tuples) for i, v in enumerate(obj)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name), tuples) for f in dataclasses.fields(obj)}
    if _is_namedtuple(obj):
        return {k: _plain(v, tuples) for k, v in _named_fields(obj).items()}
    if isinstance(obj, np.ndarray):
        return struct_leaf(obj)
    if isinstance(obj, Mapping):
        return {k: _plain(v, tuples) for k, v in obj.items()}
    return obj


class ConstructorsMixin(ContainerMixin):
    """Constructors and conversions of a container.

    Example:
        >>> td = TensorDict({"a": torch.ones(2, 3)}, [2])
        >>> td.new_zeros(4)["a"].shape, td.dtype, td.depth
        (torch.Size([4, 3]), torch.float32, 0)
    """

    __slots__ = ()

    # ------------------------------------------------------------------ new_*
    def _new(self, size: torch.Size, make: Any):
        return map_leaves(self, make, size, False, no_names)

    def _new_batch(self, size: torch.Size, make: Any):
        """A container of batch size ``size`` whose leaves are ``make(leaf, shape)``.

        Each leaf keeps its feature dims: ``(*batch_size, *f)`` becomes ``(*size, *f)``,
        and nested containers keep their extra batch dims, as in tensordict.
        """
        ndim = len(self._batch_size)
        # the dim names stay when the batch keeps its number of dims (as in tensordict)
        names = keep_names if len(size) == ndim else no_names
        return map_leaves(self, lambda t: make(t, size + t.shape[ndim:]), size, True, names)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad: bool = False):
        """A container of batch size ``size`` with the same keys, its leaves zeros.

        Each leaf keeps its feature dims: ``(*batch_size, *f)`` becomes ``(*size, *f)``.

        Example:
            >>> TensorDict({"a": torch.ones(2, 3)}, [2]).new_zeros(4, 5)["a"].shape
            torch.Size([4, 5, 3])
        """
        return self._new_batch(
            _size_arg(size),
            lambda t, shape: t.new_zeros(
                shape, dtype=dtype, device=device, requires_grad=requires_grad
            ),
        )

    def new_ones(self, *size, dtype=None, device=None, requires_grad: bool = False):
        """A container of batch size ``size`` with the same keys, its leaves ones.

        Each leaf keeps its feature dims: ``(*batch_size, *f)`` becomes ``(*size, *f)``.

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).new_ones(3)["a"].tolist()
            [1.0, 1.0, 1.0]
        """
        return self._new_batch(
            _size_arg(size),
            lambda t, shape: t.new_ones(
                shape, dtype=dtype, device=device, requires_grad=requires_grad
            ),
        )

    def new_empty(
        self,
        *size,
        dtype=None,
        device=None,
        requires_grad: bool = False,
        empty_lazy: bool = False,
    ):
        """A container of batch size ``size`` with the same keys, its leaves uninitialised.

        Each leaf keeps its feature dims: ``(*batch_size, *f)`` becomes ``(*size, *f)``.

        ``empty_lazy=True`` also empties the ``NonTensorStack`` entries (one value per
        element, which cannot be resized): like the tensors, they become stacks of
        ``None`` of shape ``size``.

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).new_empty(3)["a"].shape
            torch.Size([3])
        """
        shape = _size_arg(size)
        source, stacks = self, []
        if empty_lazy:
            stacks = [k for k, v in self.items(True) if isinstance(v, NonTensorStack)]
            source = self.exclude(*stacks)
        out = source._new_batch(
            shape,
            lambda t, leaf_shape: t.new_empty(
                leaf_shape, dtype=dtype, device=device, requires_grad=requires_grad
            ),
        )
        ndim = len(self._batch_size)
        for key in stacks:
            stack_shape = shape + self.get(key).batch_size[ndim:]
            out.set(key, NonTensorStack(_nones(stack_shape), batch_size=stack_shape))
        return out

    def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False):
        """A container of batch size ``size`` with the same keys, its leaves ``fill_value``.

        Each leaf keeps its feature dims: ``(*batch_size, *f)`` becomes ``(*size, *f)``.

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).new_full([2], 7.0)["a"].tolist()
            [7.0, 7.0]
        """
        return self._new_batch(
            torch.Size(size),
            lambda t, shape: t.new_full(
                shape, fill_value, dtype=dtype, device=device, requires_grad=requires_grad
            ),
        )

    def new_tensor(self, data: Any, *, dtype=None, device=None, requires_grad: bool = False):
        """A container whose leaves are copies of ``data``, each with its leaf's dtype.

        ``data`` may be a container with the same keys (leaf by leaf).

        Example:
            >>> td = TensorDict({"a": torch.ones(2, dtype=torch.int64)}, [2])
            >>> td.new_tensor([1.5, 2.5])["a"]
            tensor([1, 2])
        """
        kwargs = {"dtype": dtype, "device": device, "requires_grad": requires_grad}

        def copy(t: _Tensor, d: _Tensor) -> _Tensor:  # Tensor.new_tensor warns on tensors
            out = d.detach().to(
                device=device if device is not None else t.device,
                dtype=dtype if dtype is not None else t.dtype,
                copy=True,
            )
            return out.requires_grad_(requires_grad)

        if is_collection(data):
            from ..helpers.leafwise import map_pairs

            view = data._to_tensordict_view()
            pairs = map_pairs(self, view, copy, "new_tensor", elementwise=False)
            return pairs._like(pairs._data, view._batch_size, None)
        if not isinstance(data, _Tensor):
            shape = torch.as_tensor(data).shape
            return self._new(shape, lambda t: t.new_tensor(data, **kwargs))
        return self._new(data.shape, lambda t: copy(t, data))

    # ------------------------------------------------------------------ from other structures
    @classmethod
    def from_dict(
        cls,
        input_dict: Mapping,
        batch_size=None,
        device=None,
        batch_dims: int | None = None,
        *,
        auto_batch_size: bool = False,
        names=None,
    ):
        """A container from a (nested) dict; ``auto_batch_size=True`` infers the batch size.

        Without ``batch_size``, the batch size is ``[]`` unless ``auto_batch_size=True``
        or ``batch_dims`` is given: then each level gets the longest batch its leaves
        share (at most ``batch_dims`` dims). ``names`` names the batch dims.

        Example:
            >>> td = TensorDict.from_dict({"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3)}},
            ...                           auto_batch_size=True)
            >>> td.batch_size, td["b"].batch_size
            (torch.Size([3]), torch.Size([3]))
        """
        out = _build(cls, _plain(input_dict), batch_size, device, auto_batch_size, batch_dims)
        if names is not None:
            out.names = names
        return out

    @classmethod
    def from_dataclass(
        cls,
        dataclass: Any,
        *,
        dest_cls: type | None = None,
        auto_batch_size: bool = False,
        batch_dims=None,
        as_tensorclass: bool = False,
        device=None,
        batch_size=None,
    ):
        """A container from a dataclass instance (nested dataclasses become nested containers).

        With ``as_tensorclass=True``, the conversion is :func:`tdfunc.from_dataclass`'s: an
        instance of ``dest_cls`` (by default a TensorClass made from the dataclass), or,
        given a dataclass type, the TensorClass type. ``dest_cls`` is for that form only.

        Example:
            >>> import dataclasses
            >>> @dataclasses.dataclass
            ... class Point:
            ...     x: torch.Tensor
            >>> TensorDict.from_dataclass(Point(torch.zeros(3)), auto_batch_size=True).batch_size
            torch.Size([3])
            >>> point = Point(torch.zeros(3))
            >>> tc = TensorDict.from_dataclass(point, as_tensorclass=True, batch_size=[3])
            >>> is_tensorclass(tc), tc.batch_size
            (True, torch.Size([3]))
        """
        if as_tensorclass:
            return HOOKS.from_dataclass(
                dataclass,
                dest_cls=dest_cls,
                auto_batch_size=auto_batch_size,
                batch_dims=batch_dims,
                batch_size=batch_size,
                device=device,
            )
        if not dataclasses.is_dataclass(dataclass) or isinstance(dataclass, type):
            raise TypeError(
                f"TensorDict.from_dataclass: expected a dataclass instance, got "
                f"{type(dataclass).__name__}."
            )
        return _build(cls, _plain(dataclass), batch_size, device, auto_batch_size, batch_dims)

    @classmethod
    def from_namedtuple(
        cls,
        named_tuple: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims=None,
        device=None,
        batch_size=None,
    ):
        """A container from a named tuple (nested named tuples become nested containers).

        Example:
            >>> import collections
            >>> Pair = collections.namedtuple("Pair", ["a", "b"])
            >>> td = TensorDict.from_namedtuple(Pair(torch.zeros(2), torch.ones(2)))
            >>> sorted(td.keys())
            ['a', 'b']
        """
        if not _is_namedtuple(named_tuple):
            raise TypeError(
                f"TensorDict.from_namedtuple: expected a named tuple, got "
                f"{type(named_tuple).__name__}."
            )
        return _build(cls, _plain(named_tuple), batch_size, device, auto_batch_size, batch_dims)

    @classmethod
    def from_any(
        cls,
        obj: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims=None,
        device=None,
        batch_size=None,
    ):
        """A container from a dict, dataclass, named tuple, structured array, pandas
        DataFrame (:meth:`from_pandas`) or container.

        A tuple becomes a container keyed ``"0"``, ``"1"``, ...; a list of numbers
        becomes a tensor, any other list a ``NonTensorStack``.

        Example:
            >>> import collections
            >>> Pair = collections.namedtuple("Pair", ["a", "b"])
            >>> td = TensorDict.from_any({"p": Pair(torch.zeros(2), torch.ones(2))},
            ...                          auto_batch_size=True)
            >>> td["p", "b"].tolist(), td.batch_size
            ([1.0, 1.0], torch.Size([2]))
        """
        if is_collection(obj):
            return obj
        if _is_dataframe(obj):
            return cls.from_pandas(
                obj,
                auto_batch_size=auto_batch_size,
                batch_dims=batch_dims,
                device=device,
                batch_size=batch_size,
            )
        if type(obj) is list:  # numbers make a tensor; other values one value per element
            try:
                return torch.as_tensor(obj, device=device)
            except (TypeError, ValueError, RuntimeError):
                from ..helpers.nontensor import stack_of_list

                return stack_of_list(obj, _regular_shape(obj), device)
        plain = _plain(obj, tuples=True)
        if not isinstance(plain, Mapping):
            raise TypeError(
                f"TensorDict.from_any: cannot build a container from a {type(obj).__name__}; "
                f"expected a dict, dataclass, named tuple or structured array."
            )
        if isinstance(obj, np.ndarray) and batch_size is None and not auto_batch_size:
            batch_size = obj.shape
        return _build(cls, plain, batch_size, device, auto_batch_size, batch_dims)

    # ------------------------------------------------------------------ conversions out
    def to_namedtuple(self, dest_cls: Any = None):
        """A named tuple of the leaves (nested containers become nested named tuples).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
            >>> td.to_namedtuple().b.c.tolist()
            [1.0, 1.0]
        """
        values = {}
        for key, value in self._data.items():
            if is_collection(value):
                values[key] = value._to_tensordict_view().to_namedtuple()
            elif isinstance(value, NonTensorData):
                values[key] = value._value()
            else:
                values[key] = value
        # the class name tensordict gives, so printed results read the same
        kind = dest_cls or collections.namedtuple("GenericDict", list(values))
        return kind(**values)

    def numpy(self) -> dict:
        """A nested dict of NumPy arrays (non-tensor leaves as their Python values).

        Example:
            >>> TensorDict({"a": torch.ones(2)}, [2]).numpy()["a"]
            array([1., 1.], dtype=float32)
        """
        out: dict[str, Any] = {}
        for key, value in self._data.items():
            if isinstance(value, _Tensor):
                out[key] = value.detach().cpu().numpy()
            elif is_collection(value):
                out[key] = value._to_tensordict_view().numpy()
            elif isinstance(value, NonTensorData):
                out[key] = value._value()
            else:
                out[key] = value
        return out

    def as_tensor(self):
        """A container whose leaves are plain ``torch.Tensor`` (subclasses unwrapped, no copy).

        Example:
            >>> type(TensorDict({"a": torch.ones(2)}, [2]).as_tensor()["a"]).__name__
            'Tensor'
        """
        return map_leaves(
            self,
            lambda t: t if type(t) is _Tensor else t.as_subclass(_Tensor),
            None,
            True,
            None,
        )

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype shared by every tensor leaf, or None (mixed dtypes, or no leaf).

        Example:
            >>> TensorDict({"a": torch.ones(2), "b": torch.zeros(2)}, [2]).dtype
            torch.float32
        """
        dtypes = {t.dtype for t in tensor_leaves(self)}
        return dtypes.pop() if len(dtypes) == 1 else None

    @property
    def depth(self) -> int:
        """How deeply leaves are nested: 0 for a container of leaves only.

        Containers without leaves (at any depth) do not count.

        Example:
            >>> TensorDict({"a": {"b": {"c": torch.zeros(())}}}, []).depth
            2
        """
        depths = []
        for value in self._data.values():
            if is_collection(value):
                inner = value._to_tensordict_view()
                if not inner.is_empty():  # an empty level holds no leaf: it adds no depth
                    depths.append(1 + inner.depth)
        return max(depths, default=0)

    def ndimension(self) -> int:
        """The number of batch dims.

        Example:
            >>> TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).ndimension()
            2
        """
        return len(self._batch_size)

    def data_ptr(self, *, storage: bool = False):
        """A container (``batch_size=[]``) of the data pointers of the leaves.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> td.data_ptr()["a"].item() == td["a"].data_ptr()
            True
        """

        def pointer(t: _Tensor) -> _Tensor:
            ptr = t.untyped_storage().data_ptr() if storage else t.data_ptr()
            return torch.tensor(ptr)

        return map_leaves(self, pointer, torch.Size(()), False, no_names)

    def replace(self, *args: Any, **kwargs: Any):
        """A shallow copy with some entries replaced (allowed on frozen instances).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2])
            >>> td.replace(a=torch.ones(2))["a"].tolist(), td["a"].tolist()
            ([1.0, 1.0], [0.0, 0.0])
        """
        source = dict(args[0]) if args else {}
        source.update(kwargs)
        view = self._plain_tensordict()._new_unsafe(
            _shallow(self._data), self._batch_size, self._device, self._names
        )
        view.update(source)
        return self._like(view._data)

    def filter_non_tensor_data(self):
        """A copy without the non-tensor leaves (at any depth).

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "s": "text"}, [])
            >>> list(td.filter_non_tensor_data().keys())
            ['a']
        """
        return map_leaves(self, lambda t: t, None, True, None, keep_non_tensor=False)

    # ------------------------------------------------------------------ batch size
    def auto_batch_size_(self, batch_dims: int | None = None):
        """Set the batch size (nested containers first) to the leading dims all leaves share.

        A ``NonTensorData`` value does not count (it takes any batch size); a
        ``NonTensorStack`` holds one value per element, so its batch dims count as a
        tensor's would. A level without either (at any depth) keeps its batch size (cut
        to ``batch_dims`` when given).

        Example:
            >>> td = TensorDict({"a": torch.zeros(3, 4, 5), "b": torch.zeros(3, 4)}, [])
            >>> td.auto_batch_size_().batch_size
            torch.Size([3, 4])
        """
        check_in_place_write(self, "auto_batch_size_")
        if batch_dims is not None and len(self._batch_size) > batch_dims:
            # nested levels may shrink below this level's size: shrink this level first
            self.batch_size = self._batch_size[:batch_dims]
        shapes = []
        for value in self._data.values():
            if is_collection(value):
                view = value._to_tensordict_view()
                view.auto_batch_size_(batch_dims)  # batch_dims holds at every level
                shapes.append(tuple(view._batch_size))
            elif isinstance(value, _Tensor):
                shapes.append(tuple(leaf_shape(value)))  # -1 at a nested tensor's ragged dims
            elif isinstance(value, NonTensorStack):  # one value per element: its dims bind
                shapes.append(tuple(value.batch_size))
        if not shapes:  # no tensor below this level constrains it: it keeps its batch size
            return self
        common: list[int] = []
        if shapes:
            for sizes in zip(*shapes):
                if len(set(sizes)) != 1:
                    break
                common.append(sizes[0])
            common = common[: min(len(s) for s in shapes)]
        if batch_dims is not None:
            common = common[:batch_dims]
        self.batch_size = torch.Size(common)
        return self


def _shallow(data: dict) -> dict:
    out = {}
    for key, value in data.items():
        if getattr(type(value), "_is_tensordict", False):
            value = value._like(_shallow(value._data))
        elif is_collection(value):
            view = value._to_tensordict_view()
            value = rewrap(value, view._like(_shallow(view._data)))
        out[key] = value
    return out


def _nones(shape: torch.Size) -> Any:
    """A nested list of ``None`` shaped like ``shape``."""
    if not shape:
        return None
    return [_nones(shape[1:]) for _ in range(shape[0])]
