"""``where`` picks a non-tensor field's values element by element, as it does a tensor's."""

from __future__ import annotations

import torch

from tdfunc import TensorClass


class Item(TensorClass):
    x: torch.Tensor
    label: str


def test_where_picks_non_tensor_values_by_the_mask():
    a = Item(torch.zeros(2, 3), "a", batch_size=[2, 3])
    b = Item(torch.ones(2, 3), "b", batch_size=[2, 3])
    for mask in (torch.tensor([True, False]), torch.tensor([[True, False, True]] * 2)):
        full = mask.reshape(mask.shape + (1,) * (2 - mask.dim())).expand(2, 3)
        expected = [["a" if m else "b" for m in row] for row in full.tolist()]
        for out in (torch.where(mask, a, b), a.where(mask, b)):
            assert type(out) is Item
            assert torch.equal(out.x, torch.where(full, a.x, b.x))
            assert out.label == expected
            assert [[out[i, j].label for j in range(3)] for i in range(2)] == expected


def test_where_of_equal_values_keeps_one_value():
    a = Item(torch.zeros(2), "same", batch_size=[2])
    b = Item(torch.ones(2), "same", batch_size=[2])
    assert torch.where(torch.tensor([True, False]), a, b).label == "same"
