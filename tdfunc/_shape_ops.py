"""Indexing and shape operations over the batch dims, applied to every value.

Values are tensors, nested containers and non-tensor leaves; each is
"tensor-like" in its leading (batch) dims, so every operation here maps the
same call over the values and computes the new batch size once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._nontensor import NonTensorData
from ._shapes import (
    _simple_index_size,
    expand_ellipsis,
    index_batch_size,
    normalize_dim,
    resolve_shape,
)


def _collection(value: Any) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


def _dims_arg(dims: tuple) -> tuple:
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        return tuple(dims[0])
    return dims


class ShapeOpsMixin:
    """Tensor-like indexing and reshaping of a container (methods of ``TensorDict``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ indexing
    def _leaf_index(self, index):
        """(index to apply to each value, new batch size or None if leaf-derived)."""
        size = self._batch_size
        t = type(index)
        if t is int:
            if not size:
                raise IndexError("TensorDict: cannot index a TensorDict with batch_size=[].")
            return index, _simple_index_size(size, (index,))
        if t is slice:
            if not size:
                raise IndexError("TensorDict: cannot slice a TensorDict with batch_size=[].")
            return index, _simple_index_size(size, (index,))
        if t is not tuple:
            index = (index,)
        index = expand_ellipsis(index, len(size))
        return index, _simple_index_size(size, index)

    def _index(self, index):
        leaf_index, new_size = self._leaf_index(index)
        data = {key: value[leaf_index] for key, value in self._data.items()}
        if new_size is None:
            new_size = self._derive_size(data, leaf_index)
        names = None
        if self._names is not None:
            names = _index_names(self._names, leaf_index, len(new_size))
        return self._like(data, new_size, names)

    def _derive_size(self, data: dict, leaf_index) -> torch.Size:
        ndim = len(self._batch_size)
        for key, out in data.items():
            feature_dims = self._data[key].dim() - ndim
            return out.shape[: out.dim() - feature_dims]
        return index_batch_size(self._batch_size, leaf_index)

    def _set_at_index(self, index, value: Any) -> None:
        leaf_index, _ = self._leaf_index(index)
        if isinstance(value, Mapping) and not _collection(value):
            target = index_batch_size(self._batch_size, leaf_index)
            from ._container import TensorDict

            value = TensorDict(value, batch_size=target)
        if not _collection(value):
            for item in self._data.values():
                if isinstance(item, NonTensorData):
                    continue
                item[leaf_index] = value
            return
        source = value._to_tensordict_view()
        for key, sub in source._data.items():
            existing = self._data.get(key)
            if existing is None:
                existing = self._preallocate(key, sub, source._batch_size)
            if isinstance(existing, NonTensorData):
                existing.data = sub.data if isinstance(sub, NonTensorData) else sub
            else:
                existing[leaf_index] = sub

    def _preallocate(self, key: str, template: Any, template_size: torch.Size):
        """Lazy preallocation: a zero-filled value with the full batch size."""
        self._check_writable("__setitem__", key)
        full = self._batch_size
        skip = len(template_size)
        if isinstance(template, torch.Tensor):
            value = template.new_zeros(full + template.shape[skip:])
        elif isinstance(template, NonTensorData):
            value = NonTensorData._make(template.data, full, self._device)
        else:
            inner = full + template.batch_size[skip:]
            value = template.apply(
                lambda t: t.new_zeros(inner + t.shape[len(template.batch_size) :]),
                batch_size=inner,
            )
        if self._device is not None and not isinstance(value, NonTensorData):
            value = value.to(self._device)
        self._data[key] = value
        return value

    # ------------------------------------------------------------------ reshaping
    def _map(self, fn, new_size: torch.Size, names=None):
        return self._like({k: fn(v) for k, v in self._data.items()}, new_size, names)

    def reshape(self, *shape):
        """Reshape the batch dims (feature dims are kept).

        Example:
            >>> TensorDict({"a": torch.zeros(3, 4, 5)}, [3, 4]).reshape(-1)["a"].shape
            torch.Size([12, 5])
        """
        new_size = resolve_shape(self._batch_size, shape)
        ndim = len(self._batch_size)
        return self._map(lambda v: v.reshape(new_size + v.shape[ndim:]), new_size)

    def view(self, *shape):
        """Like :meth:`reshape`, but never copies (errors when a view is impossible)."""
        if len(shape) == 1 and isinstance(shape[0], torch.dtype):
            raise TypeError("TensorDict.view: viewing as a dtype is not supported.")
        new_size = resolve_shape(self._batch_size, shape)
        ndim = len(self._batch_size)
        return self._map(lambda v: v.view(new_size + v.shape[ndim:]), new_size)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        """Merge batch dims ``start_dim..end_dim`` into one."""
        ndim = len(self._batch_size)
        if ndim == 0:
            return self
        start = normalize_dim(start_dim, ndim, "TensorDict.flatten")
        end = normalize_dim(end_dim, ndim, "TensorDict.flatten")
        if start > end:
            raise ValueError("TensorDict.flatten: start_dim cannot come after end_dim.")
        size = self._batch_size
        merged = 1
        for s in size[start : end + 1]:
            merged *= s
        new_size = size[:start] + torch.Size([merged]) + size[end + 1 :]
        return self._map(lambda v: v.flatten(start, end), new_size)

    def unflatten(self, dim: int, sizes):
        """Split batch dim ``dim`` into ``sizes``."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, "TensorDict.unflatten")
        inner = resolve_shape(self._batch_size[dim : dim + 1], tuple(sizes))
        new_size = self._batch_size[:dim] + inner + self._batch_size[dim + 1 :]
        return self._map(lambda v: v.unflatten(dim, inner), new_size)

    def squeeze(self, dim: int | None = None):
        """Remove batch dims of size 1 (all of them, or ``dim`` only)."""
        size = self._batch_size
        if dim is None:
            dims = [d for d, s in enumerate(size) if s == 1]
        else:
            dim = normalize_dim(dim, len(size), "TensorDict.squeeze")
            dims = [dim] if size[dim] == 1 else []
        if not dims:
            return self
        new_size = torch.Size([s for d, s in enumerate(size) if d not in dims])
        names = self._names and tuple(n for d, n in enumerate(self._names) if d not in dims)

        def squeeze(value):
            for d in reversed(dims):
                value = value.squeeze(d)
            return value

        return self._map(squeeze, new_size, names)

    def unsqueeze(self, dim: int):
        """Insert a batch dim of size 1 at ``dim``."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim + 1, "TensorDict.unsqueeze")
        size = list(self._batch_size)
        size.insert(dim, 1)
        names = None
        if self._names is not None:
            names = self._names[:dim] + (None,) + self._names[dim:]
        return self._map(lambda v: v.unsqueeze(dim), torch.Size(size), names)

    def permute(self, *dims):
        """Reorder the batch dims."""
        dims = _dims_arg(dims)
        ndim = len(self._batch_size)
        if len(dims) != ndim:
            raise ValueError(
                f"TensorDict.permute: expected {ndim} dims for batch size "
                f"{list(self._batch_size)}, got {list(dims)}."
            )
        dims = tuple(normalize_dim(d, ndim, "TensorDict.permute") for d in dims)
        if sorted(dims) != list(range(ndim)):
            raise ValueError(f"TensorDict.permute: {list(dims)} is not a permutation.")
        new_size = torch.Size([self._batch_size[d] for d in dims])
        names = self._names and tuple(self._names[d] for d in dims)
        return self._map(lambda v: v.permute(*dims, *range(ndim, v.dim())), new_size, names)

    def transpose(self, dim0: int, dim1: int):
        """Swap two batch dims."""
        ndim = len(self._batch_size)
        dim0 = normalize_dim(dim0, ndim, "TensorDict.transpose")
        dim1 = normalize_dim(dim1, ndim, "TensorDict.transpose")
        size = list(self._batch_size)
        size[dim0], size[dim1] = size[dim1], size[dim0]
        names = None
        if self._names is not None:
            swapped = list(self._names)
            swapped[dim0], swapped[dim1] = swapped[dim1], swapped[dim0]
            names = tuple(swapped)
        return self._map(lambda v: v.transpose(dim0, dim1), torch.Size(size), names)

    def expand(self, *shape):
        """Broadcast the batch dims to ``shape`` (new leading dims allowed), without copying."""
        shape = _dims_arg(shape)
        ndim = len(self._batch_size)
        if len(shape) < ndim:
            raise ValueError(
                f"TensorDict.expand: the new shape {list(shape)} must have at least {ndim} dims."
            )
        offset = len(shape) - ndim
        new = []
        for i, s in enumerate(shape):
            old = self._batch_size[i - offset] if i >= offset else None
            if s == -1:
                if old is None:
                    raise ValueError("TensorDict.expand: -1 is not allowed for a new dim.")
                s = old
            elif old is not None and old != 1 and old != s:
                raise ValueError(
                    f"TensorDict.expand: cannot expand batch size {list(self._batch_size)} "
                    f"to {list(shape)}."
                )
            new.append(s)
        new_size = torch.Size(new)
        return self._map(lambda v: v.expand(*new_size, *v.shape[ndim:]), new_size)

    def expand_as(self, other):
        return self.expand(other.shape)

    # ------------------------------------------------------------------ splitting
    def _pieces(self, pieces_by_key: dict, sizes: list[torch.Size]):
        keys = list(pieces_by_key)
        if not keys:
            return tuple(self._like({}, size, None) for size in sizes)
        return tuple(
            self._like(dict(zip(keys, values)), size, None)
            for values, size in zip(zip(*pieces_by_key.values()), sizes)
        )

    def unbind(self, dim: int = 0):
        """The slices along batch dim ``dim``, sharing storage."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, "TensorDict.unbind")
        size = self._batch_size
        new_size = size[:dim] + size[dim + 1 :]
        pieces = {key: value.unbind(dim) for key, value in self._data.items()}
        return self._pieces(pieces, [new_size] * size[dim])

    def split(self, split_size, dim: int = 0):
        """Split along batch dim ``dim`` into pieces of ``split_size`` (int or list)."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, "TensorDict.split")
        size = self._batch_size[dim]
        if isinstance(split_size, int):
            lengths = [min(split_size, size - start) for start in range(0, size, split_size)]
        else:
            lengths = list(split_size)
            if sum(lengths) != size:
                raise ValueError(
                    f"TensorDict.split: split sizes {lengths} do not add up to {size}."
                )
        sizes = [
            self._batch_size[:dim] + torch.Size([n]) + self._batch_size[dim + 1 :] for n in lengths
        ]
        pieces = {key: value.split(lengths, dim) for key, value in self._data.items()}
        return self._pieces(pieces, sizes)

    def chunk(self, chunks: int, dim: int = 0):
        """Split along batch dim ``dim`` into ``chunks`` pieces (like ``torch.chunk``)."""
        ndim = len(self._batch_size)
        dim = normalize_dim(dim, ndim, "TensorDict.chunk")
        size = self._batch_size[dim]
        step = -(-size // chunks) if size else 1
        return self.split(step, dim)


def _index_names(names: tuple, index, new_ndim: int):
    """Names after ``index`` when only ints, slices and None are used; else None."""
    if type(index) is int:
        return names[1:] or None
    if type(index) is slice:
        return names
    out = []
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
    return tuple(out) if len(out) == new_ndim and any(out) else None
