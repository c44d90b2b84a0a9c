"""The ``dim`` argument of reductions and batch-dim ops, read as torch reads it.

An int or a sequence of ints counts batch dims (negative from the end of the batch
dims); ``NO_DIM`` stands for an argument not given. Ops along one dim (``max``,
``cumsum``, ``gather``...) take an int or a sequence holding one int.

Example:
    >>> td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
    >>> batch_dims(td, (-1, 0), "sum"), one_batch_dim(td, [-1], "cumsum")
    ((0, 1), 1)
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from .sizes import normalize_dim


class _NoDim(enum.Enum):
    """The type of ``NO_DIM``: an enum member, a constant that torch.compile can trace."""

    NO_DIM = "NO_DIM"

    def __repr__(self) -> str:
        return "NO_DIM"


NO_DIM: Any = _NoDim.NO_DIM


def batch_dims(self: Any, dim: Any, api: str) -> tuple:
    """``dim`` (an int or a sequence of ints) as sorted non-negative batch dims."""
    ndim = len(self._batch_size)
    if type(dim) is int and -ndim <= dim < ndim:  # fast path
        return (dim % ndim,)
    dims = (dim,) if isinstance(dim, int) else dim
    if not isinstance(dims, (tuple, list, torch.Size)) or not all(
        isinstance(d, int) and type(d) is not bool
        for d in dims  # torch refuses a bool dim
    ):
        raise TypeError(
            f"TensorDict.{api}: dim must be an int, a tuple of ints or 'feature', got {dim!r}."
        )
    out = sorted(normalize_dim(d, ndim, f"TensorDict.{api}") for d in dims)
    if len(set(out)) != len(out):  # torch refuses a dim given twice, so do we
        raise ValueError(
            f"TensorDict.{api}: dim {dim!r} names the same batch dim more than once "
            f"(batch of {ndim} dim(s)); give each dim once."
        )
    return tuple(out)


def one_batch_dim(self: Any, dim: Any, api: str) -> int:
    """``dim`` (an int, or a sequence holding one int) as a non-negative batch dim."""
    (d,) = batch_dims(self, single_dim(dim, api), api)
    return d


def single_dim(dim: Any, api: str) -> int:
    """``dim``, an int or a sequence holding one int, as an int."""
    if isinstance(dim, (tuple, list, torch.Size)) and len(dim) == 1:
        dim = dim[0]
    if type(dim) is not int and not isinstance(dim, int):
        raise TypeError(
            f"TensorDict.{api}: dim must be a single int (torch.{api} works along one dim), "
            f"got {dim!r}. Call it once per dim"
            + (", or use amax/amin for the values over several dims." if api in _PAIRS else ".")
        )
    return dim


_PAIRS = ("max", "min")
