"""Indexing and shape operations over the batch dims, applied to every value.

Values are tensors, nested containers and non-tensor leaves; each is
"tensor-like" in its leading (batch) dims, so every operation here maps the
same call over the values and computes the new batch size once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from ..apply import rewrap
from ..context import check_parent_batch
from ..context import write_back as _write_back
from ..frozen import FROZEN, refuse_frozen_inside
from ..keys.fastpath import is_tensor_kind, node_kind
from ..keys.nested import unravel_key
from ..keys.writes import check_copy_target, writable_view
from ..mixin import ContainerMixin
from ..mixin import is_tensor_collection as _collection
from ..nontensor import NonTensorData, write_at
from .indexing import Take, plan, prepare
from .pieces import split_leaf, take_contents
from .ragged import resolve_ragged
from .sizes import (
    BatchSizeMismatchError,
    DimOutOfRangeError,
    _simple_index_size,
    expand_ellipsis,
    index_batch_size,
    normalize_dim,
    refuse_ragged_dim,
    resolve_shape,
)

if TYPE_CHECKING:
    from typing_extensions import Self


def _become(self: Any, out: Any, api: str) -> Any:
    """``inplace=True``: ``self`` takes the leaves and batch size of ``out``."""
    self._check_writable(api, list(self._data))
    check_parent_batch(self, out._batch_size, f"TensorDict.{api}")
    take_contents(self, out)
    return self


def _shape_arg(shape: tuple, size: Any, api: str) -> tuple:
    if size is not None:
        if shape:
            raise TypeError(f"TensorDict.{api}: pass the shape positionally or as size=, not both.")
        return (size,)
    return shape


def _dims_arg(dims: tuple) -> tuple:
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        return tuple(dims[0])
    return dims


class ShapeOpsMixin(ContainerMixin):
    """Tensor-like indexing and reshaping of a container (methods of ``TensorDict``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ indexing
    def _leaf_index(self, index):
        """(index to apply to each value, new batch size or None for advanced indexing)."""
        size = self._batch_size
        kind = type(index)
        if kind is int:
            if not size:
                raise IndexError("TensorDict: cannot index a TensorDict with batch_size=[].")
            if not -size[0] <= index < size[0]:
                raise IndexError(
                    f"TensorDict: index {index} is out of range for batch dim 0 of size {size[0]}."
                )
            return index, size[1:]
        if kind is slice:
            if not size:
                raise IndexError("TensorDict: cannot slice a TensorDict with batch_size=[].")
            return index, _simple_index_size(size, (index,))
        if kind is list and any(isinstance(item, str) for item in index):
            raise TypeError(
                f"TensorDict: indexing with a list of keys ({index!r}) is not supported: a list "
                f"indexes the batch dims, as for a tensor. Hint: td.select(*keys) gives the "
                f"sub-TensorDict of those keys; [td[key] for key in keys] gives their values."
            )
        if kind is not tuple:
            index = (index,)
        elif str in map(type, index):
            unravel_key(index, "TensorDict.__getitem__")  # raises the TypeError for the bad part
        index = expand_ellipsis(index, len(size))
        return index, _simple_index_size(size, index)

    def _index(self, index):
        leaf_index, new_size = self._leaf_index(index)
        if new_size is not None:
            return self._index_trusted(leaf_index, new_size)
        # tensors, masks, lists: prepared once (one nonzero per mask), then used for each leaf
        leaf_index, new_size, take = plan(self, leaf_index)
        return self._index_trusted(leaf_index, new_size, take)

    def _index_trusted(self, leaf_index, new_size: torch.Size, take: Take | None = None):
        """Index every value with a validated ``leaf_index``; ``new_size`` is the result's.

        ``take`` (advanced indexing, see ``indexing.plan``) indexes the tensor leaves.
        """
        ndim = len(self._batch_size)
        data = {}
        for key, value in self._data.items():
            kind = type(value)
            if kind is torch.Tensor or is_tensor_kind[kind]:
                data[key] = value[leaf_index] if take is None else take.take(value, leaf_index)
            elif kind is NonTensorData and len(value.batch_size) == ndim:
                # before the class lookup: a compiled function that indexes a batch
                # with a non-tensor field then reads no cache that eager code may grow
                data[key] = NonTensorData._make(value.data, new_size, value.device)
            elif node_kind[kind] == 1:  # a nested TensorDict
                inner = value._batch_size
                inner_size = new_size if len(inner) == ndim else new_size + inner[ndim:]
                data[key] = value._index_trusted(leaf_index, inner_size, take)
            else:
                data[key] = value[leaf_index]
        names = self._names
        if names is not None:
            names = _index_names(names, leaf_index, len(new_size))
        if -1 in new_size:  # ragged: the indexed leaves may be dense now
            new_size = resolve_ragged(new_size, data)
        return self._like(data, new_size, names)

    def _set_at_index(self, index, value: Any) -> None:
        """``td[index] = value``: validate every write first, then perform them."""
        self._check_mutable("__setitem__")
        leaf_index, target = self._leaf_index(index)
        if target is None:  # masks become nonzero() indices once, not once per leaf
            leaf_index = prepare(leaf_index, self._batch_size)[0]
            target = index_batch_size(self._batch_size, leaf_index)
        if self._is_locked == FROZEN:  # frozen levels below refuse in writable_view, planning
            refuse_frozen_inside(self, "__setitem__")
        fields = getattr(type(self), "_tc_field_names", None)
        if (
            fields is not None
            and type(value) is not type(self)
            and (_collection(value) or isinstance(value, Mapping))
        ):
            _check_compatible_class(self, value, fields)
        plan: list = []
        self._plan_index_write(leaf_index, target, value, plan, ())
        for operation, *args in plan:  # nothing is written unless every write can be
            if operation is _assign:
                check_copy_target(args[0], args[2], "<index>", "__setitem__")
        for operation, *args in plan:
            operation(*args)

    def _plan_index_write(
        self, leaf_index, target, value, plan: list, prefix: tuple, missing: int | None = None
    ) -> None:
        """Validate ``self[leaf_index] = value`` and append the writes to ``plan``.

        ``target`` is the batch size the index selects in ``self``. ``missing`` is how
        many leading batch dims the written container lacks compared with the top-level
        target (it broadcasts over them); None at the top level.
        """
        ndim = len(self._batch_size)
        if isinstance(value, Mapping) and not _collection(value):
            value = self._plain_tensordict()(value, batch_size=target, device=self._device)
        if not _collection(value):
            # one value broadcast into every tensor leaf
            if not isinstance(value, torch.Tensor):
                try:
                    value = torch.as_tensor(value)
                except (TypeError, ValueError, RuntimeError):
                    raise TypeError(
                        f"TensorDict.__setitem__: cannot write a {type(value).__name__} at an "
                        f"index; expected a TensorDict, a mapping, a tensor or a number."
                    ) from None
            for key, item in self._data.items():
                if isinstance(item, torch.Tensor):
                    _check_fits(value.shape, target + item.shape[ndim:], prefix + (key,))
                    plan.append((_assign, item, leaf_index, value))
                elif _collection(item):
                    item = writable_view(item, "__setitem__", prefix + (key,))
                    inner = target + item._batch_size[ndim:]
                    item._plan_index_write(leaf_index, inner, value, plan, prefix + (key,), 0)
            return
        source = value._to_tensordict_view()
        if missing is None:
            source_size = source._batch_size
            if not _broadcastable(source_size, target):
                raise BatchSizeMismatchError(
                    f"TensorDict.__setitem__: batch dimension mismatch: cannot write a "
                    f"{type(value).__name__} with batch size {list(source_size)} at an index "
                    f"that selects a batch of size {list(target)}."
                )
            missing = len(target) - len(source_size)
        skip = len(target) - missing  # leading dims of a written leaf that are batch dims
        for key, sub in source._data.items():
            existing = self._data.get(key)
            full = prefix + (key,)
            if existing is None:
                self._check_writable("__setitem__", full[0] if len(full) == 1 else full)
                plan.append((_preallocate, self, key, sub, skip, leaf_index))
            elif isinstance(existing, torch.Tensor):
                if not isinstance(sub, torch.Tensor):
                    raise TypeError(
                        f"TensorDict.__setitem__: cannot write a {type(sub).__name__} into the "
                        f"tensor at key {full!r}."
                    )
                _check_fits(sub.shape, target + existing.shape[ndim:], full)
                plan.append((_assign, existing, leaf_index, sub))
            elif _collection(existing):
                existing = writable_view(existing, "__setitem__", full)
                inner = target + existing._batch_size[ndim:]
                existing._plan_index_write(leaf_index, inner, sub, plan, full, missing)
            else:
                plan.append((_write_non_tensor, self._data, key, leaf_index, sub))

    # ------------------------------------------------------------------ reshaping
    def _map(self, fn, new_size: torch.Size, names=None):
        return self._like({k: fn(v) for k, v in self._data.items()}, new_size, names)

    def reshape(self, *shape, size=None, inplace: bool = False) -> Self:
        """Reshape the batch dims (feature dims are kept).

        ``inplace=True`` reshapes this container itself; in a ``with`` block,
        the entries are reshaped back into this container on exit.

        Example:
            >>> TensorDict({"a": torch.zeros(3, 4, 5)}, [3, 4]).reshape(-1)["a"].shape
            torch.Size([12, 5])
        """
        shape = _shape_arg(shape, size, "reshape")
        new_size = resolve_shape(self._batch_size, shape, f"{type(self).__name__}.reshape")
        ndim = len(self._batch_size)
        out = self._map(lambda v: v.reshape(new_size + v.shape[ndim:]), new_size)
        if inplace:
            return _become(self, out, "reshape")
        return write_back(out, self)

    def view(self, *shape, size=None, batch_size=None) -> Self:
        """Like :meth:`reshape`, but never copies; ``view(dtype)`` views every tensor as ``dtype``.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2, 2)}, [2])
            >>> td.view(torch.int32)["a"].dtype, td.view(size=(2, 1)).batch_size
            (torch.int32, torch.Size([2, 1]))
        """
        if len(shape) == 1 and isinstance(shape[0], torch.dtype):
            dtype = shape[0]
            new_size = self._batch_size if batch_size is None else torch.Size(batch_size)
            return self._apply_tree(lambda t: t.view(dtype), (), new_size, None, False, check=False)
        shape = _shape_arg(shape, size, "view")
        new_size = resolve_shape(self._batch_size, shape, f"{type(self).__name__}.view")
        ndim = len(self._batch_size)
        out = self._map(lambda v: v.view(new_size + v.shape[ndim:]), new_size)
        return write_back(out, self)

    def flatten(self, start_dim: int = 0, end_dim: int = -1, *, inplace: bool = False) -> Self:
        """Merge batch dims ``start_dim..end_dim`` into one (no batch dims: one dim of size 1)."""
        if inplace:
            return _become(self, self.flatten(start_dim, end_dim), "flatten")
        ndim = len(self._batch_size)
        if ndim == 0:
            return write_back(self._map(lambda v: v.unsqueeze(0), torch.Size([1])), self)
        start = normalize_dim(start_dim, ndim, f"{type(self).__name__}.flatten")
        end = normalize_dim(end_dim, ndim, f"{type(self).__name__}.flatten")
        if start > end:
            raise ValueError(f"{type(self).__name__}.flatten: start_dim cannot come after end_dim.")
        size = self._batch_size
        merged = 1
        for s in size[start : end + 1]:
            merged *= s
        new_size = size[:start] + torch.Size([merged]) + size[end + 1 :]
        out = self._map(lambda v: v.flatten(start, end), new_size)
        return write_back(out, self)

    def unflatten(
        self, dim: int, sizes=None, *, unflattened_size=None, inplace: bool = False
    ) -> Self:
        """Split batch dim ``dim`` into ``sizes`` (also ``unflattened_size=``, torch's keyword).

        Example:
            >>> td = TensorDict({"a": torch.zeros(6, 2)}, [6])
            >>> td.unflatten(0, unflattened_size=(2, 3)).batch_size
            torch.Size([2, 3])
        """
        if unflattened_size is not None:
            if sizes is not None:
                raise TypeError(
                    f"{type(self).__name__}.unflatten: pass the sizes positionally or as "
                    "unflattened_size=, not both."
                )
            sizes = unflattened_size
        if sizes is None:
            raise TypeError(f"{type(self).__name__}.unflatten: missing the sizes to split into.")
        if inplace:
            return _become(self, self.unflatten(dim, sizes), "unflatten")
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, f"{type(self).__name__}.unflatten")
        inner = resolve_shape(self._batch_size[dim : dim + 1], tuple(sizes))
        new_size = self._batch_size[:dim] + inner + self._batch_size[dim + 1 :]
        out = self._map(lambda v: v.unflatten(dim, inner), new_size)
        return write_back(out, self)

    def squeeze(self, dim: int | None = None) -> Self:
        """Remove batch dims of size 1 (all of them, or ``dim`` only)."""
        size = self._batch_size
        if dim is None:
            dims = [d for d, s in enumerate(size) if s == 1]
        else:
            dim = normalize_dim(dim, len(size), f"{type(self).__name__}.squeeze")
            dims = [dim] if size[dim] == 1 else []
        if not dims:
            return self._like(dict(self._data))
        new_size = torch.Size([s for d, s in enumerate(size) if d not in dims])
        names = self._names and _clean(tuple(n for d, n in enumerate(self._names) if d not in dims))

        def squeeze(value):
            for d in reversed(dims):
                value = value.squeeze(d)
            return value

        return write_back(self._map(squeeze, new_size, names), self)

    def unsqueeze(self, dim: int) -> Self:
        """Insert a batch dim of size 1 at ``dim``."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim + 1, f"{type(self).__name__}.unsqueeze")
        size = list(self._batch_size)
        size.insert(dim, 1)
        names = None
        if self._names is not None:
            names = self._names[:dim] + (None,) + self._names[dim:]
        out = self._map(lambda v: v.unsqueeze(dim), torch.Size(size), names)
        return write_back(out, self, lambda unsqueezed: unsqueezed.squeeze(dim))

    def permute(self, *args, dims=None) -> Self:
        """Reorder the batch dims: ``permute(1, 0)``, ``([1, 0])`` or ``(dims=[1, 0])``."""
        if dims is not None and args:
            raise TypeError(
                f"{type(self).__name__}.permute: give the dims positionally or as dims=, "
                f"not both; got {args} and dims={dims}."
            )
        dims = _dims_arg(args) if dims is None else tuple(dims)
        ndim = len(self._batch_size)
        if len(dims) != ndim:
            raise ValueError(
                f"{type(self).__name__}.permute: expected {ndim} dims for batch size "
                f"{list(self._batch_size)}, got {list(dims)}."
            )
        dims = tuple(normalize_dim(d, ndim, f"{type(self).__name__}.permute") for d in dims)
        if sorted(dims) != list(range(ndim)):
            raise ValueError(f"{type(self).__name__}.permute: {list(dims)} is not a permutation.")
        new_size = torch.Size([self._batch_size[d] for d in dims])
        names = self._names and tuple(self._names[d] for d in dims)
        out = self._map(lambda v: v.permute(dims + tuple(range(ndim, v.dim()))), new_size, names)
        inverse = tuple(sorted(range(ndim), key=lambda d: dims[d]))
        return write_back(out, self, lambda permuted: permuted.permute(inverse))

    def transpose(self, dim0: int, dim1: int) -> Self:
        """Swap two batch dims."""
        ndim = len(self._batch_size)
        api = f"{type(self).__name__}.transpose"
        if not (-ndim <= dim0 < ndim and -ndim <= dim1 < ndim):
            raise DimOutOfRangeError(
                f"{api}: dim0 and dim1 must be within the range of the number of dimensions "
                f"(expected values in [{-ndim}, {ndim - 1}] for a batch of {ndim} dim(s), "
                f"got {dim0} and {dim1})."
            )
        dim0 = normalize_dim(dim0, ndim, api)
        dim1 = normalize_dim(dim1, ndim, api)
        size = list(self._batch_size)
        size[dim0], size[dim1] = size[dim1], size[dim0]
        names = None
        if self._names is not None:
            swapped = list(self._names)
            swapped[dim0], swapped[dim1] = swapped[dim1], swapped[dim0]
            names = tuple(swapped)
        out = self._map(lambda v: v.transpose(dim0, dim1), torch.Size(size), names)
        return write_back(out, self, lambda swapped: swapped.transpose(dim0, dim1))

    def expand(self, *shape) -> Self:
        """Broadcast the batch dims to ``shape`` (new leading dims allowed), without copying."""
        shape = _dims_arg(shape)
        ndim = len(self._batch_size)
        if len(shape) < ndim:
            raise ValueError(
                f"{type(self).__name__}.expand: "
                f"the new shape {list(shape)} must have at least {ndim} dims."
            )
        offset = len(shape) - ndim
        new = []
        for i, s in enumerate(shape):
            old = self._batch_size[i - offset] if i >= offset else None
            if s == -1:
                if old is None:
                    raise ValueError(
                        f"{type(self).__name__}.expand: -1 is not allowed for a new dim."
                    )
                s = old
            elif old is not None and old != 1 and old != s:
                raise ValueError(
                    f"{type(self).__name__}.expand: "
                    f"cannot expand batch size {list(self._batch_size)} "
                    f"to {list(shape)}."
                )
            new.append(s)
        new_size = torch.Size(new)
        names = self._names and (None,) * offset + self._names
        return self._map(lambda v: v.expand(new_size + v.shape[ndim:]), new_size, names)

    def expand_as(self, other) -> Self:
        """Expand to ``other``: to its shape (a tensor), or leaf by leaf to the shapes of
        its leaves, with its batch size (a container with the same keys).

        Example:
            >>> td = TensorDict({"a": torch.ones(3, 1)}, [3])
            >>> td.expand_as(TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3]))["a"].shape
            torch.Size([2, 3, 4])
        """
        if _collection(other):
            return self.apply(lambda t, o: t.expand_as(o), other, batch_size=other.batch_size)
        return self.expand(other.shape)

    # ------------------------------------------------------------------ splitting
    def _pieces(self, pieces_by_key: dict, sizes: list[torch.Size], names=None):
        keys = list(pieces_by_key)
        if not keys:
            return tuple(self._like({}, size, names) for size in sizes)
        like = self._like
        if any(-1 in size for size in sizes):  # ragged: each piece's leaves tell its size
            return tuple(
                like(data, resolve_ragged(size, data), names)
                for values, size in zip(zip(*pieces_by_key.values()), sizes)
                for data in (dict(zip(keys, values)),)
            )
        return tuple(
            like(dict(zip(keys, values)), size, names)
            for values, size in zip(zip(*pieces_by_key.values()), sizes)
        )

    def unbind(self, dim: int = 0) -> tuple[Self, ...]:
        """The slices along batch dim ``dim``, sharing storage."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, f"{type(self).__name__}.unbind")
        refuse_ragged_dim(self._batch_size, dim, f"{type(self).__name__}.unbind")
        size = self._batch_size
        new_size = size[:dim] + size[dim + 1 :]
        pieces = {key: value.unbind(dim) for key, value in self._data.items()}
        names = self._names
        if names is not None:
            names = _clean(names[:dim] + names[dim + 1 :])
        return self._pieces(pieces, [new_size] * size[dim], names)

    def split(self, split_size, dim: int = 0) -> tuple[Self, ...]:
        """Split along batch dim ``dim`` into pieces of ``split_size`` (int or list)."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, f"{type(self).__name__}.split")
        refuse_ragged_dim(self._batch_size, dim, f"{type(self).__name__}.split")
        size = self._batch_size[dim]
        if isinstance(split_size, int):
            if split_size <= 0:
                raise ValueError(
                    f"{type(self).__name__}.split: split_size must be positive, got {split_size}."
                )
            lengths = [min(split_size, size - start) for start in range(0, size, split_size)]
            lengths = lengths or [0]  # like torch: an empty dim gives one empty piece
        else:
            lengths = list(split_size)
            if sum(lengths) != size:
                raise ValueError(
                    f"{type(self).__name__}.split: split sizes {lengths} do not add up to {size}."
                )
        sizes = [
            self._batch_size[:dim] + torch.Size([n]) + self._batch_size[dim + 1 :] for n in lengths
        ]
        pieces = {key: split_leaf(value, lengths, dim) for key, value in self._data.items()}
        return self._pieces(pieces, sizes, self._names)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Self, ...]:
        """Split along batch dim ``dim`` into ``chunks`` pieces (like ``torch.chunk``)."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, f"{type(self).__name__}.chunk")
        refuse_ragged_dim(self._batch_size, dim, f"{type(self).__name__}.chunk")
        size = self._batch_size[dim]
        if chunks <= 0:
            raise ValueError(f"{type(self).__name__}.chunk: chunks must be positive, got {chunks}.")
        if not size:
            return self.split([0] * chunks, dim)
        return self.split(-(-size // chunks), dim)


def _clean(names: tuple | None) -> tuple | None:
    """Names as stored: None when no dim is named."""
    if names is None or all(n is None for n in names):
        return None
    return names


def _assign(target: torch.Tensor, index, value) -> None:
    target[index] = value


def _check_fits(shape: torch.Size, expected: torch.Size, key) -> None:
    """``shape`` must broadcast to ``expected`` (the shape of the indexed entry)."""
    if shape == expected:
        return
    # torch drops leading size-1 dims of the value: x[0] = torch.ones(1, 28, 28)
    # writes a [28, 28] row
    while len(shape) > len(expected) and shape[0] == 1:
        shape = shape[1:]
    try:
        ok = torch.broadcast_shapes(shape, expected) == expected
    except RuntimeError:
        ok = False
    if not ok:
        shown = key[0] if len(key) == 1 else key
        raise ValueError(
            f"TensorDict.__setitem__: cannot write a value of shape {list(shape)} at key "
            f"{shown!r}: the indexed entry has shape {list(expected)}."
        )


def _broadcastable(source: torch.Size, target: torch.Size) -> bool:
    if len(source) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(source), reversed(target)))


def _zeros_tree(view, new_size: torch.Size, device):
    """A container shaped like ``view`` with batch size ``new_size``, zero-filled."""
    ndim = len(view._batch_size)
    data: dict[str, Any] = {}
    for key, value in view._data.items():
        if isinstance(value, torch.Tensor):
            data[key] = value.new_zeros(
                new_size + value.shape[ndim:], device=device or value.device
            )
        elif _collection(value):
            inner = value._to_tensordict_view()
            zeros = _zeros_tree(inner, new_size + inner._batch_size[ndim:], device)
            data[key] = rewrap(value, zeros)
        elif isinstance(value, NonTensorData):
            fill = value.data if type(value) is NonTensorData else None
            data[key] = NonTensorData._make(fill, new_size + value.batch_size[ndim:], device)
    out = view._like(data, new_size, None)
    if device is not None:
        out._device = device
    return out


def _preallocate(td, key: str, template: Any, skip: int, index) -> None:
    """Lazy preallocation: a zero-filled entry with the full batch size, then the write."""
    full = td._batch_size
    device = td._device
    value: Any
    if isinstance(template, torch.Tensor):
        value = template.new_zeros(full + template.shape[skip:], device=device or template.device)
        value[index] = template
    elif isinstance(template, NonTensorData):
        fill = template.data if type(template) is NonTensorData else None
        value = write_at(
            NonTensorData._make(fill, full + template.batch_size[skip:], device), index, template
        )
    else:
        view = template._to_tensordict_view()
        zeros = _zeros_tree(view, full + view._batch_size[skip:], device)
        zeros._set_at_index(index, view)
        value = rewrap(template, zeros)
    td._data[key] = value


def _check_compatible_class(target: Any, value: Any, fields) -> None:
    """Writing ``value`` into a TensorClass at an index must not add a key that is not a field."""
    extra = sorted(k for k in value.keys() if k not in fields)  # noqa: SIM118 (iterating a container walks its batch)
    if extra:
        raise ValueError(
            f"{type(target).__name__}.__setitem__ is only allowed for same-class or compatible "
            f"class (fields of {type(target).__name__}) assignment: the "
            f"{type(value).__name__} written has {extra}, which are not fields of "
            f"{type(target).__name__} (fields: {sorted(fields)})."
        )


def write_back(out: Any, source: Any, inverse=None) -> Any:
    """A reshaped view of ``source``: ``with out:`` writes back, and a view of a locked
    container is locked (its structure follows the source's, as in tensordict)."""
    if source.is_locked and not out.is_locked:
        out.lock_()
    return _write_back(out, source, inverse)


def _write_non_tensor(data: dict, key: str, index, value: Any) -> None:
    data[key] = write_at(data[key], index, value)


def _index_names(names: tuple, index, new_ndim: int):
    """Names after ``index`` when only ints, slices and None are used; else None."""
    if type(index) is int:
        return _clean(names[1:])
    if type(index) is slice:
        return names
    out: list = []
    dim = 0
    for item in index:
        if item is None:
            out.append(None)
        elif type(item) is int:
            dim += 1
        elif type(item) is slice:
            out.append(names[dim])
            dim += 1
        else:
            return None
    out.extend(names[dim:])
    return _clean(tuple(out)) if len(out) == new_ndim else None
