"""Value helpers of non-tensor leaves: batch shapes, nested lists and numpy object arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def _size_of(shape) -> torch.Size:
    return shape if type(shape) is torch.Size else torch.Size(shape)


def _dims(dims: tuple) -> tuple:
    if len(dims) == 1 and isinstance(dims[0], (list, tuple, torch.Size)):
        return tuple(dims[0])
    return dims


def _meta(batch_size: torch.Size) -> torch.Tensor:
    """A data-free stand-in with the batch shape, for torch's own shape rules."""
    return torch.empty(batch_size, device="meta")


def _flat_shape(batch_size: torch.Size, start_dim: int | None, end_dim: int | None):
    start = 0 if start_dim is None else start_dim
    end = -1 if end_dim is None else end_dim
    return _meta(batch_size).flatten(start, end).shape


def _equal(left: Any, right: Any) -> bool:
    try:
        return bool(left == right)
    except Exception:  # values whose == is not a bool (arrays, tensors, ...)
        return left is right


_BASIC = (int, slice, bool, type(None), type(Ellipsis))


def _is_basic(index: Any) -> bool:
    """An index that selects each element at most once, as a tensor view's does."""
    if type(index) is tuple:
        return all(type(item) in _BASIC for item in index)
    return type(index) in _BASIC


def _check_nested(data: Any, shape: tuple) -> None:
    if not shape:
        return
    if not isinstance(data, list) or len(data) != shape[0]:
        raise ValueError(
            f"NonTensorStack: data must be a nested list of shape {list(shape)}; got "
            f"{type(data).__name__} of length {len(data) if isinstance(data, list) else '-'}."
        )
    for item in data:
        _check_nested(item, shape[1:])


def _filled(value: Any, shape: tuple) -> list:
    """A nested list of ``shape`` whose items all reference ``value`` (distinct inner lists)."""
    if len(shape) == 1:
        return [value] * shape[0]
    return [_filled(value, shape[1:]) for _ in range(shape[0])]


def _copy_nested(data: Any) -> Any:
    return [_copy_nested(item) for item in data] if isinstance(data, list) else data


def _nested_list(array: np.ndarray) -> Any:
    if array.ndim == 0:
        return array[()]
    if array.ndim == 1:
        return list(array)
    return [_nested_list(sub) for sub in array]


def _numpy_index(index: Any) -> Any:
    if isinstance(index, torch.Tensor):
        return index.cpu().numpy()
    if type(index) is tuple:
        return tuple(_numpy_index(item) for item in index)
    return index


def _positions(shape: tuple, index: Any) -> np.ndarray:
    """Flat positions that ``index`` selects in an array of ``shape`` (always an array)."""
    return np.asarray(np.arange(int(np.prod(shape))).reshape(shape)[_numpy_index(index)])


def take(array: np.ndarray, index: Any) -> np.ndarray:
    """``array[index]`` for an object array, always as an array (0-d for one element)."""
    positions = _positions(array.shape, index)
    out = np.empty(positions.shape, dtype=object)
    out.reshape(-1)[:] = array.reshape(-1)[positions.reshape(-1)]
    return out


MAX_DEPTH = 100  # deeper values are not stored as JSON (a reader would recurse deeply)


def is_json_exact(value: Any, depth: int = 0) -> bool:
    """True when ``json.loads(json.dumps(value)) == value`` with the same types.

    Values nested deeper than ``MAX_DEPTH`` are not stored inline (a reader
    would need deep recursion to parse them).
    """
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return True
    if depth >= MAX_DEPTH:
        return False
    if kind is list:
        return all(is_json_exact(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(k) is str and is_json_exact(v, depth + 1) for k, v in value.items())
    return False


# ---------------------------------------------------------------- without numpy
# torch.compile cannot trace numpy object arrays; joining leaves inside a compiled
# function builds the same nested lists with plain Python.
def join_nested(lists: list, dim: int, stacking: bool) -> list:
    """``np.stack`` (or ``np.concatenate``) of nested lists of one shape along ``dim``."""
    if dim == 0:
        return list(lists) if stacking else [item for each in lists for item in each]
    return [
        join_nested([each[i] for each in lists], dim - 1, stacking) for i in range(len(lists[0]))
    ]


def pick_nested(data: Any, index: tuple) -> Any:
    """``array[index]`` of the nested lists ``data`` for an index of ints and slices
    (lists of its own, the values shared, as after ``take``)."""
    if not index:
        return _copy_nested(data)
    head, rest = index[0], index[1:]
    if type(head) is int:
        return pick_nested(data[head], rest)
    return [pick_nested(item, rest) for item in data[head]]
