"""``batched_summary`` of a traced forward that has no submodule (only its own tensors).

Such a forward has no layer to count: the summary says what ran (traced, every op
batched or which op was vmapped), and the outputs equal a loop over the members.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from tdfunc import Ensemble
from tests.ensemble.member_loop import check_against_loop, members


class OwnWeights(nn.Module):
    """A forward of ops on the module's own parameters: nothing but ops to batch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3))
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return torch.tanh(x @ self.weight + self.bias)


class OwnWeightsNormed(OwnWeights):
    """The same, with an op that has no batched rule (``linalg.vector_norm``): with no
    batched op left, the whole forward runs under vmap."""

    def forward(self, x):
        h = x @ self.weight
        return h / torch.linalg.vector_norm(h, dim=-1, keepdim=True)


def test_a_forward_without_submodules_is_not_zero_of_zero_layers():
    models = members(OwnWeights)
    summary = Ensemble(*models).batched_summary
    assert "0/0" not in summary
    assert summary == "no layers; forward traced, every op batched"
    check_against_loop(
        models, lambda i: (torch.randn(5, 4, generator=torch.Generator().manual_seed(1)),)
    )


def test_with_nothing_left_to_batch_the_whole_forward_is_vmapped():
    models = members(OwnWeightsNormed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning is the subject of other tests
        ensemble = Ensemble(*models)
    summary = ensemble.batched_summary
    assert summary.startswith("forward vmapped (") and "op linalg_vector_norm" in summary
    x = torch.randn(5, 4)
    expected = torch.stack([model(x) for model in models])
    torch.testing.assert_close(ensemble(x), expected)
