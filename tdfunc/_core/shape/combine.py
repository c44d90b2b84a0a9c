"""Combining containers: the functions ``merge_tensordicts``, ``cat`` and ``stack``, and
the same joins as classmethods of every container class (:class:`CombineMixin`).

Padding (``pad``, ``pad_sequence``) lives in ``padding.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..helpers.leafwise import is_collection
from ..helpers.mixin import ContainerMixin
from ..helpers.nested_keys import unravel_key
from ..helpers.packing import PackLayout, pack
from ..helpers.rewrap import rewrap
from ..helpers.torch_functions import cat as _cat
from ..helpers.torch_functions import stack as _stack
from ..helpers.writes import convert


def cat(items: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Concatenate containers along batch dim ``dim`` (``torch.cat``).

    Example:
        >>> tds = [TensorDict({"a": torch.zeros(3)}, [3])] * 2
        >>> cat(tds).batch_size
        torch.Size([6])
    """
    return _cat(items, dim, out=out)


def stack(items: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Stack containers along a new batch dim ``dim`` (``torch.stack``).

    Example:
        >>> tds = [TensorDict({"a": torch.zeros(3)}, [3])] * 2
        >>> stack(tds, 1).batch_size
        torch.Size([3, 2])
    """
    return _stack(items, dim, out=out)


def _join(torch_fn: Callable, own_fn: Callable, items: Sequence[Any], dim: int, out: Any) -> Any:
    """Tensors join as ``torch_fn`` joins them, containers through tdfunc's own join."""
    items = list(items)
    if items and not is_collection(items[0]):
        return torch_fn(items, dim) if out is None else torch_fn(items, dim, out=out)
    return own_fn(items, dim, out=out)


class CombineMixin(ContainerMixin):
    """``stack`` and ``cat`` as classmethods of ``TensorDict`` and every ``TensorClass``.

    They are the functions :func:`stack` and :func:`cat` (``torch.stack`` / ``torch.cat``):
    the result has the class of the inputs, whichever class the method is called on.
    """

    __slots__ = ()

    @classmethod
    def stack(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """Stack containers (or tensors) along a new batch dim ``dim`` (``torch.stack``).

        Example:
            >>> td = TensorDict({"a": torch.zeros(3)}, [3])
            >>> TensorDict.stack([td, td], 1).batch_size
            torch.Size([3, 2])
        """
        return _join(torch.stack, _stack, input, dim, out)

    @classmethod
    def cat(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """Concatenate containers (or tensors) along batch dim ``dim`` (``torch.cat``).

        Example:
            >>> td = TensorDict({"a": torch.zeros(3)}, [3])
            >>> TensorDict.cat([td, td]).batch_size
            torch.Size([6])
        """
        return _join(torch.cat, _cat, input, dim, out)

    def pack(self, dim: int = -1, *, layout: PackLayout | None = None) -> tuple:
        """Every leaf in one tensor of features: ``(flat, layout)``.

        Each leaf is flattened after the batch dims, and the leaves are concatenated in
        the order of ``keys(True, True, sort=True)``, so the columns depend on the set
        of keys only; ``flat`` has shape ``(*batch_size, F)`` for ``dim=-1`` and is
        contiguous for any ``dim`` (in ``[-(batch_dims + 1), batch_dims]``, as for
        ``torch.stack``). The leaves must share one dtype and one device; non-tensor
        data cannot be packed (``filter_non_tensor_data()`` first). With ``layout``, the
        columns follow its key order, and a missing, extra or reshaped leaf raises; the
        layout returned describes this container (its class, nested levels and device).
        :meth:`PackLayout.unpack` inverts it.

        Example:
            >>> td = TensorDict(p=torch.zeros(5), v=torch.ones(5, 3),
            ...                 nested={"stress": torch.ones(5, 3, 3)}, batch_size=[5])
            >>> flat, layout = td.pack()
            >>> flat.shape, layout.keys
            (torch.Size([5, 13]), (('nested', 'stress'), 'p', 'v'))
            >>> flat2, _ = td.pack(layout=layout)
            >>> bool((flat2 == flat).all())
            True
        """
        return pack(self, dim, layout)

    @classmethod
    def maybe_dense_stack(cls, input: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
        """:meth:`stack`: tensordict falls back on a lazy stack where a dense one is not
        possible; tdfunc's stacks are always dense, so inputs of different structures or
        shapes are an error that names the first difference.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3)}, [3])
            >>> TensorDict.maybe_dense_stack([td, td]).batch_size
            torch.Size([2, 3])
        """
        return _join(torch.stack, _stack, input, dim, out)


def merge_tensordicts(*tensordicts: Any, callback_exist: Callable | dict | None = None) -> Any:
    """Merge containers into a new one of the first one's class.

    An entry present in every one of them is ``callback_exist(*values)`` (with a dict,
    the callable at that nested key, if any); otherwise the first value wins. Nested
    containers are merged key by key.

    Example:
        >>> td0 = TensorDict({"a": {"b0": 0}, "common": 0})
        >>> td1 = TensorDict({"a": {"b1": 1}, "common": 1})
        >>> td = merge_tensordicts(td0, td1, callback_exist=lambda *v: torch.stack(list(v)))
        >>> list(td.keys(True, True)), td["common"].tolist()
        ([('a', 'b0'), ('a', 'b1'), 'common'], [0, 1])
    """
    if not tensordicts:
        raise ValueError("tdfunc.merge_tensordicts: expected at least one TensorDict.")
    for position, td in enumerate(tensordicts):
        if not is_collection(td):
            raise TypeError(
                f"tdfunc.merge_tensordicts: expected TensorDicts or TensorClasses, got "
                f"{type(td).__name__} at position {position}."
            )
    if isinstance(callback_exist, Mapping):
        callback_exist = {unravel_key(key): fn for key, fn in callback_exist.items()}
    views = [td._to_tensordict_view() for td in tensordicts]
    data = _merge(views, callback_exist, len(views), ())
    return tensordicts[0]._like(data)


def _merge(views: list, callback: Any, total: int, prefix: tuple) -> dict:
    """The merged data of one level; ``total`` is the number of merged containers, so a
    callback runs only on an entry that every one of them holds."""
    keys: dict = {}
    for view in views:
        for key in view._data:
            keys.setdefault(key, None)
    data: dict = {}
    for key in keys:
        values = [view._data[key] for view in views if key in view._data]
        full = prefix + (key,)
        if len(values) > 1 and all(is_collection(v) for v in values):
            inner = [v._to_tensordict_view() for v in values]
            data[key] = rewrap(values[0], inner[0]._like(_merge(inner, callback, total, full)))
            continue
        fn = callback.get(unravel_key(full)) if isinstance(callback, dict) else callback
        if fn is None or len(values) < total:
            data[key] = values[0]
            continue
        # a callback's result is new data: validated as a write would be
        holder = next(view for view in views if key in view._data)
        data[key] = convert(holder, full, fn(*values), holder._batch_size, "merge_tensordicts")
    return data
