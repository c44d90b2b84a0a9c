"""Shape arithmetic on batch sizes, shared by every container.

These functions compute what a shape operation does to the batch dimensions,
without touching any data, so that an empty container (or a non-tensor leaf)
gets the same batch size a tensor would.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch

from .tracing import dynamo_compiling as _dynamo_compiling

_SIZES: dict[tuple, torch.Size] = {}  # validated batch sizes given as lists / tuples


def size_key(batch_size: list | tuple) -> tuple | None:
    """The cache key of a list or tuple batch size: the tuple if every item is an
    ``int`` (exactly), else ``None`` (not cached: the uncached path decides).

    A key of the raw items would let a cached ``[3]`` accept ``[3.0]`` (and
    ``Decimal(3)``, ``3+0j``, ``-0.0`` for ``0``): they compare and hash equal to
    ints, so what is accepted would depend on what was built before.
    """
    for item in batch_size:
        if type(item) is not int:
            return None
    return tuple(batch_size)


def as_size(batch_size, api: str = "TensorDict") -> torch.Size:
    """Validate a user-given batch size and return it as a ``torch.Size``."""
    kind = type(batch_size)
    if kind is list or kind is tuple:
        key = size_key(batch_size)
        size = None if key is None else _SIZES.get(key)
        if size is not None:
            return size
        try:
            size = torch.Size(batch_size)
        except TypeError:
            raise _size_type_error(batch_size, api) from None
        size = _check_non_negative(size, api)
        if key is not None and len(_SIZES) < 4096:
            _SIZES[key] = size
        return size
    if kind is torch.Size:
        return _check_non_negative(batch_size, api)
    if batch_size is None:
        return torch.Size()
    if isinstance(batch_size, (int, np.integer)):
        size = torch.Size([batch_size])
    else:
        try:
            size = torch.Size(batch_size)
        except TypeError:
            raise _size_type_error(batch_size, api) from None
    return _check_non_negative(size, api)


SIZE_CACHE: dict[tuple, tuple] = {}  # batch-size list -> size_info(...)


def size_info(batch_size) -> tuple[torch.Size, int, int, int]:
    """``(size, ndim, size[0] or 0, size[1] or 0)`` for the constructor's fast path (cached)."""
    key = None
    if type(batch_size) is list or type(batch_size) is tuple:
        key = size_key(batch_size)
        info = None if key is None else SIZE_CACHE.get(key)
        if info is not None:
            return info
    size = as_size(batch_size)
    ndim = len(size)
    info = (size, ndim, size[0] if ndim else 0, size[1] if ndim > 1 else 0)
    if key is not None and len(SIZE_CACHE) < 4096:
        SIZE_CACHE[key] = info
    return info


def _check_non_negative(size: torch.Size, api: str) -> torch.Size:
    """``size`` checked, with numpy integers made Python ints (``torch.Size`` keeps them,
    and they would reach ``meta.json``, reprs and ``batch_size`` as numpy scalars)."""
    # -1 marks a ragged dim: nested tensors whose components differ in length there.
    # The first dim counts the components, so it is never ragged.
    numpy_dims = False
    for dim, s in enumerate(size):
        if s < -1 or (s == -1 and dim == 0):
            raise ValueError(
                f"{api}: batch_size must not be negative, got {list(size)} (-1 marks a "
                f"ragged dim of nested tensors, after the first dim)."
            )
        if type(s) is not int and isinstance(s, np.integer):
            numpy_dims = True
    if numpy_dims:  # symbolic dims (torch.SymInt) are kept as they are
        return torch.Size([int(s) if isinstance(s, np.integer) else s for s in size])
    return size


def plain_size(dims) -> torch.Size:
    """``torch.Size(dims)`` with numpy integers made Python ints (symbolic dims kept).

    Example:
        >>> plain_size([np.int64(3), 4])
        torch.Size([3, 4])
    """
    if any(type(d) is not int and isinstance(d, np.integer) for d in dims):
        dims = [int(d) if isinstance(d, np.integer) else d for d in dims]
    return torch.Size(dims)


def _size_type_error(batch_size, api: str) -> TypeError:
    return TypeError(
        f"{api}: batch_size must be a sequence of ints (e.g. [3, 4]), got "
        f"{type(batch_size).__name__} {batch_size!r}."
    )


def leaf_shape(value: torch.Tensor) -> torch.Size:
    """``value.shape``, with ``-1`` at the ragged dims of a nested tensor."""
    if not value.is_nested:
        return value.shape
    shape = []
    for dim in range(value.dim()):
        try:
            size = value.size(dim)
        except RuntimeError:  # a strided nested tensor has no size at a ragged dim
            size = -1
        shape.append(size if type(size) is int else -1)  # jagged: a symbolic nested int
    return torch.Size(shape)


def refuse_ragged_dim(size: torch.Size, dim: int, api: str) -> None:
    """A clear error for an op along a ragged batch dim (its length is not one number)."""
    if size[dim] == -1:
        raise ValueError(
            f"{api}: batch dim {dim} of the batch size {list(size)} is ragged (-1): its "
            f"length differs between the nested tensors' components. Call "
            f"to_padded_tensor() first for a dense batch."
        )


class BatchSizeMismatchError(ValueError, RuntimeError):
    """A value whose batch size does not fit where it is written.

    A ``ValueError`` (a bad value) that is also the ``RuntimeError`` tensordict
    raises there, so code written against either library catches it.
    """


class DimOutOfRangeError(IndexError, ValueError, RuntimeError):
    """A batch dim outside the batch.

    The ``IndexError`` torch raises for a tensor dim, and the ``ValueError`` or
    ``RuntimeError`` tensordict raises for batch-dim arguments (``unsqueeze``,
    ``gather``, ``torch.cat``), so any of those ``except`` clauses catches it.
    """


class EntryShapeError(ValueError, RuntimeError):
    """A value that does not fit the entry it is written into in place (``set_``,
    ``td[idx] = ...``, ``set_at_``, ``update_``).

    A ``ValueError`` that is also the ``RuntimeError`` torch raises for the same
    copy into a tensor, as tensordict does.
    """


class MaskShapeError(IndexError, ValueError, RuntimeError):
    """A mask whose shape is not a leading part of the batch size (``where``,
    ``masked_fill``, ``masked_select``).

    A ``ValueError`` that is also what torch and tensordict raise for the same mask:
    the ``IndexError`` of boolean indexing and the ``RuntimeError`` of a broadcast.
    """


class BatchShapeError(ValueError, RuntimeError):
    """A shape the batch cannot take (``view``, ``reshape``, ``expand``, ``split``,
    ``permute``, ``torch.cat``, ``torch.stack``).

    A ``ValueError`` (a bad argument) that is also the ``RuntimeError`` torch raises
    for the same call on a tensor, as tensordict does, so code written against
    either library catches it.
    """


def normalize_dim(dim: int, ndim: int, api: str) -> int:
    """Turn a possibly negative batch dim into a positive one, with a clear error."""
    try:
        dim = operator.index(dim)
    except TypeError:
        # a dim name ("time") would otherwise fail on the comparison below with
        # Python's words for it, naming neither the API nor the argument
        hint = (
            f" Batch dims are given by position: td.names.index({dim!r}) turns a dim name into one."
            if isinstance(dim, str)
            else ""
        )
        raise TypeError(
            f"{api}: dim must be an int (a batch dim in [{-ndim}, {ndim - 1}]), got "
            f"{type(dim).__name__} {dim!r}.{hint}"
        ) from None
    if not -ndim <= dim < ndim:
        raise DimOutOfRangeError(
            f"{api}: dim {dim} is out of range for a batch of {ndim} dim(s) "
            f"(expected a value in [{-ndim}, {ndim - 1}])."
        )
    return dim + ndim if dim < 0 else dim


def pad_plan(batch_size: torch.Size, pad_size, api: str) -> tuple[list, torch.Size]:
    """The ``(left, right)`` pairs of ``pad_size`` (first batch dim first) and the new size.

    ``pad_size`` reads ``(dim0_left, dim0_right, dim1_left, ...)``; negative sizes crop.
    A malformed ``pad_size`` or a negative output size is the ``RuntimeError``
    ``torch.nn.functional.pad`` raises.
    """
    pad_size = [int(p) for p in pad_size]
    ndim = len(batch_size)
    if len(pad_size) % 2 or len(pad_size) > 2 * ndim:
        raise RuntimeError(
            f"{api}: pad_size must have an even length of at most {2 * ndim} (two per batch "
            f"dim), got {pad_size}."
        )
    pairs = [(pad_size[i], pad_size[i + 1]) for i in range(0, len(pad_size), 2)]
    size = list(batch_size)
    for d, (left, right) in enumerate(pairs):
        size[d] += left + right
    if any(s < 0 for s in size):
        raise RuntimeError(
            f"{api}: padding the batch size {list(batch_size)} by {pad_size} gives a "
            f"negative output size {size}."
        )
    return pairs, torch.Size(size)


def resolve_shape(batch_size: torch.Size, shape, api: str = "reshape") -> torch.Size:
    """Resolve a ``reshape``/``view`` target (with at most one ``-1``)."""
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = tuple(shape[0])
    try:
        # a symbolic size (a nested container under torch.export) stays one: int() pins it
        shape = [s if type(s) is torch.SymInt else int(s) for s in shape]
    except (TypeError, ValueError):
        raise TypeError(f"{api}: the new shape must be ints, got {shape!r}.") from None
    numel = math.prod(batch_size)
    if shape.count(-1) > 1:
        raise BatchShapeError(f"{api}: only one dimension can be inferred (-1), got {shape}.")
    if any(s < -1 for s in shape):
        raise BatchShapeError(f"{api}: invalid shape {shape} (negative size).")
    if -1 in shape:
        known = math.prod([s for s in shape if s != -1])  # (dynamo traces no generator here)
        if known == 0 or numel % known:
            raise BatchShapeError(
                f"{api}: shape {shape} is invalid for a batch of size {list(batch_size)}."
            )
        shape[shape.index(-1)] = numel // known
    if math.prod(shape) != numel:
        raise BatchShapeError(
            f"{api}: shape {shape} is invalid for a batch of size {list(batch_size)} "
            f"({numel} elements)."
        )
    return torch.Size(shape)


def expand_ellipsis(index: tuple, ndim: int) -> tuple:
    """Replace ``...`` with full slices so that the index only touches batch dims.

    Leaves have more dims than the batch; ``leaf[..., :2]`` would slice their
    last (feature) dim, so the ellipsis is made explicit before indexing them.
    Lists and numpy arrays become tensors first: a nested list or array of bools
    is a mask that spans as many batch dims as it has dims, as torch reads it.
    """
    consumed = 0
    ellipsis_at = -1
    converted = False
    for i, item in enumerate(index):
        if item is Ellipsis:
            if ellipsis_at >= 0:
                raise IndexError("tdfunc: an index can only have a single ellipsis ('...').")
            ellipsis_at = i
            continue
        if item is None:
            continue
        kind = type(item)
        if kind is int or kind is slice:
            consumed += 1
            continue
        if kind is list or isinstance(item, (np.ndarray, range)):
            item = as_index_tensor(item)
            if not converted:
                index = list(index)
                converted = True
            index[i] = item
        if isinstance(item, (bool, np.bool_)):
            continue  # True / False add a dim of size 1 / 0 and consume none, as in torch
        if isinstance(item, torch.Tensor) and item.dtype is torch.bool:
            consumed += item.dim()  # a 0-dim mask consumes none
        else:
            consumed += 1
    if converted:
        index = tuple(index)
    if consumed > ndim:
        raise IndexError(
            f"tdfunc: too many indices for a TensorDict with {ndim} batch dim(s): "
            f"the index consumes {consumed}."
        )
    if ellipsis_at < 0:
        return index
    fill = (slice(None),) * (ndim - consumed)
    return index[:ellipsis_at] + fill + index[ellipsis_at + 1 :]


def as_index_tensor(item):
    """A list, range or numpy array used as an index, as the tensor torch reads it as."""
    try:
        tensor = torch.as_tensor(item)
    except (TypeError, ValueError, RuntimeError):
        return item  # lists of slices and the like: torch decides
    if tensor.is_floating_point() and not tensor.numel():
        return tensor.long()  # ``[]`` selects nothing, as torch reads it
    return tensor


def _ragged_index(dim: int, item) -> IndexError:
    return IndexError(
        f"tdfunc: batch dim {dim} is ragged (-1: its length differs between nested "
        f"components), so {item!r} cannot index it. Index the dims before it first "
        f"(td[i] gives dense leaves), or call to_padded_tensor()."
    )


def _slice_len(item: slice, size: int) -> int:
    """How many elements ``item`` (positive step) takes from a symbolic size.

    ``slice.indices`` needs a concrete int: under torch.compile with a dynamic batch
    dim it would pin the size and recompile for every new one. This is the same
    arithmetic with ``sym_min``/``sym_max``, which keep the size symbolic.
    """
    step = 1 if item.step is None else item.step

    def clamp(bound, default):
        if bound is None:
            return default
        if bound < 0:
            return torch.sym_max(bound + size, 0)
        return torch.sym_min(bound, size)

    start, stop = clamp(item.start, 0), clamp(item.stop, size)
    return torch.sym_max((stop - start + step - 1) // step, 0)


def _simple_index_size(batch_size: torch.Size, index: tuple) -> torch.Size | None:
    """Batch size after ``index`` made of ints, slices and None; None if other kinds."""
    out: list[int] = []
    dim = 0
    for item in index:
        if item is None:
            out.append(1)
            continue
        t = type(item)
        if t is int:
            size = batch_size[dim]
            if not -size <= item < size:
                if size < 0:
                    raise _ragged_index(dim, item)
                raise IndexError(
                    f"tdfunc: index {item} is out of range for batch dim {dim} of size {size}."
                )
            dim += 1
        elif t is slice:
            if batch_size[dim] < 0:  # a ragged dim: a full slice keeps it, nothing else fits
                if item != slice(None):
                    raise _ragged_index(dim, item)
                out.append(batch_size[dim])
                dim += 1
                continue
            if item.step is not None and item.step <= 0:
                raise ValueError(f"tdfunc: slice step must be positive, got {item.step}.")
            size = batch_size[dim]
            # a symbolic size (torch.export; under dynamo its type reads as int) stays one
            if type(size) is int and not _dynamo_compiling():
                out.append(len(range(*item.indices(size))))
            else:
                out.append(_slice_len(item, size))
            dim += 1
        else:
            return None
    out.extend(batch_size[dim:])
    return torch.Size(out)


def index_batch_size(batch_size: torch.Size, index) -> torch.Size:
    """The batch size that indexing a batch of ``batch_size`` with ``index`` gives."""
    if type(index) is int:
        return _simple_index_size(batch_size, (index,))  # type: ignore[return-value]
    if type(index) is not tuple:
        index = (index,)
    index = expand_ellipsis(index, len(batch_size))
    size = _simple_index_size(batch_size, index)
    if size is not None:
        return size
    # Tensors, lists, masks: let torch apply its advanced-indexing rules to a
    # stride-0 stand-in (no memory is read, the result is tiny or zero-sized).
    device = next((i.device for i in index if isinstance(i, torch.Tensor)), torch.device("cpu"))
    stand_in = torch.zeros((), dtype=torch.uint8, device=device).expand(batch_size)
    return stand_in[index].shape


def checked_names(value, batch_size: torch.Size, api: str) -> tuple | None:
    """``value`` as the names of ``batch_size``'s dims (``None`` when none is named).

    One name (a ``str`` or ``None``) per batch dim, no name twice; ``api`` prefixes
    the error (``"TensorDict.names"``).
    """
    if value is None:
        return None
    value = tuple(value)
    if len(value) != len(batch_size):
        raise ValueError(
            f"{api}: expected {len(batch_size)} names for batch size {list(batch_size)}, "
            f"got {list(value)}."
        )
    for name in value:
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{api}: names must be str or None, got {name!r}.")
    given = [n for n in value if n is not None]
    if len(set(given)) != len(given):
        raise ValueError(f"{api}: names must be unique, got {list(value)}.")
    return value if given else None
