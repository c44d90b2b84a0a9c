"""Regression tests: an Ensemble never gives a silently wrong answer.

Each case compares against a Python loop over ordinary modules, or checks that
a structurally impossible ensemble is refused with an error naming the difference.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, register_batched


def _members(make, n=3, seed=0):
    torch.manual_seed(seed)
    return [make() for _ in range(n)]


def _loop(models, x):
    return torch.stack([m(x) for m in models])


# ------------------------------------------------------- cache of derived views
@pytest.mark.parametrize("features", [3, 64])  # bmm path and shared-matmul path
def test_unfreezing_after_a_frozen_forward_trains_again(features):
    models = _members(lambda: nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, 2)))
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(64, features)
    ens.requires_grad_(False)
    assert not ens(x).requires_grad
    ens.requires_grad_(True)
    ens(x).sum().backward()
    _loop(models, x).sum().backward()
    for name, p in ens.named_parameters():
        assert p.grad is not None, name
    for key, grad in ens.params.apply(lambda p: p.grad).items(True, True):
        expected = torch.stack([m.get_parameter(".".join(key)).grad for m in models])
        torch.testing.assert_close(grad, expected)


def test_freezing_after_a_forward_gives_outputs_without_grad():
    ens = Ensemble(*_members(lambda: nn.Linear(3, 2)))
    x = torch.randn(5, 3)
    assert ens(x).requires_grad
    ens.requires_grad_(False)
    assert not ens(x).requires_grad
    ens.stacked.weight.requires_grad_(True)  # one leaf unfrozen: its views get a graph again
    out = ens(x)
    assert out.requires_grad
    out.sum().backward()
    assert ens.stacked.weight.grad is not None and ens.stacked.bias.grad is None


def test_replaced_storage_and_in_place_edits_are_seen():
    models = _members(lambda: nn.Linear(4, 3))
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 4)
    ens(x)
    new = torch.randn_like(ens.stacked.weight)
    ens.stacked.weight.data = new.clone()  # same Parameter object, new storage
    for m, w in zip(models, new):
        m.weight.data = w.clone()
    torch.testing.assert_close(ens(x), _loop(models, x))
    with torch.no_grad():
        ens.stacked.weight.mul_(2)
        for m in models:
            m.weight.mul_(2)
    torch.testing.assert_close(ens(x), _loop(models, x))
    torch.nn.utils.vector_to_parameters(
        torch.zeros(sum(p.numel() for p in ens.parameters())), ens.parameters()
    )
    assert ens(x).abs().sum() == 0


# ------------------------------------------------------- structural equality
@pytest.mark.parametrize(
    "first, second, error, names",
    [
        (lambda: nn.Sequential(nn.Linear(3, 4), nn.ReLU()),
         lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh()), TypeError, ["`1`", "ReLU", "Tanh"]),
        (lambda: nn.Sequential(nn.Linear(3, 4), nn.LeakyReLU(0.01)),
         lambda: nn.Sequential(nn.Linear(3, 4), nn.LeakyReLU(0.2)), ValueError,
         ["`1`", "negative_slope", "0.01", "0.2"]),
        (lambda: nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1)),
         lambda: nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5)), ValueError,
         ["`1`", "'p'", "0.1", "0.5"]),
        (lambda: nn.Conv1d(2, 2, 3, stride=1), lambda: nn.Conv1d(2, 2, 3, stride=2), ValueError,
         ["stride", "(1,)", "(2,)"]),
        (lambda: nn.Conv1d(2, 2, 3, dilation=1), lambda: nn.Conv1d(2, 2, 3, dilation=2),
         ValueError, ["dilation"]),
        (lambda: nn.Linear(3, 4), lambda: nn.Linear(3, 4, bias=False), ValueError, ["bias"]),
        (lambda: nn.Sequential(nn.Linear(3, 4)), lambda: nn.Sequential(nn.Linear(3, 4)).eval(),
         ValueError, ["training"]),
        (lambda: nn.Sequential(nn.Linear(3, 4), nn.GELU()),
         lambda: nn.Sequential(nn.Linear(3, 4), nn.GELU("tanh")), ValueError, ["approximate"]),
    ],
)  # fmt: skip
def test_members_that_differ_beyond_their_tensors_are_refused(first, second, error, names):
    with pytest.raises(error, match="member 1 differs from member 0") as info:
        Ensemble(first(), second())
    for name in names:
        assert name in str(info.value)


class _Scaled(nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.scale = torch.tensor(scale)  # a plain tensor attribute, not a buffer
        self.act = torch.tanh

    def forward(self, x):
        return self.act(self.linear(x)) * self.scale


def test_plain_attributes_are_compared_and_equal_members_accepted():
    with pytest.raises(ValueError, match="'scale'"):
        Ensemble(_Scaled(1.0), _Scaled(2.0))
    models = _members(lambda: _Scaled(2.0))
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(4, 3)
    torch.testing.assert_close(ens(x), _loop(models, x))
    Ensemble(nn.GRU(3, 4), nn.GRU(3, 4))  # RNN weight references are per member, not settings


# ------------------------------------------------------- register_batched
class _Shift(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shift = nn.Parameter(torch.randn(2))
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return x + self.shift


def test_register_batched_output_is_checked_against_the_module():
    class DropsMembers(_Shift):
        pass

    class WrongValues(_Shift):
        pass

    class WrongBuffer(_Shift):
        pass

    @register_batched(DropsMembers)
    def drops(module, params, x):
        params["calls"].add_(1)
        return (x + params["shift"].unsqueeze(1)).sum(0)

    @register_batched(WrongValues)
    def wrong(module, params, x):
        params["calls"].add_(1)
        return x + params["shift"].flip(0).unsqueeze(1)

    @register_batched(WrongBuffer)
    def no_count(module, params, x):
        return x + params["shift"].unsqueeze(1)

    x = torch.randn(5, 2)
    with pytest.raises(ValueError, match=r"shape \(5, 2\) for an ensemble of 4 members"):
        Ensemble(*[DropsMembers() for _ in range(4)])(x)
    with pytest.raises(ValueError, match="differs from running the module on member 0"):
        Ensemble(*[WrongValues() for _ in range(4)])(x)
    with pytest.raises(ValueError, match="'calls'"):
        Ensemble(*[WrongBuffer() for _ in range(4)])(x)


def test_register_batched_right_function_and_trusted():
    class Right(_Shift):
        pass

    class Trusted(_Shift):
        pass

    @register_batched(Right)
    def right(module, params, x):
        params["calls"].add_(1)
        return x + params["shift"].unsqueeze(1)

    @register_batched(Trusted, trusted=True)
    def trusted(module, params, x):
        return (x + params["shift"].unsqueeze(1)).sum(0)  # wrong, but not checked

    models = _members(Right, n=4)
    ens = Ensemble(*copy.deepcopy(models))
    for batch in (5, 5, 7):  # a second signature is checked too
        x = torch.randn(batch, 2)
        torch.testing.assert_close(ens(x), _loop(models, x))
    torch.testing.assert_close(ens.params["calls"], torch.full((4,), 3.0))
    assert Ensemble(*[Trusted() for _ in range(4)])(torch.randn(5, 2)).shape == (5, 2)


def test_register_batched_sees_submodule_tensors():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(3, 2)

        def forward(self, x):
            return self.inner(x) * 2

    @register_batched(Block)
    def block(module, params, x):
        w, b = params["inner.weight"], params["inner.bias"]
        return (torch.bmm(x, w.mT) + b.unsqueeze(1)) * 2

    models = _members(Block)
    x = torch.randn(5, 3)
    torch.testing.assert_close(Ensemble(*copy.deepcopy(models))(x), _loop(models, x))


# ------------------------------------------------------- chunk_size
class _Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(64, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).softmax(-1)


_CHUNK_CORPUS = {
    "linear": (lambda: nn.Linear(64, 4), (64, 64)),
    "mlp": (lambda: nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4)), (64, 64)),
    "no_bias": (lambda: nn.Sequential(nn.Linear(64, 16, bias=False), nn.Tanh()), (80, 64)),
    "custom": (_Custom, (64, 64)),
    "conv_norms": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 4, 3, stride=2),
            nn.BatchNorm1d(4),
            nn.GroupNorm(2, 4),
            nn.Flatten(),
            nn.LayerNorm(12),
            nn.Linear(12, 3),
        ),
        (16, 2, 7),
    ),
}


@pytest.mark.parametrize("name", sorted(_CHUNK_CORPUS))
@pytest.mark.parametrize("shared", [True, False])
def test_chunks_split_members_not_rows(name, shared):
    make, shape = _CHUNK_CORPUS[name]
    models = _members(make, n=5)
    ens = Ensemble(*copy.deepcopy(models), in_dims=None if shared else 0)
    chunked = Ensemble(*copy.deepcopy(models), in_dims=None if shared else 0, chunk_size=2)
    x = torch.randn(*shape) if shared else torch.randn(5, *shape)
    out, out_chunked = ens(x), chunked(x)
    reference = _loop(models, x) if shared else torch.stack([m(xi) for m, xi in zip(models, x)])
    torch.testing.assert_close(out_chunked, reference)
    torch.testing.assert_close(out, reference)
    out.square().sum().backward()
    out_chunked.square().sum().backward()
    for (key, p), q in zip(ens.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=key)
    for (key, b), c in zip(ens.named_buffers(), chunked.buffers()):
        torch.testing.assert_close(c, b, msg=key)
    zeros = ens.params.apply(torch.zeros_like)
    assert chunked.functional_call(zeros, x).shape == reference.shape
