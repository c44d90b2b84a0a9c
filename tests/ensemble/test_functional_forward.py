"""``torch.nn.functional`` calls in a custom ``forward``: batched, equal to a loop of members."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from member_loop import MEMBERS, check_against_loop, members
from torch import nn

from tdfunc import Ensemble


class Convolutions(nn.Module):
    """Stacked weights through F.conv2d and F.conv_transpose2d, a shared (constant)
    kernel through F.conv1d."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 1, 3, 3))  # groups=2 over 2 channels
        self.bias = nn.Parameter(torch.randn(4))
        self.up = nn.Parameter(torch.randn(4, 2, 2, 2))
        self.smooth = torch.tensor([[[0.25, 0.5, 0.25]]]).repeat(2, 1, 1)  # not a buffer

    def forward(self, x):  # [B, 2, 5, 5]
        h = F.relu(F.conv2d(x, self.weight, self.bias, stride=1, padding=1, groups=2))
        h = F.conv_transpose2d(h, self.up, None, 2, 1, 1)  # stride 2, padding 1, output 1
        flat = h.flatten(2)  # [B, 2, L]
        return F.conv1d(flat, self.smooth, padding=1, groups=2)


class UnbatchedConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 2, 2))

    def forward(self, x):  # one [2, L] sample
        return F.conv1d(x, self.weight)


class Norms(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.gain = nn.Parameter(torch.rand(6) + 0.5)
        self.shift = nn.Parameter(torch.randn(6))
        self.scale = nn.Parameter(torch.rand(2, 3) + 0.5)

    def forward(self, x):
        h = self.fc(x)
        a = F.layer_norm(h, (6,), self.gain, self.shift, 1e-4)
        b = F.layer_norm(h, [6])  # no affine tensors
        c = F.rms_norm(h.unflatten(-1, (2, 3)), (2, 3), self.scale).flatten(-2)
        d = F.layer_norm(h, (6,), weight=self.gain)
        return a + b * c - d


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(7, 3))
        self.fixed = torch.linspace(-1, 1, 3)  # a constant weight for F.linear

    def forward(self, tokens):
        rows = F.embedding(tokens, self.table, padding_idx=-1)
        return F.linear(rows, self.fixed.expand(2, 3), torch.ones(2))


class Losses(nn.Module):
    def __init__(self, reduction: str) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.reduction = reduction

    def forward(self, x, target, labels):
        logits = self.fc(x)
        r = self.reduction
        parts = [
            F.mse_loss(logits, target, reduction=r),
            F.smooth_l1_loss(logits, target, reduction=r, beta=0.5),
            F.binary_cross_entropy_with_logits(
                logits, target.sigmoid(), reduction=r, pos_weight=torch.tensor([1.0, 2.0, 3.0])
            ),
        ]
        if r != "mean":
            parts.append(F.cross_entropy(logits, labels, reduction=r, label_smoothing=0.1))
            parts.append(F.nll_loss(F.log_softmax(logits, -1), labels, reduction=r))
        return tuple(parts)


def _inputs(*makers):
    torch.manual_seed(3)
    shared = tuple(make() for make in makers)
    per_member = [tuple(make() for make in makers) for _ in range(MEMBERS)]
    return lambda i: shared if i is None else per_member[i]


CASES = {
    "convolutions": (Convolutions, _inputs(lambda: torch.randn(3, 2, 5, 5))),
    "unbatched_conv": (UnbatchedConv, _inputs(lambda: torch.randn(2, 6))),
    "norms": (Norms, _inputs(lambda: torch.randn(5, 4))),
    "lookup": (Lookup, _inputs(lambda: torch.randint(0, 7, (4, 5)))),
    **{
        f"losses_{r}": (
            lambda r=r: Losses(r),
            _inputs(
                lambda: torch.randn(5, 4),
                lambda: torch.randn(5, 3),
                lambda: torch.randint(0, 3, (5,)),
            ),
        )
        for r in ("none", "sum", "mean")
    },
}


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_member"])
@pytest.mark.parametrize("name", list(CASES))
def test_functional_calls_match_loop(name, shared):
    make, args_for = CASES[name]

    def with_grad(i):
        return tuple(
            a.clone().requires_grad_() if a.is_floating_point() else a for a in args_for(i)
        )

    check_against_loop(members(make), with_grad, in_dims=None if shared else 0)


class Noisy(nn.Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 64)
        self.p = p

    def forward(self, x):
        return F.dropout(self.fc(x), self.p, self.training)


def test_dropout_is_batched_and_equal_to_the_loop_in_eval():
    models = [m.eval() for m in members(Noisy)]
    x = torch.randn(3, 4)
    check_against_loop(models, lambda i: (x,))


def test_dropout_draws_a_mask_per_member_and_follows_randomness():
    models = members(lambda: Noisy(0.5))
    x = torch.randn(200, 4)
    ensemble = Ensemble(*copy.deepcopy(models))
    assert "vmapped" not in ensemble.batched_summary
    clean = torch.stack([m(x) for m in copy.deepcopy(models)]).detach()  # p applies in train
    with torch.no_grad():
        reference = torch.stack([F.linear(x, m.fc.weight, m.fc.bias) for m in models])
        out = ensemble(x)
    kept = out != 0
    assert 0.4 < kept.float().mean() < 0.6
    torch.testing.assert_close(out[kept], (reference * 2)[kept])  # survivors scaled by 1/(1-p)
    assert not torch.equal(kept[0], kept[1]), "each member draws its own mask"
    del clean
    ensemble.randomness = "same"
    with torch.no_grad():
        kept = ensemble(x) != 0
    assert torch.equal(kept[0], kept[1]) and torch.equal(kept[1], kept[2])
    ensemble.randomness = "error"
    with pytest.raises(RuntimeError, match="randomness='error'"):
        ensemble(x)


def test_unsupported_configurations_fall_back_to_vmap_exactly():
    class Renormed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(torch.randn(5, 2))
            self.fc = nn.Linear(4, 3)

        def forward(self, tokens, x):
            rows = F.embedding(tokens, self.table, max_norm=1.0)
            return rows.sum(-1), F.cross_entropy(self.fc(x), tokens[:2] % 3)  # reduction="mean"

    models = members(Renormed)
    ensemble = Ensemble(*copy.deepcopy(models))
    vmapped = {row.module for row in ensemble.explain().fallbacks}
    assert vmapped == {"op embedding", "op cross_entropy"}
    tokens, x = torch.tensor([0, 4, 4, 1]), torch.randn(2, 4)
    expected = [torch.stack(parts) for parts in zip(*(m(tokens, x) for m in models))]
    for got, want in zip(ensemble(tokens, x), expected):
        torch.testing.assert_close(got, want)


def test_convolutions_of_an_empty_batch():
    models = members(Convolutions)
    x = torch.randn(0, 2, 5, 5)
    expected = torch.stack([m(x) for m in models])
    torch.testing.assert_close(Ensemble(*copy.deepcopy(models))(x), expected)


class InPlaceNoise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 64)

    def forward(self, x):
        h = self.fc(x)
        F.dropout(h, 0.5, self.training, inplace=True)
        return h  # the caller reads the input that dropout wrote


def test_in_place_dropout_writes_its_input():
    ensemble = Ensemble(*members(InPlaceNoise))
    assert "dropout" in {row.module.removeprefix("op ") for row in ensemble.explain().fallbacks}
    with torch.no_grad():
        out = ensemble(torch.randn(50, 4))
    assert 0.3 < (out == 0).float().mean() < 0.7


class ByKeyword(nn.Module):
    """Every functional call with its tensors by keyword, and convolutions with
    string padding and dilation."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 2, 3, 3))
        self.bias = nn.Parameter(torch.randn(4))
        self.gain = nn.Parameter(torch.rand(4) + 0.5)

    def forward(self, x, target):
        same = F.conv2d(x, self.weight, self.bias, padding="same", dilation=2)
        strided = F.conv2d(input=x, weight=self.weight, bias=None, stride=2)
        pooled = same.mean((-1, -2)) + strided.amax((-1, -2))
        normed = F.layer_norm(input=pooled, normalized_shape=(4,), weight=self.gain)
        dropped = F.dropout(input=normed, p=0.3, training=False)
        return F.mse_loss(input=dropped, target=target, reduction="none")


def test_functional_calls_by_keyword_are_batched():
    args = (torch.randn(3, 2, 6, 6), torch.randn(3, 4))
    check_against_loop(members(ByKeyword), lambda i: args)
