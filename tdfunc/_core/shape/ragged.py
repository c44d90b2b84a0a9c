"""Ragged batch dims: nested tensors whose components differ in length along a batch dim.

A batch size may hold ``-1`` at such a dim (``[2, 3, -1]`` for a nested tensor of two
components of shapes ``(3, 4, 5)`` and ``(3, 6, 5)``): the dim exists, its length is
not one number. Operations that keep every leaf's shape (arithmetic, ``clone``, ``to``,
``apply``, key access) work as usual; indexing or unbinding the outer dim gives dense
leaves and a dense batch size; an operation along a ragged dim is a clear error.
``to_padded_tensor`` gives the dense batch.

Example:
    >>> nt = torch.nested.nested_tensor([torch.ones(4, 5), torch.ones(6, 5)], layout=torch.jagged)
    >>> td = TensorDict({"x": nt}, batch_size=[2, -1])
    >>> td.batch_size, td[1].batch_size, td.to_padded_tensor().batch_size
    (torch.Size([2, -1]), torch.Size([6]), torch.Size([2, 6]))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..helpers.mixin import ContainerMixin, is_tensor_collection
from ..helpers.nontensor import NonTensorData, NonTensorStack
from ..helpers.rewrap import rewrap

if TYPE_CHECKING:
    from typing_extensions import Self
from ..helpers.reshape import _level_sizes


def _pad_level(view: Any, padding: float, masks: list, api: str) -> Any:
    """A padded copy of one level (its nested levels first: they may fix its lengths)."""
    size = view._batch_size
    data: dict = {}
    for key, value in view._data.items():
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                data[key] = torch.nested.to_padded_tensor(value, padding)
                valid = torch.ones_like(value, dtype=torch.bool)
                masks.append((key, torch.nested.to_padded_tensor(valid, False)))
            else:
                data[key] = value
        elif is_tensor_collection(value) and not isinstance(value, NonTensorData):
            sub = _pad_level(value._to_tensordict_view(), padding, masks, api)
            data[key] = rewrap(value, sub)
        else:
            data[key] = value
    new = list(size)
    for dim, length in enumerate(size):
        if length != -1:
            continue
        seen = _level_sizes(data, dim)
        if len(seen) != 1:
            raise ValueError(
                f"{api}: the ragged batch dim {dim} of {list(size)} "
                + (
                    "holds no nested tensor that gives its padded length."
                    if not seen
                    else f"gets different padded lengths {sorted(seen)} from its entries."
                )
            )
        new[dim] = seen.pop()
    new_size = torch.Size(new)
    if new_size != size:
        for key, value in data.items():
            if type(value) is NonTensorData:  # one value for every element
                data[key] = NonTensorData._make(value.data, new_size, value.device)
            elif isinstance(value, NonTensorStack):
                raise ValueError(
                    f"{api}: the NonTensorStack at {key!r} cannot follow the padding of a "
                    f"ragged batch dim."
                )
    return view._like(data, new_size, view._names)


def _batch_mask(masks: list, ndim: int, api: str) -> torch.Tensor:
    """Where the batch elements are real (not padding), agreed by every nested leaf."""
    out = None
    for key, valid in masks:
        if valid.dim() > ndim:  # an element is real where any of its entries is
            valid = valid.flatten(ndim).any(-1)
        if out is None:
            out = valid
        elif out.shape != valid.shape or not torch.equal(out, valid):
            raise ValueError(
                f"{api}: the nested tensors disagree on the lengths of the ragged batch "
                f"dims (at {key!r}); every entry must have the same components' lengths."
            )
    assert out is not None
    return out


class RaggedMixin(ContainerMixin):
    """``to_padded_tensor``: a dense batch from nested-tensor entries."""

    __slots__ = ()

    def to_padded_tensor(self, padding: float = 0.0, mask_key: Any = None) -> Self:
        """Pad every nested tensor (``torch.nested.to_padded_tensor``); ragged batch dims
        (``-1``) take the padded length.

        Args:
            padding: the value of the padded positions.
            mask_key: if given, a bool entry of the new batch shape is written there,
                ``True`` where an element is real and ``False`` where it is padding.
                It needs a ragged batch dim (else there is no padding in the batch).

        Example:
            >>> parts = [torch.ones(1, 2), torch.ones(3, 2)]
            >>> nt = torch.nested.nested_tensor(parts, layout=torch.jagged)
            >>> td = TensorDict({"x": nt}, batch_size=[2, -1])
            >>> out = td.to_padded_tensor(padding=0.0, mask_key="mask")
            >>> out.batch_size, out["mask"].tolist()
            (torch.Size([2, 3]), [[True, False, False], [True, True, True]])
        """
        api = f"{type(self).__name__}.to_padded_tensor"
        view = self._to_tensordict_view()
        ragged = -1 in view._batch_size
        if mask_key is not None and not ragged:
            raise RuntimeError(
                f"{api}: mask_key should only be provided if the heterogeneous (ragged) "
                f"dimension is part of the batch-size; the batch size "
                f"{list(view._batch_size)} has no -1."
            )
        masks: list = []
        padded = _pad_level(view, padding, masks, api)
        if ragged and masks:
            mask = _batch_mask(masks, len(view._batch_size), api)
            if mask_key is not None:
                padded.set(mask_key, mask)
        return rewrap(self, padded)
