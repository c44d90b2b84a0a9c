"""Indexing and shape operations over the batch dims, applied to every value.

Values are tensors, nested containers and non-tensor leaves; each is
"tensor-like" in its leading (batch) dims, so every operation here maps the
same call over the values and computes the new batch size once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..helpers.leaf_errors import map_values, note_key
from ..helpers.mixin import ContainerMixin
from ..helpers.mixin import is_tensor_collection as _collection
from ..helpers.parents import write_back as _write_back
from ..helpers.pieces import split_leaf
from ..helpers.reshape import _check_batch, _clean, resolve_ragged
from ..helpers.sizes import (
    BatchShapeError,
    DimOutOfRangeError,
    normalize_dim,
    plain_size,
    refuse_ragged_dim,
    resolve_shape,
)

if TYPE_CHECKING:
    from typing_extensions import Self
from ..helpers.reshape import _become


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

    # ------------------------------------------------------------------ reshaping
    def _map(self, fn, new_size: torch.Size, names=None):
        return self._like(map_values(self._data, fn), new_size, names)

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
        plain = self._plain_tensordict()
        # nested plain TensorDicts take the trusted path unless a subclass redefines reshape
        out = _reshaped(self, new_size, plain if plain.reshape is _RESHAPE else None)
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
            return _view_dtype(self, shape[0], batch_size)
        shape = _shape_arg(shape, size, "view")
        new_size = resolve_shape(self._batch_size, shape, f"{type(self).__name__}.view")
        ndim = len(self._batch_size)
        if new_size:  # (as in reshape)
            out = self._map(lambda v: v.view(*new_size, *v.shape[ndim:]), new_size)
        else:
            out = self._map(lambda v: v.view(v.shape[ndim:]), new_size)
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
        names = self._names
        if names is not None and start != end:  # the merged dim has no name; the others keep theirs
            names = _clean(names[:start] + (None,) + names[end + 1 :])
        out = self._map(lambda v: v.flatten(start, end), new_size, names)
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
        names = self._names
        if names is not None and len(inner) != 1:  # new dims have no name; the others keep theirs
            names = _clean(names[:dim] + (None,) * len(inner) + names[dim + 1 :])
        out = self._map(lambda v: v.unflatten(dim, inner), new_size, names)
        return write_back(out, self)

    def squeeze(self, dim: int | tuple | list | None = None) -> Self:
        """Remove batch dims of size 1: all of them, ``dim`` only, or the dims in a tuple
        (as ``torch.squeeze``, a listed dim whose size is not 1 stays).

        Example:
            >>> td = TensorDict({"a": torch.zeros(1, 2, 1)}, [1, 2, 1])
            >>> td.squeeze().batch_size, td.squeeze((0, -1)).batch_size, td.squeeze(1).batch_size
            (torch.Size([2]), torch.Size([2]), torch.Size([1, 2, 1]))
        """
        size = self._batch_size
        api = f"{type(self).__name__}.squeeze"
        if dim is None:
            dims = [d for d, s in enumerate(size) if s == 1]
        else:
            given = list(dim) if isinstance(dim, (tuple, list)) else [dim]
            given = [normalize_dim(d, len(size), api) for d in given]
            if len(set(given)) != len(given):  # RuntimeError, as torch.squeeze
                raise RuntimeError(f"{api}: dim {given} appears more than once in the dims.")
            dims = sorted(d for d in given if size[d] == 1)
        if not dims:  # new containers at every level (not the source's nested ones)
            return write_back(self._shallow_copy(), self)
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
            raise BatchShapeError(
                f"{type(self).__name__}.permute: expected {ndim} dims for batch size "
                f"{list(self._batch_size)}, got {list(dims)}."
            )
        dims = tuple(normalize_dim(d, ndim, f"{type(self).__name__}.permute") for d in dims)
        if sorted(dims) != list(range(ndim)):
            raise BatchShapeError(
                f"{type(self).__name__}.permute: {list(dims)} is not a permutation."
            )
        new_size = torch.Size([self._batch_size[d] for d in dims])
        names = self._names and tuple(self._names[d] for d in dims)
        if dims:  # (as in reshape)
            out = self._map(lambda v: v.permute(*dims, *range(ndim, v.dim())), new_size, names)
        else:
            out = self._map(lambda v: v.permute(tuple(range(v.dim()))), new_size, names)
        inverse = tuple(sorted(range(ndim), key=lambda d: dims[d]))
        return write_back(out, self, lambda permuted: permuted.permute(inverse))

    def transpose(self, dim0: int, dim1: int) -> Self:
        """Swap two batch dims."""
        ndim = len(self._batch_size)
        api = f"{type(self).__name__}.transpose"
        dim0, dim1 = (
            normalize_dim(d, ndim, api) if not isinstance(d, int) else d for d in (dim0, dim1)
        )
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
            raise BatchShapeError(
                f"{type(self).__name__}.expand: "
                f"the new shape {list(shape)} must have at least {ndim} dims."
            )
        offset = len(shape) - ndim
        new = []
        for i, s in enumerate(shape):
            old = self._batch_size[i - offset] if i >= offset else None
            if s == -1:
                if old is None:
                    raise BatchShapeError(
                        f"{type(self).__name__}.expand: -1 is not allowed for a new dim."
                    )
                s = old
            elif old is not None and old != 1 and old != s:
                raise BatchShapeError(
                    f"{type(self).__name__}.expand: "
                    f"cannot expand batch size {list(self._batch_size)} "
                    f"to {list(shape)}."
                )
            new.append(s)
        new_size = plain_size(new)
        names = self._names and (None,) * offset + self._names
        if new_size:  # (as in reshape)
            return self._map(lambda v: v.expand(*new_size, *v.shape[ndim:]), new_size, names)
        return self._map(lambda v: v.expand(v.shape[ndim:]), new_size, names)

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
        size = self._batch_size
        ndim = len(size)
        if dim.__class__ is not int or not -ndim <= dim < ndim:  # the checks with their errors
            dim = normalize_dim(dim, ndim, f"{type(self).__name__}.unbind")
        elif dim < 0:
            dim += ndim
        count = size[dim]
        if count == -1:
            refuse_ragged_dim(size, dim, f"{type(self).__name__}.unbind")
        # slicing a Size builds a Size (costly): dim 0, the common case, slices once
        new_size = size[1:] if not dim else size[:dim] + size[dim + 1 :]
        names = self._names
        if names is not None:
            names = _clean(names[:dim] + names[dim + 1 :])
        data = self._data
        try:  # every value has ``unbind`` (tensors, containers, non-tensor leaves)
            columns = [value.unbind(dim) for value in data.values()]
        except Exception:  # again, value by value: the error names its key
            columns = list(map_values(data, lambda value: value.unbind(dim)).values())
        if not columns:
            return tuple(self._like({}, new_size, names) for _ in range(count))
        if -1 in new_size:  # ragged: each piece's leaves tell its size
            return self._pieces(dict(zip(data, columns)), [new_size] * count, names)
        keys = tuple(data)
        like = self._like
        return tuple([like(dict(zip(keys, row)), new_size, names) for row in zip(*columns)])

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
                raise BatchShapeError(
                    f"{type(self).__name__}.split: split sizes {lengths} do not add up to {size}."
                )
        sizes = [
            self._batch_size[:dim] + torch.Size([n]) + self._batch_size[dim + 1 :] for n in lengths
        ]
        pieces = map_values(self._data, lambda value: split_leaf(value, lengths, dim))
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


_RESHAPE = ShapeOpsMixin.reshape


def _reshaped(node: Any, new_size: torch.Size, plain: type | None) -> Any:
    """``node`` with its batch dims reshaped to ``new_size`` (resolved by the caller).

    A nested level of class ``plain`` (unlocked) is reshaped here again, with the shape
    its parent's implies; its twin is its own :meth:`~ShapeOpsMixin.reshape`, which
    resolves and checks that shape once more and links the result back to it (as
    done below). Other values (TensorClass, non-tensor leaves, locked levels) use their
    own ``reshape``. An error names the key path it was raised at, as ``map_values`` does.
    """
    ndim = len(node._batch_size)
    data = {}
    key = None
    try:
        for key, value in node._data.items():
            kind = type(value)
            if kind is plain and not value._is_locked:
                sub = _reshaped(value, new_size + value._batch_size[ndim:], plain)
                sub._last_op = (value, None)  # write_back(sub, value), as its reshape does
                data[key] = sub
            elif new_size:  # sizes as separate ints: torch parses them faster than one Size
                data[key] = value.reshape(*new_size, *value.shape[ndim:])
            else:
                data[key] = value.reshape(value.shape[ndim:])
    except Exception as error:
        note_key(error, key)
        raise
    return node._like(data, new_size, None)  # names: as _map gives them (none)


def _view_dtype(self: Any, dtype: torch.dtype, batch_size: Any) -> Any:
    """``view(dtype)``: every tensor viewed as ``dtype``. A dtype of another element size
    changes each leaf's last dim (as ``Tensor.view(dtype)`` does): where that dim is a
    batch dim, the result is refused rather than given a batch size its leaves lack."""
    new_size = None if batch_size is None else torch.Size(batch_size)
    if new_size == self._batch_size:
        new_size = None  # the same batch: the names stay
    out = self._apply_tree(lambda t: t.view(dtype), (), new_size, None, False, check=False)
    try:
        _check_batch(out._to_tensordict_view(), out._batch_size, (), "view")
    except ValueError as error:
        raise BatchShapeError(
            f"{error} Viewing as {dtype} changes the size of each leaf's last dim, here a "
            f"batch dim: give the leaves a feature dim, or pass batch_size= for the new shape."
        ) from None
    return out


def write_back(out: Any, source: Any, inverse=None) -> Any:
    """A reshaped view of ``source``: ``with out:`` writes back, and a view of a locked
    container is locked (its structure follows the source's, as in tensordict)."""
    if source.is_locked and not out.is_locked:
        out.lock_()
    return _write_back(out, source, inverse)
