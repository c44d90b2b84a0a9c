"""Whole-container conveniences: ``tolist``, ``from_list``, ``from_tuple``, ``popitem``,
``bytes``, ``cat_tensors``...

Each is written once over the container state and serves ``TensorDict`` and every
``TensorClass``.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.arange(4).reshape(2, 2)}, [2])
    >>> td.tolist(convert_tensors=True)
    [{'a': [0, 1]}, {'a': [2, 3]}]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..helpers.mixin import ContainerMixin, read_value
from ..helpers.mixin import is_tensor_collection as _collection
from ..helpers.nested_keys import unravel_key

if TYPE_CHECKING:
    from typing_extensions import Self

_Tensor = torch.Tensor


def _element_dict(node: Any, convert_tensors: Any, tolist_first: bool) -> dict:
    """One batch element (no batch dims) as a nested dict."""
    out = {}
    for key, value in node._to_tensordict_view()._data.items():
        if _collection(value):
            if tolist_first and value.batch_size:
                out[key] = value.tolist(convert_tensors=convert_tensors, tolist_first=True)
            else:
                out[key] = _element_dict(value, convert_tensors, tolist_first)
        elif isinstance(value, _Tensor) and convert_tensors:
            out[key] = value.numpy(force=True) if convert_tensors == "numpy" else value.tolist()
        else:
            out[key] = read_value(value)
    return out


def _byte_parts(tensor: torch.Tensor) -> list:
    """The plain tensors whose elements make up ``tensor`` (and its gradient)."""
    if tensor.is_nested and hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        parts = [getattr(tensor, name) for name in names]
    else:
        parts = [tensor]
    grad = tensor.grad if tensor.is_leaf and tensor.requires_grad else None
    return parts + ([grad] if grad is not None else [])


class EntriesMixin(ContainerMixin):
    """Conversions and entry-level helpers shared by every container."""

    __slots__ = ()

    def tolist(
        self,
        *,
        convert_nodes: bool = True,
        convert_tensors: bool | str = False,
        tolist_first: bool = False,
    ) -> Any:
        """The container as nested lists over its batch dims.

        Each element is a ``dict`` (``convert_nodes=True``) or the container of that
        element (``convert_nodes=False``). ``convert_tensors=True`` turns tensors
        into lists (``"numpy"``: arrays); it needs ``convert_nodes=True``. With
        ``tolist_first=True`` a nested container with more batch dims is itself
        listed over them instead of becoming a dict of batched tensors. A container
        without batch dims gives one element.

        Example:
            >>> td = TensorDict({"a": torch.arange(4).reshape(2, 2)}, [2])
            >>> [x["a"].tolist() for x in td.tolist()]
            [[0, 1], [2, 3]]
        """
        if convert_tensors and not convert_nodes:
            raise TypeError(
                f"{type(self).__name__}.tolist: convert_tensors=True needs convert_nodes=True "
                "(tensors are converted inside the dicts that nodes become)."
            )
        if not self._batch_size:
            if not convert_nodes:
                return self
            return _element_dict(self, convert_tensors, tolist_first)
        return [
            item.tolist(
                convert_nodes=convert_nodes,
                convert_tensors=convert_tensors,
                tolist_first=tolist_first,
            )
            for item in self.unbind(0)  # type: ignore[attr-defined]
        ]

    @classmethod
    def from_list(
        cls,
        input: list,
        *,
        auto_batch_size: bool | None = None,
        batch_size=None,
        device=None,
        batch_dims: int | None = None,
        names=None,
        lazy: bool | None = None,
    ) -> Self:
        """A container stacking a list of dicts (or containers) along a new leading dim.

        The inverse of :meth:`tolist` over one dim: each dict is built with
        :meth:`from_dict` (``batch_size`` and ``batch_dims`` count the list's dim
        first, so each element gets ``batch_size[1:]``), a container is stacked as
        it is, and the elements are stacked with ``torch.stack``. tdfunc's stacks are
        dense: ``lazy=True`` is refused.

        Example:
            >>> td = TensorDict.from_list([{"a": torch.zeros(2)}, {"a": torch.ones(2)}],
            ...                           auto_batch_size=True)
            >>> td.batch_size, td["a"][1].tolist()
            (torch.Size([2, 2]), [1.0, 1.0])
        """
        api = f"{cls.__name__}.from_list"
        if lazy:
            raise NotImplementedError(
                f"{api}: lazy stacks are not part of tdfunc; lazy=None or False builds the "
                f"dense stack (elements of one structure and shape)."
            )
        if not isinstance(input, (list, tuple)) or not input:
            raise ValueError(f"{api}: expected a non-empty list of dicts or containers.")
        inner_size = None
        if batch_size is not None:
            size = torch.Size(batch_size)
            if not size or size[0] != len(input):
                raise ValueError(
                    f"{api}: batch_size {list(size)} must start with the length of the list "
                    f"({len(input)})."
                )
            inner_size = size[1:]
        inner_dims = None if batch_dims is None else max(batch_dims - 1, 0)
        items = []
        for element in input:
            if _collection(element):
                items.append(element)
            elif isinstance(element, Mapping):
                items.append(
                    cls.from_dict(  # type: ignore[attr-defined]
                        element,
                        batch_size=inner_size,
                        device=device,
                        batch_dims=inner_dims,
                        auto_batch_size=bool(auto_batch_size),
                    )
                )
            else:
                raise TypeError(
                    f"{api}: expected dicts or containers, got a {type(element).__name__}."
                )
        out = torch.stack(items, 0)
        if names is not None:
            out.names = names
        return out

    @classmethod
    def fromkeys(cls, keys, value: Any = 0, batch_size=None, device=None) -> Self:
        """A container with every key in ``keys`` holding ``value`` (a tensor is cloned per key).

        On a TensorClass the keys are its fields, and the result is an instance of it.

        Example:
            >>> TensorDict.fromkeys(["a", ("nested", "e")], 0)["nested", "e"]
            tensor(0)
        """
        out = cls._plain_tensordict()({}, batch_size=batch_size, device=device)
        items = [(k, value.clone() if isinstance(value, _Tensor) else value) for k in keys]
        out._write(items, False, True, "fromkeys")
        return cls._adopt(out)

    @classmethod
    def from_tuple(
        cls,
        obj: tuple,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device=None,
        batch_size=None,
    ) -> Any:
        """A TensorDict keyed ``"0"``, ``"1"``, ... by the tuple's positions.

        Nested tuples become nested TensorDicts the same way, dicts, dataclasses and
        named tuples are converted as :meth:`from_any` does. As in tensordict, the
        result is a TensorDict also when called on a TensorClass (positions are not
        fields).

        Example:
            >>> td = TensorDict.from_tuple((1, torch.zeros(3), (2.0,)))
            >>> list(td.keys(True, True)), td["0"]
            (['0', '1', ('2', '0')], tensor(1))
        """
        if not isinstance(obj, tuple):
            raise TypeError(
                f"{cls.__name__}.from_tuple: expected a tuple, got a {type(obj).__name__}; "
                f"use from_dict for a dict and from_list for a list of dicts."
            )
        plain = cls._plain_tensordict()
        return plain.from_any(  # type: ignore[attr-defined]
            tuple(obj),  # a named tuple is keyed by position too
            auto_batch_size=auto_batch_size,
            batch_dims=batch_dims,
            device=device,
            batch_size=batch_size,
        )

    def __getitems__(self, indices: list) -> Self:
        """``self[indices]`` for a list of indices (what a ``DataLoader`` reads per batch).

        Example:
            >>> td = TensorDict({"a": torch.arange(4)}, [4])
            >>> td.__getitems__([3, 0])["a"].tolist()
            [3, 0]
        """
        return self[torch.as_tensor(indices, dtype=torch.long)]  # type: ignore[index]

    def popitem(self) -> tuple:
        """Remove the last inserted top-level entry and return ``(key, value)``.

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": torch.ones(())})
            >>> td.popitem()
            ('b', tensor(1.))
        """
        if self._is_locked:  # the lock is the error to report, also when empty
            self._check_writable("popitem", list(self._data))  # type: ignore[attr-defined]
        if not self._data:
            raise KeyError(f"{type(self).__name__}.popitem: the container is empty.")
        key = next(reversed(self._data))
        return key, self.pop(key)  # type: ignore[attr-defined]

    def bytes(self, *, count_duplicates: bool = True) -> int:
        """The number of bytes of the tensor leaves: their elements, and their gradients.

        A nested (jagged) tensor counts its component tensors.
        ``count_duplicates=False`` counts a tensor object held in several places once.

        Example:
            >>> TensorDict({"a": torch.zeros(3), "b": torch.zeros(2, dtype=torch.int64)}).bytes()
            28
        """
        seen: set[int] = set()
        total = 0
        for leaf in self._tensor_leaves():
            for part in _byte_parts(leaf):
                if not count_duplicates:
                    if id(part) in seen:
                        continue
                    seen.add(id(part))
                total += part.numel() * part.element_size()
        return total

    def _join_entries(self, keys: tuple, out_key: Any, keep_entries: bool, join: Any, api: str):
        if not keys:
            raise ValueError(f"{type(self).__name__}.{api}: pass at least one key to join.")
        missing = object()
        values = [self.get(key, missing) for key in keys]  # type: ignore[attr-defined]
        for key, value in zip(keys, values):
            if value is missing:
                raise KeyError(
                    f"{type(self).__name__}.{api}: no entry at {key!r}; the entries are "
                    f"{sorted(map(str, self.keys(True, True)))}."  # type: ignore[attr-defined]
                )
            if not isinstance(value, _Tensor):
                raise TypeError(
                    f"{type(self).__name__}.{api}: the entry at {key!r} is a "
                    f"{type(value).__name__}; only tensor entries can be joined."
                )
        result = join(values)
        # the result is written first: a write that is refused (its batch dims, a lock)
        # then leaves the entries in place
        self.set(out_key, result)  # type: ignore[attr-defined]
        if not keep_entries:
            written = unravel_key(out_key)
            for key in dict.fromkeys(unravel_key(key) for key in keys):  # each once
                if key != written:
                    self.del_(key)  # type: ignore[attr-defined]
        return self

    def cat_tensors(
        self, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False
    ) -> Self:
        """Concatenate the tensors at ``keys`` along ``dim`` into ``out_key``; returns self.

        The entries at ``keys`` are removed unless ``keep_entries=True``.

        Example:
            >>> td = TensorDict(a=torch.zeros(1), b=torch.ones(1))
            >>> td.cat_tensors("a", "b", out_key="c")["c"].tolist(), "a" in td
            ([0.0, 1.0], False)
        """
        return self._join_entries(
            keys, out_key, keep_entries, lambda v: torch.cat(v, dim), "cat_tensors"
        )

    def stack_tensors(
        self, *keys: Any, out_key: Any, dim: int = 0, keep_entries: bool = False
    ) -> Self:
        """Stack the tensors at ``keys`` along a new ``dim`` into ``out_key``; returns self.

        Example:
            >>> td = TensorDict(a=torch.zeros(()), b=torch.ones(()))
            >>> td.stack_tensors("a", "b", out_key="c")["c"].tolist()
            [0.0, 1.0]
        """
        return self._join_entries(
            keys, out_key, keep_entries, lambda v: torch.stack(v, dim), "stack_tensors"
        )

    def _leaf_tensors(self, sorted: Any, api: str) -> list:
        """The tensor leaves in key order, sorted order, or the order of the keys given."""
        if sorted is None or sorted is False:
            keys = list(self.keys(True, True))  # type: ignore[attr-defined]
        elif sorted is True:
            keys = list(self.keys(True, True, sort=True))  # type: ignore[attr-defined]
        else:
            keys = list(sorted)
        values = [self.get(key) for key in keys]  # type: ignore[attr-defined]
        if not values:
            raise ValueError(f"{type(self).__name__}.{api}: there is no tensor leaf to join.")
        for key, value in zip(keys, values):
            if not isinstance(value, _Tensor):
                raise TypeError(
                    f"{type(self).__name__}.{api}: the entry at {key!r} is a "
                    f"{type(value).__name__}; only tensor leaves can be joined."
                )
        return values

    def cat_from_tensordict(
        self,
        dim: int = 0,
        *,
        sorted: Any = None,
        out: _Tensor | None = None,
    ) -> _Tensor:
        """Every tensor leaf concatenated along ``dim`` into one tensor.

        Leaves come in key order (``keys(True, True)``), sorted with ``sorted=True``, or
        in the order of the keys ``sorted`` lists.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2, 1), "b": {"c": torch.ones(2, 1)}}, [2])
            >>> td.cat_from_tensordict(dim=1).tolist()
            [[0.0, 1.0], [0.0, 1.0]]
        """
        values = self._leaf_tensors(sorted, "cat_from_tensordict")
        return torch.cat(values, dim) if out is None else torch.cat(values, dim, out=out)

    def stack_from_tensordict(
        self,
        dim: int = 0,
        *,
        sorted: Any = None,
        out: _Tensor | None = None,
    ) -> _Tensor:
        """Every tensor leaf stacked along a new ``dim`` into one tensor (see
        :meth:`cat_from_tensordict` for the order).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2])
            >>> td.stack_from_tensordict(dim=1).tolist()
            [[0.0, 1.0], [0.0, 1.0]]
        """
        values = self._leaf_tensors(sorted, "stack_from_tensordict")
        return torch.stack(values, dim) if out is None else torch.stack(values, dim, out=out)
