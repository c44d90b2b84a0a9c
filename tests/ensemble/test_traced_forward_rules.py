"""A custom forward rewritten for the member-leading layout, against a loop of modules.

Each model reads stacked parameters or per-member values in a way the rewrite
once got wrong without an error: parameters passed by keyword to a pointwise op,
dims given as varargs, an index mixing static rows and per-member actions.
The batch size equals the number of members where that hid a wrong broadcast.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble

MEMBERS = 3


class _Clamp(nn.Module):  # PETS: logvar bounded by learned, per-member bounds
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.low = nn.Parameter(torch.randn(4) * 0.3)
        self.high = nn.Parameter(torch.randn(4) * 0.3 + 1)

    def forward(self, x):
        return self.fc(x).clamp(min=self.low, max=self.high)


class _KeywordOperands(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w, self.t = nn.Parameter(torch.rand(4)), nn.Parameter(torch.randn(4))

    def forward(self, x):
        h = self.fc(x)
        h = torch.lerp(x, h, weight=self.w) + torch.maximum(h, other=self.t)
        return torch.where(h > self.t, h, other=self.t) + torch.add(h, other=self.t, alpha=2)


class _FlipSqueeze(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):  # x: [B, C, 4]
        h = self.fc(x).flip(0, 2)
        return h.unsqueeze(1).unsqueeze(3).squeeze(1, 3)


class _ExpandRepeat(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.context = nn.Parameter(torch.randn(2))

    def forward(self, x):  # x: [B, 4]
        h = self.fc(x)
        h = torch.cat([h, self.context.expand(h.shape[0], -1)], dim=-1)  # [B, 4]
        return h.repeat(2, 1, 1) + h.expand(2, -1, -1)  # new leading dims


class _ActionValue(nn.Module):  # DQN: the value of the action taken
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 5)

    def forward(self, x, action):
        q = self.fc(x)
        return q[torch.arange(q.shape[0]), action]


class _Columns(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 5)

    def forward(self, x, columns):
        return self.fc(x)[:, columns]


def _compare(models, ens, inputs, in_dims):
    out = ens(*inputs, in_dims=in_dims)
    expected = torch.stack(
        [
            model(*[x if d is None else x[k] for x, d in zip(inputs, in_dims)])
            for k, model in enumerate(models)
        ]
    )
    torch.testing.assert_close(out, expected)
    weights = torch.randn(expected.shape)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    for name, _ in models[0].named_parameters():
        grads = torch.stack([m.get_parameter(name).grad for m in models])
        torch.testing.assert_close(ens.get_parameter(f"stacked.{name}").grad, grads)


@pytest.mark.parametrize("make", [_Clamp, _KeywordOperands])
@pytest.mark.parametrize("batch", [(MEMBERS,), (2,), (), (2, MEMBERS)])
def test_stacked_parameters_passed_by_keyword(make, batch):
    torch.manual_seed(0)
    models = [make() for _ in range(MEMBERS)]
    ens = Ensemble(*copy.deepcopy(models))
    _compare(models, ens, (torch.randn(*batch, 4),), (None,))
    _compare(models, ens, (torch.randn(MEMBERS, *batch, 4),), (0,))


def test_expand_and_repeat_adding_leading_dims():
    torch.manual_seed(0)
    models = [_ExpandRepeat() for _ in range(MEMBERS)]
    ens = Ensemble(*copy.deepcopy(models))
    _compare(models, ens, (torch.randn(MEMBERS, 4),), (None,))
    _compare(models, ens, (torch.randn(MEMBERS, MEMBERS, 4),), (0,))


def test_dims_given_as_varargs():
    torch.manual_seed(0)
    models = [_FlipSqueeze() for _ in range(MEMBERS)]
    ens = Ensemble(*copy.deepcopy(models))
    _compare(models, ens, (torch.randn(2, MEMBERS, 4),), (None,))
    _compare(models, ens, (torch.randn(MEMBERS, 2, MEMBERS, 4),), (0,))


@pytest.mark.filterwarnings("ignore::tdfunc.EnsembleFallbackWarning")  # the fallback is the point
@pytest.mark.parametrize("make", [_ActionValue, _Columns])
def test_an_index_mixing_static_and_per_member_values(make):
    torch.manual_seed(0)
    models = [make() for _ in range(MEMBERS)]
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(MEMBERS, 4)
    _compare(models, ens, (x, torch.randint(5, (MEMBERS,))), (None, None))
    _compare(models, ens, (x, torch.randint(5, (MEMBERS, MEMBERS))), (None, 0))
    _compare(
        models, ens, (torch.randn(MEMBERS, MEMBERS, 4), torch.randint(5, (MEMBERS,))), (0, None)
    )
