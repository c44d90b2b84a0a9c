"""Built-in batched layers against a loop over the member modules (``member_loop``)."""

from __future__ import annotations

import pytest
import torch
from member_loop import MEMBERS, check_against_loop, members
from torch import nn

from tdfunc import Ensemble


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(3, 8), (2, 5, 8), (8,)])
def test_rms_norm(affine, shape):
    # without an affine weight the layer has no tensors: a Linear in front tells the members apart
    models = members(
        lambda: nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8, elementwise_affine=affine))
    )
    for model in models:  # weights other than ones, so that each member differs
        if affine:
            nn.init.normal_(model[1].weight)
    x = torch.randn(*shape, requires_grad=True)
    check_against_loop(models, lambda i: (x,))


def test_rms_norm_over_two_dims():
    models = members(lambda: nn.RMSNorm((4, 6), eps=1e-3))
    for model in models:
        nn.init.normal_(model.weight)
    x = torch.randn(3, 4, 6)
    check_against_loop(models, lambda i: (x,))


@pytest.mark.parametrize("parameters", [1, 4])
@pytest.mark.parametrize("shape", [(3, 4), (3, 4, 5), (2, 4, 3, 3)])
def test_prelu(parameters, shape):
    models = members(lambda: nn.PReLU(parameters))
    for model in models:
        nn.init.uniform_(model.weight, -1, 1)
    x = torch.randn(*shape)
    x[0, 0] = 0.0  # the kink: torch's slope applies below 0 only
    check_against_loop(models, lambda i: (x,))


def test_prelu_one_dim_input_and_channel_mismatch():
    models = members(lambda: nn.PReLU())
    check_against_loop(models, lambda i: (torch.ones(5) * torch.arange(-2.0, 3.0),))
    ensemble = Ensemble(*members(lambda: nn.PReLU(4)))
    with pytest.raises(RuntimeError, match="parameter numbers = 4 and channel size = 3"):
        ensemble(torch.randn(2, 3))
    with pytest.raises(RuntimeError, match="channel size = 1"):
        ensemble(torch.randn(4))


@pytest.mark.parametrize("shape", [(5, 4), (2, 5, 4)])
@pytest.mark.parametrize("in_dims", [None, 0])
def test_linear_chains_with_and_without_bias(shape, in_dims):
    # a chain runs a Linear's member-leading rank-3 case inline, the rest through the step
    def make():
        return nn.Sequential(
            nn.Linear(4, 6, bias=False), nn.Tanh(), nn.Linear(6, 6), nn.Linear(6, 3, bias=False)
        )

    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(*shape, generator=generator) for _ in range(MEMBERS)]
    check_against_loop(members(make), lambda i: (inputs[0 if i is None else i],), in_dims=in_dims)
