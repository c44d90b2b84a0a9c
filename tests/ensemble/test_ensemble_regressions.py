"""Regression tests: cases where an Ensemble once gave a wrong answer without an error.

Each compares with a loop over ordinary modules (the members run one by one).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, TensorClass, TensorDict


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


def _bn_model(momentum=0.1):
    return nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5, momentum=momentum), nn.Linear(5, 2))


class _Untraceable(nn.Module):
    """Python control flow that torch.fx cannot trace: the whole forward runs under vmap."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(3, 5), nn.BatchNorm1d(5)

    def forward(self, x):
        h = self.bn(self.fc(x))
        return h if x.dim() > 0 else -h


def _buffers(ens, models):
    for key, value in ens.state_dict().items():
        expected = torch.stack([m.state_dict()[key[len("stacked.") :]] for m in models])
        torch.testing.assert_close(value, expected, msg=lambda detail, key=key: f"{key}: {detail}")


@pytest.mark.filterwarnings("ignore::tdfunc.EnsembleFallbackWarning")  # the fallback is the point
@pytest.mark.parametrize("make", [_bn_model, _Untraceable])
@pytest.mark.parametrize(
    "index",
    [[0, 2], [3, 1], torch.tensor([1, 3]), torch.tensor([True, False, True, True]),
     slice(0, 4, 2), slice(None, None, -1), slice(1, 3), 2, -1],
)  # fmt: skip
def test_selection_in_training_updates_the_selected_running_stats(make, index):
    torch.manual_seed(0)
    models = [make() for _ in range(4)]
    ens = Ensemble(*copy.deepcopy(models))
    chosen = list(range(4))
    if isinstance(index, slice):
        chosen = chosen[index]
    elif isinstance(index, int):
        chosen = [chosen[index]]
    elif isinstance(index, torch.Tensor) and index.dtype == torch.bool:
        chosen = index.nonzero().flatten().tolist()
    else:
        chosen = [int(i) for i in index]
    for _ in range(2):
        x = torch.randn(6, 3)
        out = ens[index](x)
        expected = torch.stack([models[k](x) for k in chosen])
        torch.testing.assert_close(out, expected[0] if isinstance(index, int) else expected)
        _buffers(ens, models)
    ens.eval()
    for m in models:
        m.eval()
    x = torch.randn(6, 3)
    torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))


def test_selection_repeating_a_member_refuses_to_update_running_stats():
    ens = Ensemble(_bn_model(), num_members=3)
    before = copy.deepcopy(ens.state_dict())
    with pytest.raises(ValueError, match="repeats"):
        ens[[0, 0, 2]](torch.randn(6, 3))
    for key, value in ens.state_dict().items():  # nothing half written
        assert torch.equal(value, before[key]), key
    ens.eval()  # no update: repeating is fine
    x = torch.randn(6, 3)
    torch.testing.assert_close(ens[[0, 0, 2]](x), ens(x)[[0, 0, 2]])


def test_cumulative_batch_norm_with_members_that_saw_different_batch_counts():
    torch.manual_seed(0)
    models = [_bn_model(momentum=None) for _ in range(3)]
    for _ in range(4):  # member 0 has seen more batches
        models[0](torch.randn(6, 3))
    ens = Ensemble(*copy.deepcopy(models))
    for _ in range(2):
        x = torch.randn(6, 3)
        torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))
        _buffers(ens, models)
    x = torch.randn(6, 3)  # a selection makes the counts differ too
    ens[1:2](x)
    models[1](x)
    x = torch.randn(3, 6, 3)
    torch.testing.assert_close(ens(x, in_dims=0), torch.stack([m(xi) for m, xi in zip(models, x)]))
    _buffers(ens, models)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_selection_in_training_under_no_grad_and_inference_mode(mode):
    torch.manual_seed(0)
    models = [_bn_model() for _ in range(4)]
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 3)
    with mode():
        out = ens[[3, 1]](x)
        expected = torch.stack([models[3](x), models[1](x)])
    torch.testing.assert_close(out, expected)
    _buffers(ens, models)


class _Gate(nn.Module):
    """Reads self.training in traced code: p=1 drops everything in training."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.dropout(self.fc(x), 1.0, self.training) + x


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.out = _Gate(), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.gate(x))


@pytest.mark.parametrize("top, inner", [(True, False), (False, True)])
def test_a_submodule_built_in_another_mode_follows_train_and_eval(top, inner):
    torch.manual_seed(0)
    models = [_Outer() for _ in range(3)]
    for m in models:
        m.train(top)
        m.gate.train(inner)
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 4)
    for mode in (top, not top, top, not top):
        ens.train(mode)
        for m in models:
            m.train(mode)
        torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))


def _mlp_pair():
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)) for _ in range(3)]
    return models, Ensemble(*copy.deepcopy(models))


def test_weights_transposed_in_place_of_their_data():
    # same storage, address and shape, other strides: the cached transposes are stale
    models, ens = _mlp_pair()
    x = torch.randn(5, 4)
    ens(x)
    for index in (0, 2):
        ens.stacked[index].weight.data = ens.stacked[index].weight.data.mT
        for m in models:
            m[index].weight.data = m[index].weight.data.T
    torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))


def test_output_rows_pruned_in_place_of_their_data():
    # same storage and address, fewer rows: the cached transpose and bias row are stale
    models, ens = _mlp_pair()
    x = torch.randn(5, 4)
    ens(x)
    last = ens.stacked[2]
    last.weight.data, last.bias.data = last.weight.data[:, :2], last.bias.data[:, :2]
    for m in models:
        m[2].weight.data, m[2].bias.data = m[2].weight.data[:2], m[2].bias.data[:2]
    torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))


class _ObsClass(TensorClass):
    obs: torch.Tensor


class _ReadsObs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, batch):
        return self.fc(batch["obs"] if isinstance(batch, TensorDict) else batch.obs)


@pytest.mark.filterwarnings("ignore::tdfunc.EnsembleFallbackWarning")  # the fallback is the point
@pytest.mark.parametrize("kind", [TensorDict, _ObsClass])
@pytest.mark.parametrize("rows", [3, 5])  # 3: as many rows as members
@pytest.mark.parametrize("chunk_size", [None, 2])
def test_container_inputs_shared_or_per_member(kind, rows, chunk_size):
    torch.manual_seed(0)
    models = [_ReadsObs() for _ in range(3)]
    ens = Ensemble(*copy.deepcopy(models), chunk_size=chunk_size)

    def make(*batch):
        return kind(obs=torch.randn(*batch, 4), batch_size=list(batch))

    shared = make(rows)
    torch.testing.assert_close(ens(shared), torch.stack([m(shared) for m in models]))
    per_member = make(3, rows)
    expected = torch.stack([m(per_member[k]) for k, m in enumerate(models)])
    torch.testing.assert_close(ens(per_member, in_dims=0), expected)
    moved = make(rows, 3)  # the member dim second
    expected = torch.stack([m(moved[:, k]) for k, m in enumerate(models)])
    torch.testing.assert_close(ens(moved, in_dims=1), expected)
    with pytest.raises(ValueError, match="member dim"):
        ens(make(4, rows), in_dims=0)


def test_cumulative_batch_norm_never_reads_uninitialised_memory(monkeypatch):
    # The per-member cumulative average goes through fresh statistics updated with
    # momentum 1 (0 * fresh + 1 * batch statistics): fresh memory holding NaN made the
    # running variance NaN, now and then. Make every new buffer NaN to see it each time.
    real_empty_like = torch.empty_like
    monkeypatch.setattr(
        torch, "empty_like", lambda *a, **k: real_empty_like(*a, **k).fill_(float("nan"))
    )
    torch.manual_seed(0)
    models = [_bn_model(momentum=None) for _ in range(3)]
    models[0](torch.randn(6, 3))  # member 0 has seen more batches
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 3)
    torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))
    _buffers(ens, models)
