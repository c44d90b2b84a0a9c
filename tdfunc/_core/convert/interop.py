"""``InteropMixin``: conversions to and from NumPy structured arrays and pytrees.

One implementation for TensorDict and every TensorClass: a structured array maps to one
entry per field (nested dtypes to nested containers, string fields to non-tensor
values); a pytree maps to a container that remembers its tree structure.

Example:
    >>> import numpy as np
    >>> arr = np.zeros(2, dtype=[("x", "f4"), ("name", "U5")])
    >>> td = TensorDict.from_struct_array(arr)
    >>> td["x"].tolist(), bool((td.to_struct_array() == arr).all())
    ([0.0, 0.0], True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from ..helpers.build import _build, struct_leaf
from ..helpers.leafwise import is_collection
from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData

# The entry of a container built by ``from_pytree`` that holds the tree structure.
PYTREE_SPEC_KEY = "_pytree_spec"


def _field_values(value: Any, shape: tuple) -> np.ndarray:
    """The NumPy values of one leaf, broadcast to the batch ``shape``."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    values = np.array(value.tolist())
    if values.shape[: len(shape)] != shape:  # one value for the whole batch
        values = np.broadcast_to(values, shape + values.shape)
    return values


def _struct_dtype(data: dict, shape: tuple) -> tuple[list, dict]:
    """The structured dtype of a container's entries, and their values (nested dicts)."""
    fields, values = [], {}
    for key, value in data.items():
        if is_collection(value):
            sub_fields, values[key] = _struct_dtype(_entries(value), shape)
            fields.append((key, sub_fields))
            continue
        if value is None:
            continue
        array = _field_values(value, shape)
        extra = array.shape[len(shape) :]
        fields.append((key, array.dtype, extra) if extra else (key, array.dtype))
        values[key] = array
    return fields, values


def _fill(target: np.ndarray, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict):
            _fill(target[key], value)
        else:
            target[key] = value


def _entries(container: Any) -> dict:
    return container._to_tensordict_view()._data


def _path_key(path: tuple) -> tuple:
    """The nested key of a pytree leaf: one string per level of its path."""
    parts = []
    for entry in path:
        if isinstance(entry, pytree.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, pytree.MappingKey):
            parts.append(str(entry.key))
        elif isinstance(entry, pytree.GetAttrKey):
            parts.append(entry.name)
        else:
            parts.append(str(entry))
    return tuple(parts)


class InteropMixin(ContainerMixin):
    """Structured arrays and pytrees in and out of a container."""

    __slots__ = ()

    @classmethod
    def from_struct_array(
        cls,
        struct_array: np.ndarray,
        *,
        auto_batch_size: bool = False,
        batch_dims=None,
        device=None,
        batch_size=None,
    ):
        """A container from a NumPy structured array: one leaf per field, batch = array shape.

        Numeric fields share the array's memory; string fields become non-tensor values
        (a ``NonTensorStack`` with one string per element); nested dtypes become nested
        containers.

        Example:
            >>> import numpy as np
            >>> arr = np.zeros(3, dtype=[("x", "f4"), ("y", "i8")])
            >>> td = TensorDict.from_struct_array(arr)
            >>> td.batch_size, td["y"].dtype
            (torch.Size([3]), torch.int64)
        """
        if not isinstance(struct_array, np.ndarray) or not struct_array.dtype.names:
            raise TypeError(
                "TensorDict.from_struct_array: expected a NumPy structured array (with named "
                f"fields), got {type(struct_array).__name__}."
            )
        if batch_size is None and not auto_batch_size and batch_dims is None:
            batch_size = struct_array.shape
        data = struct_leaf(struct_array, struct_array.ndim)
        return _build(cls, data, batch_size, device, auto_batch_size, batch_dims)

    def to_struct_array(self) -> np.ndarray:
        """A NumPy structured array of shape ``batch_size`` with one field per entry.

        Tensor entries become fields holding their trailing dims (a copy), non-tensor
        entries fields of their NumPy type (strings as ``U``), nested containers nested
        dtypes. ``from_struct_array`` reads it back.

        Example:
            >>> td = TensorDict({"a": torch.arange(3), "b": {"c": torch.zeros(3, 2)}}, [3])
            >>> arr = td.to_struct_array()
            >>> arr.shape, arr["b"]["c"].shape
            ((3,), (3, 2))
        """
        shape = tuple(self.batch_size)
        fields, values = _struct_dtype(_entries(self), shape)
        out = np.empty(shape, dtype=fields)
        _fill(out, values)
        return out

    @classmethod
    def from_pytree(
        cls,
        pytree_obj: Any,
        *,
        batch_size=None,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
    ):
        """A container holding the leaves of a pytree, which ``to_pytree`` rebuilds.

        Each leaf sits at the nested key of its path (list and tuple positions and dict
        keys as strings, named-tuple fields by name); containers in the tree are kept as
        nested containers. The tree structure is kept in the ``"_pytree_spec"`` entry.
        The result is a TensorDict (also when called on a TensorClass: the keys are the
        tree's, not fields).

        Example:
            >>> tree = {"a": [torch.zeros(2), torch.ones(2)]}
            >>> td = TensorDict.from_pytree(tree)
            >>> td["a", "1"].tolist(), td.to_pytree()["a"][1].tolist()
            ([1.0, 1.0], [1.0, 1.0])
        """
        name = getattr(cls, "__name__", "TensorDict")
        leaves, spec = pytree.tree_flatten_with_path(pytree_obj, is_leaf=is_collection)
        data: dict = {}
        for path, leaf in leaves:
            key = _path_key(path)
            if not key:
                raise TypeError(
                    f"{name}.from_pytree: expected a pytree with containers (dict, list, tuple, "
                    f"...), got a single leaf {type(leaf).__name__}."
                )
            node = data
            for part in key[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ValueError(f"{name}.from_pytree: two leaves map to the key {key!r}.")
            if key[-1] in node or key == (PYTREE_SPEC_KEY,):
                raise ValueError(f"{name}.from_pytree: two leaves map to the key {key!r}.")
            node[key[-1]] = leaf
        data[PYTREE_SPEC_KEY] = NonTensorData(spec)
        # the keys are the tree's, not fields: a TensorClass gives a plain TensorDict too
        plain = cls._plain_tensordict()
        return _build(plain, data, batch_size, None, auto_batch_size, batch_dims)

    def to_pytree(self) -> Any:
        """The pytree a container built by ``from_pytree`` came from (with its leaves).

        Example:
            >>> tree = ([torch.zeros(1)], {"b": torch.ones(1)})
            >>> TensorDict.from_pytree(tree).to_pytree()[1]["b"].tolist()
            [1.0]
        """
        name = type(self).__name__
        view = self._to_tensordict_view()
        spec = view._data.get(PYTREE_SPEC_KEY)
        if not isinstance(spec, NonTensorData) or not isinstance(spec.data, pytree.TreeSpec):
            raise ValueError(
                f"{name}.to_pytree: this {name} was not built by from_pytree (it has no "
                f"{PYTREE_SPEC_KEY!r} entry); use to_dict() for a nested dict."
            )
        spec = spec.data
        positions = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
        paths, _ = pytree.tree_flatten_with_path(positions)
        return pytree.tree_unflatten([view.get(_path_key(path)) for path, _ in paths], spec)

    def from_dict_instance(
        self,
        input_dict: Mapping,
        batch_size=None,
        device=None,
        batch_dims: int | None = None,
        *,
        auto_batch_size: bool = False,
    ):
        """Like ``from_dict``, with the types of this container: an entry that is a
        container (a TensorClass, say) here is rebuilt as one of the same type.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.zeros(2)}}, [2])
            >>> out = td.from_dict_instance(td.to_dict(), auto_batch_size=True)
            >>> type(out["b"]).__name__, out.batch_size
            ('TensorDict', torch.Size([2]))
        """
        entries = _entries(self)
        data = {}
        for key, value in input_dict.items():
            current = entries.get(key)
            if isinstance(value, Mapping) and is_collection(current):
                value = current.from_dict_instance(  # the batch dims lead every level
                    value, batch_size, device, batch_dims, auto_batch_size=auto_batch_size
                )
            data[key] = value
        if getattr(type(self), "_is_tensordict", False):
            return _build(type(self), data, batch_size, device, auto_batch_size, batch_dims)
        # a TensorClass: its own constructor casts the values to the field types
        size = [] if batch_size is None else batch_size
        out = type(self)(**data, batch_size=size, device=device)
        if batch_size is None and (auto_batch_size or batch_dims is not None):
            out.auto_batch_size_(batch_dims)
        return out
