"""Regression tests: cases where an Ensemble once gave a wrong answer without an error.

Each compares with a loop over ordinary modules (the members run one by one).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble


def test_embedding_scale_grad_by_freq_counts_per_member():
    torch.manual_seed(0)
    models = [nn.Embedding(6, 3, scale_grad_by_freq=True) for _ in range(3)]
    ens = Ensemble(*copy.deepcopy(models))
    shared = torch.tensor([[1, 1, 1, 2], [0, 2, 2, 5]])
    per_member = torch.tensor([[1, 1, 4], [3, 3, 3], [0, 1, 0]])
    ens(shared).square().sum().backward()
    ens(per_member, in_dims=0).square().sum().backward()
    for model, indices in zip(models, per_member):
        model(shared).square().sum().backward()
        model(indices).square().sum().backward()
    expected = torch.stack([m.weight.grad for m in models])
    torch.testing.assert_close(ens.stacked.weight.grad, expected)


@pytest.mark.parametrize("bad", [6, -1])
@pytest.mark.parametrize("member", [0, 1, 2])
def test_embedding_index_out_of_range_fails_like_the_member(bad, member):
    # the members' tables are merged: a bad index must not read a neighbour's row
    ens = Ensemble(*[nn.Embedding(6, 3) for _ in range(3)])
    indices = torch.zeros(3, 2, dtype=torch.long)
    indices[member, 1] = bad
    with pytest.raises(IndexError):
        nn.Embedding(6, 3)(indices[member])
    with pytest.raises(IndexError):
        ens(indices, in_dims=0)
    with pytest.raises(IndexError):
        ens(indices[member])
