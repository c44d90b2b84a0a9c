"""Element-wise membership, deduplication and grouping of a container by the value of one
entry (``tdfunc.utils.isin`` / ``remove_duplicates``, ``group_by``), and ``assert_close``
of two containers.

The entry at ``key`` is cut into slices along a batch dim; two elements are equal when
their slices are.

Example:
    >>> td = TensorDict(x=torch.tensor([7, 1, 7, 3]), batch_size=[4])
    >>> isin(td, TensorDict(x=torch.tensor([3, 7]), batch_size=[2]), "x").tolist()
    [True, False, True, True]
    >>> remove_duplicates(td, "x")["x"].tolist()
    [1, 3, 7]
"""

from __future__ import annotations

from typing import Any

import torch

from .mixin import is_tensor_collection_or_class
from .predicates import is_leaf_nontensor


def _tensor_at(td: Any, key: Any, api: str, which: str) -> torch.Tensor:
    value = td.get(key)
    if not isinstance(value, torch.Tensor):
        raise KeyError(
            f"{api}: the {which} has no tensor at key {key!r} (got {type(value).__name__})."
        )
    return value


def _batch_dim(td: Any, dim: int, api: str) -> int:
    ndim = td.batch_dims
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(
            f"{api}: dim must be a batch dim of the batch size {list(td.batch_size)}, got {dim!r}."
        )
    return dim % ndim


def isin(input: Any, reference: Any, key: Any, dim: int = 0) -> torch.Tensor:
    """Which elements of ``input`` along the batch dim ``dim`` have their ``key`` value
    among the elements of ``reference`` (a bool tensor of ``input.batch_size[dim]``)."""
    target = _tensor_at(input, key, "isin", "input")
    values = _tensor_at(reference, key, "isin", "reference")
    if input.batch_dims != reference.batch_dims:
        raise ValueError(
            f"isin: the input and the reference must have as many batch dims, got "
            f"{list(input.batch_size)} and {list(reference.batch_size)}."
        )
    dim = _batch_dim(input, dim, "isin")
    both = torch.cat([values, target], dim=dim)
    _, group = torch.unique(both, dim=dim, return_inverse=True)
    count = values.shape[dim]
    return torch.isin(group[count:], group[:count])


def remove_duplicates(input: Any, key: Any, dim: int = 0, *, return_indices: bool = False):
    """``input`` keeping, along the batch dim ``dim``, the first element of each group of
    equal ``key`` values, ordered by that value; with ``return_indices``, also each input
    element's position in the result."""
    values = _tensor_at(input, key, "remove_duplicates", "input")
    dim = _batch_dim(input, dim, "remove_duplicates")
    _, group = torch.unique(values, dim=dim, return_inverse=True)
    positions = torch.arange(group.numel(), device=group.device)
    # the first position of each group: the smallest position among its members
    first = torch.full((int(group.max()) + 1 if group.numel() else 0,), group.numel())
    first = first.to(group.device).scatter_reduce(0, group, positions, reduce="amin")
    output = input[(slice(None),) * dim + (first,)]
    return (output, group) if return_indices else output


def assert_close(
    actual: Any,
    expected: Any,
    rtol: float | None = None,
    atol: float | None = None,
    equal_nan: bool = True,
    intersection: bool = False,
    msg: str = "",
) -> bool:
    """Check that two containers have the same keys and close tensors (``torch.testing.
    assert_close`` per leaf, dtypes, shapes and devices included); non-tensor data is not
    compared. ``intersection=True`` compares the keys both have. Returns True."""
    for side in (actual, expected):
        if not is_tensor_collection_or_class(type(side)):
            raise TypeError(
                f"assert_close: expected TensorDicts or TensorClass instances, got "
                f"{type(actual).__name__} and {type(expected).__name__}."
            )
    # the keys of non-tensor entries count, their values are not compared
    left = dict(actual.items(True, True, is_leaf=is_leaf_nontensor))
    right = dict(expected.items(True, True, is_leaf=is_leaf_nontensor))
    if not intersection and left.keys() != right.keys():
        only_left = sorted(left.keys() - right.keys(), key=str)
        only_right = sorted(right.keys() - left.keys(), key=str)
        raise KeyError(
            f"assert_close: the keys differ: only in actual {only_left}, only in expected "
            f"{only_right}. {msg}".rstrip()
        )
    for key in left.keys() & right.keys():
        a, b = left[key], right[key]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        try:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan)
        except AssertionError as error:
            error_size = (a.double() - b.double()).pow(2).mean().sqrt().item()
            raise AssertionError(
                f"assert_close: key {key!r} does not match (root mean squared error "
                f"{error_size:.4g}). {msg}\n{error}".replace(" \n", "\n")
            ) from None
    return True


_ABSENT = object()


def group_by(tensordict: Any, key: Any) -> tuple[Any, tuple]:
    """Split a container into groups of the rows (along its first batch dim) that share
    the value of the entry ``key``.

    ``groups[i]`` holds the rows whose entry equals ``values[i]``, in their original
    order. An entry with more than one value per row is compared row by row (as
    ``torch.unique(..., dim=0)``). A non-tensor entry groups by its Python values, which
    must be hashable and sortable (lists are compared as tuples). The rows are gathered
    once and the groups are views of the gathered container; the group sizes are read on
    the host, so this is for eager code, not compiled code.

    Returns:
        ``(values, groups)``: the sorted distinct values (a tensor for a tensor entry, a
        list for a non-tensor entry) and a tuple of containers of ``tensordict``'s class,
        one per value.

    Example:
        >>> td = TensorDict(uid=torch.tensor([2, 0, 2, 1]), r=torch.arange(4.0), batch_size=[4])
        >>> values, groups = group_by(td, "uid")
        >>> values.tolist(), [group["r"].tolist() for group in groups]
        ([0, 1, 2], [[1.0], [3.0], [0.0, 2.0]])
    """
    api = "tdfunc.group_by"
    if not is_tensor_collection_or_class(type(tensordict)) or isinstance(tensordict, type):
        raise TypeError(
            f"{api}: expected a TensorDict or a TensorClass instance, got "
            f"{type(tensordict).__name__}."
        )
    if not tensordict.batch_dims:
        raise ValueError(
            f"{api}: the rows are taken along the first batch dim, and the container has "
            f"none (batch size {list(tensordict.batch_size)})."
        )
    value = tensordict.get(key, _ABSENT)
    if value is _ABSENT or value is None:
        raise KeyError(f"{api}: the container has no entry {key!r}.")
    if is_tensor_collection_or_class(type(value)) and not is_leaf_nontensor(type(value)):
        raise TypeError(
            f"{api}: the entry {key!r} is a {type(value).__name__}; group by a tensor or a "
            f"non-tensor entry."
        )
    if isinstance(value, torch.Tensor):
        # dim=0 only where a row holds several values: with dim=0, torch.unique does not
        # sort a 1-d tensor that holds NaN
        by_row = {"dim": 0} if value.ndim > 1 else {}
        values, inverse, counts = torch.unique(
            value, sorted=True, return_inverse=True, return_counts=True, **by_row
        )
        sizes = counts.tolist()
    else:
        values, inverse, sizes = _group_values(tensordict, key, api)
    if not sizes:
        return values, ()
    order = torch.argsort(inverse, stable=True)
    return values, tuple(tensordict[order].split(sizes, 0))


def _group_values(tensordict: Any, key: Any, api: str) -> tuple[list, torch.Tensor, list]:
    rows = [_hashable(row) for row in _row_values(tensordict, key)]
    try:
        distinct = sorted(set(rows))
    except TypeError:
        raise TypeError(
            f"{api}: the values of the non-tensor entry {key!r} must be hashable and "
            f"sortable (one type of value, such as str or int)."
        ) from None
    where = {row: i for i, row in enumerate(distinct)}
    inverse = torch.tensor([where[row] for row in rows], dtype=torch.long)
    sizes = torch.bincount(inverse, minlength=len(distinct)).tolist() if rows else []
    return distinct, inverse, sizes


def _row_values(tensordict: Any, key: Any) -> list:
    """One Python value per row of the non-tensor entry ``key``."""
    # tolist() of a non-tensor leaf is shaped like its batch, as a tensor's is
    return tensordict.get(key).tolist()


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value
