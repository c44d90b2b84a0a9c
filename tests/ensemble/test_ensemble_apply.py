"""``Ensemble.apply`` reaches the members' layers, as ``model.apply`` on a list of models."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 2)
    )


def _init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.xavier_normal_(module.weight)
        nn.init.uniform_(module.bias, -0.5, 0.5)
    if isinstance(module, nn.BatchNorm1d):
        module.running_mean.fill_(0.25)
    if isinstance(module, nn.Dropout):
        module.p = 0.0


def test_apply_initialises_every_member_as_a_loop_does():
    torch.manual_seed(0)
    models = [_model() for _ in range(3)]
    ensemble = Ensemble(*copy.deepcopy(models))
    parameters = list(ensemble.parameters())
    torch.manual_seed(1)
    for model in models:
        model.apply(_init)
    next_after_loop = torch.rand(1)
    torch.manual_seed(1)
    assert ensemble.apply(_init) is ensemble
    assert torch.equal(torch.rand(1), next_after_loop)  # the same random numbers were drawn
    assert list(ensemble.parameters()) == parameters  # loaded in place
    for index, model in enumerate(models):
        for key, value in model.state_dict().items():
            torch.testing.assert_close(ensemble.member_state_dicts()[index][key], value)
    # the template's dropout took p = 0 too: training-mode outputs are deterministic
    x = torch.randn(6, 4)
    torch.testing.assert_close(ensemble(x), torch.stack([model(x) for model in models]))


def test_apply_runs_fn_on_each_member_the_template_and_the_ensemble_last():
    seen = []
    ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(2)])
    ensemble.apply(lambda module: seen.append(type(module).__name__))
    assert seen[-1] == "Ensemble"
    assert seen.count("Linear") == 3  # two members, then the template


def test_apply_that_adds_a_parameter_is_refused():
    ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(2)])

    def grow(module):
        if isinstance(module, nn.Linear):
            module.extra = nn.Parameter(torch.zeros(1))

    with pytest.raises((KeyError, RuntimeError, ValueError)):
        ensemble.apply(grow)
