"""Batch dims of a container: ``batch_size``, ``shape``, ``names``, ``len``, iteration.

A mixin of :class:`~tdfunc._core.ops.TensorOps`, so ``TensorDict`` and every
``TensorClass`` share it (see :mod:`tdfunc._core.helpers.mixin` for the state it reads).

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4)}, [3], names=["batch"])
    >>> td.shape, td.names, len(td)
    (torch.Size([3]), ['batch'], 3)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData, NonTensorStack
from ..helpers.parents import check_parent_batch
from ..helpers.sizes import BatchSizeMismatchError, as_size, checked_names, leaf_shape

if TYPE_CHECKING:
    from typing_extensions import Self
from ..helpers.reshape import _check_batch


class BatchMixin(ContainerMixin):
    """The batch dims of a container (methods of ``TensorDict`` and ``TensorClass``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ shape
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value) -> None:
        self._check_mutable("batch_size")
        size = as_size(value, f"{type(self).__name__}.batch_size")
        ndim = len(size)
        for key, item in self._data.items():
            if isinstance(item, NonTensorData):
                continue
            shape = leaf_shape(item) if isinstance(item, torch.Tensor) else item.shape
            if shape[:ndim] != size:
                raise BatchSizeMismatchError(
                    f"{type(self).__name__}.batch_size: cannot set batch size {list(size)}: "
                    f"the value at "
                    f"key {key!r} has shape {list(shape)}."
                )
        for key, item in self._data.items():
            if type(item) is NonTensorData:
                self._data[key] = NonTensorData._make(item.data, size, item.device)
            elif isinstance(item, NonTensorStack) and item.batch_size[:ndim] != size:
                raise BatchSizeMismatchError(
                    f"{type(self).__name__}.batch_size: cannot set batch size {list(size)}: the "
                    f"non-tensor stack at key {key!r} has batch size {list(item.batch_size)}."
                )
        check_parent_batch(self, size, f"{type(self).__name__}.batch_size")
        old = len(self._batch_size)
        self._batch_size = size
        if ndim == old or (self._names is None and ndim < old):
            return
        # the dims that stay keep their names, new ones have none (as tensordict does);
        # a nested level shares the new dims, so it takes their names too
        kept = self._names[:ndim] if self._names is not None else (None,) * min(ndim, old)
        self.names = list(kept) + [None] * (ndim - old)

    # ------------------------------------------------------------ validators
    def _check_batch_size(self) -> None:
        """Check that every value's shape starts with the batch size, at every depth.

        Writes are checked one by one (``set``); this checks the whole container at
        once, for a container whose values could have changed shape behind its back
        (a stored tensor resized in place). A nested container's batch size must
        start with its parent's. Raises ``ValueError`` naming the first bad key.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3, 4)}, [3])
            >>> td._check_batch_size()
            >>> _ = td.get("a").resize_(2, 4)
            >>> try:
            ...     td._check_batch_size()
            ... except ValueError as error:
            ...     print(error)
            TensorDict._check_batch_size: the value at key 'a' has shape [2, 4], ...
        """
        _check_batch(self, self._batch_size, ())

    def _check_device(self) -> None:
        """Check that every tensor sits on the container's device (when it has one).

        Example:
            >>> TensorDict({"a": torch.zeros(3)}, [3], device="cpu")._check_device()
        """
        if self._device is None:
            return
        for key, leaf in self.items(include_nested=True, leaves_only=True):  # type: ignore[attr-defined]
            if isinstance(leaf, torch.Tensor) and leaf.device != self._device:
                raise RuntimeError(
                    f"{type(self).__name__}._check_device: the tensor at key {key!r} is on "
                    f"{leaf.device}, but the container's device is {self._device}."
                )

    @property
    def shape(self) -> torch.Size:
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        return len(self._batch_size)

    ndim = batch_dims

    def dim(self) -> int:
        return len(self._batch_size)

    def numel(self) -> int:
        if -1 in self._batch_size:
            raise ValueError(
                f"{type(self).__name__}.numel: the batch size {list(self._batch_size)} has a "
                f"ragged dim (-1), so it has no one number of elements; call "
                f"to_padded_tensor() first."
            )
        return self._batch_size.numel()

    def size(self, dim: int | None = None):
        return self._batch_size if dim is None else self._batch_size[dim]

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def names(self) -> list:
        """Names of the batch dims (``None`` for an unnamed dim), one per batch dim."""
        if self._names is None:
            return [None] * len(self._batch_size)
        return list(self._names)

    @names.setter
    def names(self, value) -> None:
        """Name the batch dims; nested containers take the names of the dims they share.

        A nested container's leading dims are its parent's, so they carry the same
        names (its own further dims keep theirs), as in tensordict.
        """
        self._check_mutable("names")
        self._set_names(value, f"{type(self).__name__}.names")

    def _set_names(self, value, api: str) -> None:
        """The names setter without the mutability check, for a copy just made (rename)."""
        names = checked_names(value, self._batch_size, api)
        plan = [(self, names)]
        swaps: list = []
        _plan_shared_names(self, names, plan, api, swaps)  # every level checked first
        for parent, key, copy in swaps:
            parent._data[key] = copy
        for node, new in plan:
            node._names = new

    def refine_names(self, *names) -> Self:
        """Name the batch dims in place, as ``Tensor.refine_names``; returns self.

        One ``...`` stands for the dims not listed, which keep their names. A dim
        that has a name keeps it (naming it differently is an error).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3, 4])
            >>> td.refine_names(..., "c").names
            [None, None, 'c']
        """
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = tuple(names[0])
        ndim = len(self._batch_size)
        current = list(self._names) if self._names is not None else [None] * ndim
        if names.count(...) > 1:
            raise ValueError(f"{type(self).__name__}.refine_names: at most one '...', got {names}.")
        if ... in names:
            at = names.index(...)
            fill = ndim - (len(names) - 1)
            if fill < 0:
                raise ValueError(
                    f"{type(self).__name__}.refine_names: {len(names) - 1} names for "
                    f"{ndim} batch dims."
                )
            names = names[:at] + tuple(current[at : at + fill]) + names[at + 1 :]
        if len(names) != ndim:
            raise ValueError(
                f"{type(self).__name__}.refine_names: expected {ndim} names (one per batch "
                f"dim), got {len(names)}."
            )
        for dim, (old, new) in enumerate(zip(current, names)):
            if old is not None and new != old:
                raise RuntimeError(
                    f"{type(self).__name__}.refine_names: cannot rename batch dim {dim} from "
                    f"{old!r} to {new!r} (refine_names only names unnamed dims)."
                )
        self.names = list(names)
        return self

    def rename(self, *names, **rename_map) -> Self:
        """A container with renamed batch dims, sharing the tensors, as ``Tensor.rename``.

        Give every name (one ``...`` keeps the names of the dims not listed, ``None``
        alone removes all names), or map old names to new ones by keyword.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["x", "y"])
            >>> td.rename(y="z").names, td.rename("p", ...).names, td.names
            (['x', 'z'], ['p', 'y'], ['x', 'y'])
        """
        out = self._shallow_copy()  # new containers at every level, same tensors
        # the copy is new: named also when it is a frozen TensorClass
        out._set_names(
            self._new_names(names, rename_map, "rename"), f"{type(self).__name__}.rename"
        )
        return out

    def rename_(self, *names, **rename_map) -> Self:
        """Rename the batch dims in place (see :meth:`rename`); returns self.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["x", "y"])
            >>> td.rename_(x="b").names
            ['b', 'y']
        """
        self.names = self._new_names(names, rename_map, "rename_")
        return self

    def _new_names(self, names: tuple, rename_map: dict, api: str) -> list:
        api = f"{type(self).__name__}.{api}"
        current = self.names
        if names and rename_map:
            raise ValueError(
                f"{api}: give the names positionally or as old=new keywords, not both; "
                f"got {names} and {rename_map}."
            )
        if rename_map:
            unknown = [old for old in rename_map if old not in current]
            if unknown:
                raise ValueError(
                    f"{api}: no batch dim is named {unknown}; the names are {current}."
                )
            return [rename_map.get(name, name) if name is not None else None for name in current]
        if len(names) == 1 and isinstance(names[0], (list, tuple)):
            names = tuple(names[0])
        if names == () and current:
            # an empty list of names for named or unnamed dims is a wrong count, not "remove"
            raise ValueError(
                f"{api}: expected {len(current)} names (one per batch dim), None to remove "
                f"them all, or old=new keywords; got none."
            )
        if names in ((), (None,)):
            return [None] * len(current)
        if names.count(...) > 1:
            raise ValueError(f"{api}: at most one '...', got {names}.")
        if ... in names:
            at = names.index(...)
            fill = len(current) - (len(names) - 1)
            if fill < 0:
                raise ValueError(f"{api}: {len(names) - 1} names for {len(current)} batch dims.")
            names = names[:at] + tuple(current[at : at + fill]) + names[at + 1 :]
        return list(names)  # the names setter checks the count and duplicates

    def __len__(self) -> int:
        return self._batch_size[0] if self._batch_size else 0

    def __iter__(self) -> Iterator[Self]:
        if not self._batch_size:
            name = type(self).__name__
            raise TypeError(
                f"{name}: iteration over a {name} with batch_size=[] is not "
                "possible; iterate over td.keys() or td.items() instead."
            )
        return iter(self.unbind(0))  # type: ignore[attr-defined]

    def __bool__(self) -> bool:
        name = type(self).__name__
        raise RuntimeError(
            f"{name}: the truth value of a {name} is ambiguous (Converting a tensordict to "
            f"boolean value is not permitted); use .all() or .any()."
        )


def _plan_shared_names(node, names: tuple | None, plan: list, api: str, swaps: list) -> None:
    """Append ``(nested container, its new names)`` for every level below ``node``.

    A frozen TensorClass below is never renamed in place (it refuses every change,
    and its owner may hold it elsewhere): ``swaps`` gets ``(parent, key, renamed
    copy)``, which takes its place in the parent.
    """
    shared = list(names) if names is not None else [None] * len(node._batch_size)
    for key, value in node._data.items():
        if isinstance(value, NonTensorData):
            _plan_leaf_names(node, key, value, shared, api, swaps)
            continue
        if not isinstance(value, ContainerMixin):
            continue
        inner = value._to_tensordict_view()
        own = inner.names[len(shared) :]
        if inner._names is None and names is None:
            continue  # nothing named above or here: nothing to share
        new = checked_names(shared + own, inner._batch_size, api)
        if getattr(type(value), "_tc_frozen", False) and list(new) != inner.names:
            value = value._shallow_copy()  # new containers at every level, same tensors
            swaps.append((node, key, value))
            inner = value._to_tensordict_view()
        plan.append((inner, new))
        _plan_shared_names(inner, new, plan, api, swaps)


def _plan_leaf_names(node, key, leaf: NonTensorData, shared: list, api: str, swaps: list) -> None:
    """A non-tensor leaf carries its container's names on the dims they share (it reads
    as a collection to code that walks levels, as in tensordict). Leaves are shared
    between containers and never changed in place: a renamed copy takes its place."""
    if getattr(leaf, "_names", None) is None and not any(n is not None for n in shared):
        return
    new = checked_names(shared + leaf.names[len(shared) :], leaf.batch_size, api)
    if new is not None and list(new) == leaf.names:
        return
    renamed = leaf.clone()
    renamed.__dict__.update(leaf.__dict__)  # lock, memory-mapped binding, sharing marks
    renamed._names = new
    swaps.append((node, key, renamed))
