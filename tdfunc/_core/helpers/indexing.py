"""Advanced indexing of a container: the index is computed once, then applied to every leaf.

An index with tensors, boolean masks or lists is prepared once per call:

- a boolean mask (of one dim or more) becomes the long tensors of its
  ``nonzero()``: one host synchronisation on CUDA, instead of one per leaf;
- a list or a numpy array becomes a tensor once, instead of once per leaf;
- a single one-dim index at batch dim ``d`` (``td[idx]``, ``td[:, idx]``, a
  one-dim mask) gives the new batch size without reading data; when it comes
  from a mask (so it holds no negative position) each plain tensor takes it
  with ``index_select(d, idx)``, torch's cheapest gather.

Other forms keep torch's own rules (``leaf[index]``): the new batch size is read
from the first indexed leaf, whose result is then kept rather than computed
twice, or, with no tensor leaf at the top level, from a stride-0 stand-in (see
``shapes.index_batch_size``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .fastpath import is_tensor_kind
from .sizes import as_index_tensor, index_batch_size

_FULL = slice(None)
# classes whose ``index_select`` gives what their ``__getitem__`` gives
_SELECTABLE = frozenset({torch.Tensor, torch.nn.Parameter})


class Take:
    """How each tensor leaf is indexed with a prepared advanced index.

    This one applies the index with ``__getitem__``, except to the leaf already
    indexed to learn the new batch size (see :func:`plan`): that result is reused.
    """

    __slots__ = ("result", "source")

    def __init__(self, source: Any = None, result: Any = None) -> None:
        self.source = source
        self.result = result

    def take(self, value: torch.Tensor, index: tuple) -> torch.Tensor:
        if value is self.source:
            self.source = None  # once: a tensor stored twice still gives two results
            return self.result
        return value[index]


class Select(Take):
    """A one-dim long ``index`` at batch dim ``dim``: ``index_select`` for plain tensors."""

    __slots__ = ("dim", "index")

    def __init__(self, dim: int, index: torch.Tensor) -> None:
        super().__init__()
        self.dim = dim
        self.index = index

    def take(self, value: torch.Tensor, index: tuple) -> torch.Tensor:
        if type(value) in _SELECTABLE:
            try:
                return value.index_select(self.dim, self.index)
            except RuntimeError:  # e.g. a leaf on another device than the index
                pass
        return value[index]


def plan(td: Any, index: tuple) -> tuple[tuple, torch.Size, Take]:
    """``(prepared index, new batch size, Take)`` for an advanced ``index`` of ``td``.

    ``index`` has had its ellipsis expanded (it only touches batch dims) and
    holds at least one item other than an int, a slice or None.

    Example:
        >>> td = TensorDict({"a": torch.zeros(3, 2)}, [3])
        >>> index, size, take = plan(td, (torch.tensor([True, False, True]),))
        >>> index, size, type(take).__name__
        ((tensor([0, 2]),), torch.Size([2]), 'Select')
    """
    batch_size = td._batch_size
    index, masks = prepare(index, batch_size)
    select = _select(index)
    if select is not None:
        dim = select.dim
        size = batch_size[:dim] + select.index.shape + batch_size[dim + 1 :]
        # index_select refuses negative positions; a mask's nonzero() has none
        return index, size, select if masks else Take()
    ndim = len(batch_size)
    for value in td._data.values():
        kind = type(value)
        if kind is torch.Tensor or is_tensor_kind[kind]:
            out = value[index]
            return index, out.shape[: out.dim() - (value.dim() - ndim)], Take(value, out)
    return index, index_batch_size(batch_size, index), Take()


def prepare(index: tuple, batch_size: torch.Size) -> tuple[tuple, int]:
    """``index`` with masks as ``nonzero()`` indices and lists as tensors; how many masks.

    ``index`` has had its ellipsis expanded (it only touches batch dims) and
    holds at least one item other than an int, a slice or None. The result
    selects the same elements of every leaf as ``index`` does.

    Example:
        >>> mask = torch.tensor([[True, False], [False, True]])
        >>> prepare((mask,), torch.Size([2, 2]))
        ((tensor([0, 1]), tensor([0, 1])), 1)
    """
    out: list = []
    masks = 0
    dim = 0  # the batch dim the next item applies to
    for item in index:
        if type(item) is list or isinstance(item, (np.ndarray, range)):
            item = as_index_tensor(item)
        if isinstance(item, torch.Tensor):
            if item.dtype is torch.bool and item.dim():
                span = item.dim()
                if tuple(item.shape) != tuple(batch_size[dim : dim + span]):
                    out.append(item)  # a mismatched mask: torch raises its own error
                else:
                    out.extend(item.nonzero(as_tuple=True))
                    masks += 1
                dim += span
                continue
            out.append(item)
            dim += 1 if item.dim() or item.dtype is not torch.bool else 0
        else:
            out.append(item)
            if item is not None and not isinstance(item, (bool, np.bool_)):
                dim += 1
    return tuple(out), masks


def _select(index: tuple) -> Select | None:
    """A ``Select`` when ``index`` is full slices around one one-dim long tensor."""
    found = None
    for position, item in enumerate(index):
        if isinstance(item, torch.Tensor):
            if found is not None or item.dim() != 1 or item.dtype not in (torch.long, torch.int):
                return None
            found = Select(position, item)
        elif type(item) is not slice or item != _FULL:
            return None
    return found
