"""``apply`` and the leaf-wise methods built on it (clone, detach, zero_, fill_, ...)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..helpers.fastpath import is_tensor_kind
from ..helpers.frozen import refuse_frozen_inside
from ..helpers.leaf_errors import each_leaf, note_key
from ..helpers.mixin import ContainerMixin
from ..helpers.mixin import is_tensor_collection as _collection
from ..helpers.nested_keys import MISSING
from ..helpers.nontensor import NonTensorData
from ..helpers.rewrap import drop_device, rewrap
from ..helpers.sizes import leaf_shape
from ..helpers.writes import convert, inplace_source

_KEEP = object()
_Tensor = torch.Tensor

if TYPE_CHECKING:
    from typing_extensions import Self


def _is_any_value(cls: type) -> bool:
    return True


def _others_at(others: tuple, key: str, api: str, default: Any = MISSING) -> list:
    values = []
    for position, other in enumerate(others):
        data = None if other is None else other._data
        if data is None or key not in data:
            if default is not MISSING:
                values.append(default)
                continue
            raise KeyError(
                f"TensorDict.{api}: key {key!r} is missing from the TensorDict passed at "
                f"position {position + 1}; all TensorDicts must have the same keys."
            )
        values.append(data[key])
    return values


def _container_views(others: tuple, api: str) -> tuple:
    """The TensorDict views of the extra containers given to ``apply`` and its kin."""
    views = []
    for position, other in enumerate(others):
        if not _collection(other):
            raise TypeError(
                f"TensorDict.{api}: the argument at position {position + 1} after the function "
                f"is a {type(other).__name__}; extra arguments must be TensorDicts or "
                f"TensorClasses with the same keys. Hint: wrap a dict with TensorDict(d, "
                f"batch_size)."
            )
        views.append(other._to_tensordict_view())
    return tuple(views)


def _views(values: Sequence, key: str, api: str, default: Any = MISSING) -> tuple:
    views = []
    for position, value in enumerate(values):
        if default is not MISSING and value is default and not _collection(value):
            views.append(None)  # missing from that container: its leaves take the default
            continue
        if not _collection(value):
            raise TypeError(
                f"TensorDict.{api}: key {key!r} holds a TensorDict, but the container passed at "
                f"position {position + 1} holds a {type(value).__name__} there."
            )
        views.append(value._to_tensordict_view())
    return tuple(views)


def _non_tensor_result(value: NonTensorData, new_size, ndim: int, key: str) -> NonTensorData:
    if new_size is None:
        return value.clone()
    if type(value) is NonTensorData:
        return NonTensorData._make(value.data, new_size + value.batch_size[ndim:], value.device)
    if value.batch_size[: len(new_size)] == new_size:
        return value.clone()
    raise ValueError(
        f"TensorDict.apply: cannot give the non-tensor stack at key {key!r} (batch size "
        f"{list(value.batch_size)}) the new batch size {list(new_size)}."
    )


def map_tensors(node: Any, fn: Callable, check: bool, filter_empty: bool) -> Any:
    """``fn`` applied to every tensor leaf of ``node``, the batch size kept.

    The twin of ``node._apply_tree(fn, (), None, None, filter_empty, check=check)``
    for the common call (no other containers, no keys passed, no ``is_leaf``, no new
    batch size), without the branches those need: the same results, errors and
    notes naming the key. ``check`` validates what ``fn`` returns (a user function).
    """
    size = node._batch_size
    count = len(size)
    data = {}
    key = None
    try:
        for key, value in node._data.items():
            kind = type(value)
            if kind is _Tensor or is_tensor_kind[kind]:
                result = fn(value)
                if result is None:
                    continue
                if check and (not isinstance(result, _Tensor) or (count and _off(result, size))):
                    raise _result_error(result, key, size)
            elif getattr(kind, "_is_tensor_collection", False):
                view = value._to_tensordict_view()
                sub = map_tensors(view, fn, check, filter_empty)
                if filter_empty and not sub._data and view._data:
                    continue
                result = rewrap(value, sub)
            elif isinstance(value, NonTensorData):
                result = value.clone()  # (_non_tensor_result with the batch size kept)
            else:
                result = value
            data[key] = result
    except Exception as error:
        note_key(error, key)
        raise
    return node._like(data, None, node._names)


def _off(result: torch.Tensor, size: torch.Size) -> bool:
    """``leaf_shape(result)[:len(size)] != size``, dim by dim for one or two batch dims
    (slicing a Size builds a Size, the costliest step of the test)."""
    shape = leaf_shape(result) if result.is_nested else result.shape
    count = len(size)
    if count > 2:
        return shape[:count] != size
    if len(shape) < count or shape[0] != size[0]:
        return True
    return count == 2 and shape[1] != size[1]


def _canonical(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` with row-major strides (a copy only when its strides are not)."""
    expected = torch.empty(tensor.shape, device="meta").stride()
    if tensor.stride() == expected:
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


class ApplyMixin(ContainerMixin):
    """Leaf-wise transformation of a container (methods of ``TensorDict``)."""

    __slots__ = ()

    def apply(
        self,
        fn: Callable,
        *others,
        batch_size=None,
        device: Any = _KEEP,
        names: Any = _KEEP,
        inplace: bool = False,
        default: Any = MISSING,
        filter_empty: bool | None = None,
        propagate_lock: bool = False,
        call_on_nested: bool = False,
        out: Any = None,
        is_leaf: Callable | None = None,
    ) -> Self:
        """A new container with ``fn`` applied to every tensor leaf.

        ``fn`` receives the leaf of ``self`` and the matching leaves of ``others``
        (containers with the same keys; with ``default=`` a key missing from one of
        them passes ``default`` instead of raising ``KeyError``). A leaf for which
        ``fn`` returns ``None`` is dropped (and a nested container left empty by
        that, too, unless ``filter_empty=False``); with ``filter_empty=True`` a
        result left with no entry at all is ``None``. Pass ``batch_size`` when
        ``fn`` changes the batch dims. Non-tensor leaves are carried over.
        ``is_leaf`` (a function of a value's class) makes other values leaves
        too: ``fn`` gets them whole. ``call_on_nested=True`` calls ``fn`` on the
        first-level nested containers too (``fn`` recurses itself). ``out`` is a
        container the results are written into (and returned); ``inplace=True``
        writes them into ``self``. ``propagate_lock`` locks the result when
        ``self`` is locked; ``device`` sets the result's device.

        Example:
            >>> td = TensorDict({"a": torch.ones(2), "b": torch.zeros(2, dtype=torch.long)}, [2])
            >>> sorted(td.apply(lambda x: x if x.is_floating_point() else None).keys())
            ['a']
            >>> other = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.apply(lambda x, y: x if y is None else x + y, other, default=None)["a"]
            tensor([2., 2.])
        """
        if call_on_nested:
            is_leaf = _is_any_value
        if inplace:
            return self.apply_(fn, *others, default=default, is_leaf=is_leaf)
        if others or is_leaf is not None or batch_size is not None:
            new_size = None if batch_size is None else torch.Size(batch_size)
            views = _container_views(others, "apply")
            out_tree = self._apply_tree(
                fn,
                views,
                new_size,
                None,
                filter_empty is not False,
                is_leaf=is_leaf,
                default=default,
            )
        else:  # one function of one leaf, the batch kept: the lean twin of _apply_tree
            out_tree = map_tensors(self, fn, True, filter_empty is not False)
        if filter_empty and not out_tree._data and self._data:
            return None  # type: ignore[return-value]
        if names is not _KEEP:
            out_tree.names = names
        if device is not _KEEP:
            out_tree = out_tree.to(device) if device is not None else drop_device(out_tree)
        if out is not None:
            out.update(out_tree)  # entries replaced (a new dtype or shape is kept), as tensordict
            return out
        if propagate_lock and self._is_locked:
            out_tree.lock_()
        return out_tree

    def named_apply(
        self,
        fn: Callable,
        *others,
        nested_keys: bool = False,
        batch_size=None,
        inplace: bool = False,
        default: Any = MISSING,
        filter_empty: bool | None = None,
    ) -> Self:
        """Like :meth:`apply`, with the key passed first: ``fn(key, leaf, *other_leaves)``.

        The key is the leaf's own key, or its full tuple path with ``nested_keys=True``.
        ``inplace=True`` writes the results into ``self`` and returns it.

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(())}})
            >>> out = td.named_apply(lambda k, x: x + len(k), nested_keys=True)
            >>> out["b", "c"].item()
            2.0
        """
        new_size = None if batch_size is None else torch.Size(batch_size)
        views = _container_views(others, "named_apply")
        if inplace:
            self._check_mutable("named_apply")
            refuse_frozen_inside(self, "named_apply")
            self._apply_inplace(fn, views, default, None, (), not nested_keys)
            return self
        result = self._apply_tree(
            fn,
            views,
            new_size,
            (),
            filter_empty is not False,
            local_keys=not nested_keys,
            default=default,
        )
        if filter_empty and not result._data and self._data:
            return None  # type: ignore[return-value]
        return result

    def _apply_tree(
        self,
        fn: Callable,
        others: tuple = (),
        new_size: torch.Size | None = None,
        prefix: tuple | None = None,
        filter_empty: bool = True,
        *,
        local_keys: bool = False,
        check: bool = True,
        is_leaf: Callable | None = None,
        default: Any = MISSING,
    ):
        """The engine of ``apply``.

        ``others`` are TensorDict views with the same keys (``default`` stands in for
        a missing one when given). With ``prefix`` (a tuple) ``fn`` gets the key
        first: the full path ``prefix + (key,)``, or the leaf's own key with
        ``local_keys``. ``check`` validates results (user functions).
        """
        ndim = len(self._batch_size)
        expected = self._batch_size if new_size is None else new_size
        count = len(expected)
        data = {}
        whole = []  # keys of values given whole (is_leaf): validated once the result exists
        key = None
        try:
            for key, value in self._data.items():
                other_values = _others_at(others, key, "apply", default) if others else ()
                if is_leaf is not None and not isinstance(value, _Tensor) and is_leaf(type(value)):
                    if prefix is not None:
                        name = key if local_keys else prefix + (key,)
                        result = fn(name, value, *other_values)
                    else:
                        # a leaf by the caller's rule: given whole
                        result = fn(value, *other_values)
                    if result is not None:
                        data[key] = result
                        whole.append(key)
                    continue
                if isinstance(value, _Tensor):
                    if prefix is not None:
                        name = key if local_keys else prefix + (key,)
                        result = fn(name, value, *other_values)
                    elif others:
                        result = fn(value, *other_values)
                    else:
                        result = fn(value)
                    if result is None:
                        continue
                    if check and (
                        not isinstance(result, _Tensor)
                        or (count and leaf_shape(result)[:count] != expected)
                    ):
                        shown = key if prefix is None or local_keys else prefix + (key,)
                        raise _result_error(result, shown, expected)
                elif _collection(value):
                    view = value._to_tensordict_view()
                    inner_size = None if new_size is None else new_size + view._batch_size[ndim:]
                    sub = view._apply_tree(
                        fn,
                        _views(other_values, key, "apply", default) if others else (),
                        inner_size,
                        None if prefix is None else prefix + (key,),
                        filter_empty,
                        local_keys=local_keys,
                        check=check,
                        is_leaf=is_leaf,
                        default=default,
                    )
                    if filter_empty and not sub._data and view._data:
                        continue
                    result = rewrap(value, sub)
                elif isinstance(value, NonTensorData):
                    result = _non_tensor_result(value, new_size, ndim, key)
                else:
                    result = value
                data[key] = result
        except Exception as error:
            note_key(error, key)
            raise
        out = self._like(data, new_size, self._names if new_size is None else None)
        if whole:
            # what fn returned for a whole value is checked and stored as set() would:
            # a tensor must start with the batch size, a Python value becomes a leaf
            stored = out._data
            for key in whole:
                stored[key] = convert(out, key, stored[key], expected, "apply")
        return out

    def apply_(
        self, fn: Callable, *others, default: Any = MISSING, is_leaf: Callable | None = None
    ) -> Self:
        """Apply ``fn`` to every tensor leaf and write the result into it (in place).

        A tensor result is copied into the leaf (cast to the leaf's dtype; a shape
        that does not fit is an error, as for ``set_``); a result of another kind
        replaces the entry. ``default`` stands in for keys missing from ``others``.

        Example:
            >>> td = TensorDict({"a": torch.ones(2)}, [2])
            >>> td.apply_(lambda x: x * 3)["a"].tolist()
            [3.0, 3.0]
        """
        self._check_mutable("apply_")
        refuse_frozen_inside(self, "apply_")
        views = _container_views(others, "apply_")
        self._apply_inplace(fn, views, default, is_leaf)
        return self

    def _apply_inplace(
        self,
        fn: Callable,
        others: tuple,
        default: Any = MISSING,
        is_leaf: Callable | None = None,
        prefix: tuple | None = None,
        local_keys: bool = False,
    ) -> None:
        data = self._data
        key = None
        try:
            for key, value in list(data.items()):
                other_values = _others_at(others, key, "apply_", default) if others else ()
                leaf = isinstance(value, _Tensor) or (
                    is_leaf is not None and not _collection(value) and is_leaf(type(value))
                )
                if leaf:
                    if prefix is not None:
                        name = key if local_keys else prefix + (key,)
                        result = fn(name, value, *other_values)
                    else:
                        result = fn(value, *other_values)
                    if result is None or result is value:
                        continue
                    if isinstance(value, _Tensor) and isinstance(result, _Tensor):
                        # validated as set() validates: a result that does not fit is an error
                        value.copy_(inplace_source(value, result, key, "apply_", self._batch_size))
                    else:
                        self._write(((key, result),), False, False, "apply_")  # type: ignore[attr-defined]
                elif _collection(value):
                    view = value._to_tensordict_view()
                    view._apply_inplace(
                        fn,
                        _views(other_values, key, "apply_", default) if others else (),
                        default,
                        is_leaf,
                        None if prefix is None else prefix + (key,),
                        local_keys,
                    )
        except Exception as error:
            note_key(error, key)
            raise

    # -------------------------------------------------------------- leaf-wise
    def clone(self, recurse: bool = True) -> Self:
        """A copy; with ``recurse=False`` the copy shares the tensors.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> td.clone()["a"] is td["a"]
            False
        """
        if not recurse:
            return self._shallow_copy()
        return map_tensors(self, _Tensor.clone, False, False)

    def detach(self) -> Self:
        """A copy whose tensors are detached from the autograd graph (sharing storage)."""
        return map_tensors(self, _Tensor.detach, False, False)

    def detach_(self) -> Self:
        """Detach every tensor leaf in place; returns self."""
        self._check_mutable("detach_")
        refuse_frozen_inside(self, "detach_")
        each_leaf(self, _Tensor.detach_)
        return self

    def contiguous(self, *, canonical: bool = False, inplace: bool = False) -> Self:
        """A copy whose tensors are contiguous (``inplace=True``: replace this one's leaves).

        With ``canonical=True`` a leaf whose strides are not row-major is copied
        even when ``Tensor.is_contiguous`` says it is (size-1 dims).
        """
        fn = _canonical if canonical else _Tensor.contiguous
        if inplace:
            self._check_writable("contiguous", list(self._data))
            self._replace_leaves(fn)
            return self
        return self._apply_tree(fn, (), None, None, False, check=False)

    def _replace_leaves(self, fn: Callable) -> None:
        """Replace every tensor leaf by ``fn(leaf)`` in this container (keys kept)."""
        data = self._data
        key = None
        try:
            for key, value in data.items():
                if isinstance(value, _Tensor):
                    data[key] = fn(value)
                elif _collection(value):
                    value._to_tensordict_view()._replace_leaves(fn)
        except Exception as error:
            note_key(error, key)
            raise

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Set ``requires_grad`` on every tensor leaf; returns self."""
        self._check_mutable("requires_grad_")
        each_leaf(self, lambda value: value.requires_grad_(requires_grad))
        return self

    def zero_(self) -> Self:
        """Fill every tensor leaf with zeros (in place); returns self."""
        self._check_mutable("zero_")
        refuse_frozen_inside(self, "zero_")
        each_leaf(self, _Tensor.zero_)
        return self

    def fill_(self, key, value) -> Self:
        """Fill the entry at ``key`` with ``value`` in place (every leaf below it for a
        nested TensorDict); returns self."""
        self._check_mutable("fill_")
        refuse_frozen_inside(self, "fill_")
        entry = self._get_leaf(key, "fill_")
        if _collection(entry):
            try:
                each_leaf(entry._to_tensordict_view(), lambda leaf: leaf.fill_(value))
            except Exception as error:
                note_key(error, key)
                raise
        elif isinstance(entry, _Tensor):
            try:
                entry.fill_(value)
            except Exception as error:
                note_key(error, key)
                raise
        else:
            raise TypeError(
                f"{type(self).__name__}.fill_: the entry at key {key!r} is not a tensor."
            )
        return self


def _result_error(result: Any, key, expected: torch.Size) -> Exception:
    if not isinstance(result, _Tensor):
        return TypeError(
            f"TensorDict.apply: the function returned a {type(result).__name__} for key "
            f"{key!r}; it must return a tensor (or None to drop the key)."
        )
    return ValueError(
        f"TensorDict.apply: the function returned a tensor of shape {list(result.shape)} for "
        f"key {key!r}, which does not start with the batch size {list(expected)}. Pass "
        f"batch_size=... to apply when the function changes the batch dims."
    )
