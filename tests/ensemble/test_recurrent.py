"""Recurrent layers (``nn.RNN``, ``nn.GRU``, ``nn.LSTM`` and their cells) in an ``Ensemble``.

torch's fused recurrent kernels have no batching rule, so these run through
tdfunc's own batched steps. Each case is checked against a Python loop over
the member modules (torch's own kernels): every output, the final states, and
the gradients of every parameter and of the inputs.
"""

from __future__ import annotations

import copy

import pytest
import torch
from member_loop import MEMBERS
from member_loop import check_against_loop as _check
from member_loop import members as _members
from torch import nn

from tdfunc import Ensemble


@pytest.mark.parametrize("kind", [nn.RNN, nn.GRU, nn.LSTM])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"num_layers": 2},
        {"bidirectional": True},
        {"num_layers": 2, "bidirectional": True, "batch_first": True},
        {"bias": False, "batch_first": True},
    ],
)
def test_sequence_layers_match_a_loop(kind, options):
    models = _members(lambda: kind(4, 6, **options))
    torch.manual_seed(1)
    x = torch.randn(5, 7, 4, requires_grad=True)
    _check(models, lambda i: (x,))


def test_rnn_relu_and_lstm_projection():
    x = torch.randn(3, 2, 4)
    _check(_members(lambda: nn.RNN(4, 6, nonlinearity="relu")), lambda i: (x,))
    x = torch.randn(2, 5, 4)
    _check(_members(lambda: nn.LSTM(4, 6, num_layers=2, proj_size=3, batch_first=True)),
           lambda i: (x,))  # fmt: skip


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM])
def test_unbatched_input_and_given_state_per_member(kind):
    models = _members(lambda: kind(4, 5, num_layers=2, bidirectional=True))
    torch.manual_seed(3)
    xs = torch.randn(MEMBERS, 6, 4)  # unbatched: [T, in] per member
    hs = torch.randn(MEMBERS, 4, 5)
    cs = torch.randn(MEMBERS, 4, 5)

    def args_for(i):
        state = hs[i] if kind is nn.GRU else (hs[i], cs[i])
        return (xs[i], state)

    _check(models, args_for, in_dims=0)


@pytest.mark.parametrize("kind", [nn.RNNCell, nn.GRUCell, nn.LSTMCell])
@pytest.mark.parametrize("batched", [True, False])
def test_cells_match_a_loop(kind, batched):
    models = _members(lambda: kind(4, 6))
    torch.manual_seed(4)
    x = torch.randn(5, 4) if batched else torch.randn(4)
    h = torch.randn(5, 6) if batched else torch.randn(6)
    state = h if kind is not nn.LSTMCell else (h, torch.randn_like(h))
    _check(models, lambda i: (x,))
    _check(models, lambda i: (x, state))


class RecurrentCritic(nn.Module):
    """A recurrent critic of the kind RL code ensembles: GRU over time, then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, obs, hidden):
        features, hidden = self.gru(torch.relu(self.encoder(obs)), hidden)
        return self.head(features[:, -1]), hidden


def test_inside_a_custom_forward_with_a_shared_state():
    models = _members(RecurrentCritic)
    torch.manual_seed(5)
    obs, hidden = torch.randn(6, 5, 4), torch.randn(1, 6, 8)
    _check(models, lambda i: (obs, hidden))


def test_dropout_between_layers():
    models = _members(lambda: nn.LSTM(4, 6, num_layers=3, dropout=0.5))
    x = torch.randn(5, 2, 4)
    _check([m.eval() for m in models], lambda i: (x,))  # eval: no dropout, exact
    ensemble = Ensemble(*copy.deepcopy(models), randomness="error").train()
    with pytest.raises(RuntimeError, match="randomness"):
        ensemble(x)
    # one mask for all members: members with equal weights agree
    same = Ensemble(*[copy.deepcopy(models[0]) for _ in range(MEMBERS)], randomness="same")
    out, _ = same.train()(x)
    torch.testing.assert_close(out[0], out[1])
    different = Ensemble(*[copy.deepcopy(models[0]) for _ in range(MEMBERS)]).train()
    out, _ = different(x)
    assert not torch.equal(out[0], out[1])


def test_wrong_input_rank_and_packed_sequences_are_refused():
    ensemble = Ensemble(*_members(lambda: nn.GRU(4, 6)))
    with pytest.raises(ValueError, match="Expected input to be 2D or 3D"):
        ensemble(torch.randn(2, 3, 5, 4))
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 4), [5, 3])
    with pytest.raises(TypeError, match="PackedSequence"):
        ensemble(packed)


def test_training_steps_match_torch_optim_per_member():
    models = _members(lambda: nn.GRU(3, 4, batch_first=True))
    ensemble = Ensemble(*copy.deepcopy(models))
    optimizer = torch.optim.Adam(ensemble.parameters(), lr=0.01)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
    torch.manual_seed(6)
    for _ in range(3):
        x, target = torch.randn(2, 5, 3), torch.randn(MEMBERS, 2, 5, 4)
        optimizer.zero_grad()
        ((ensemble(x)[0] - target) ** 2).mean(dim=(1, 2, 3)).sum().backward()
        optimizer.step()
        for i, (model, opt) in enumerate(zip(models, optimizers)):
            opt.zero_grad()
            ((model(x)[0] - target[i]) ** 2).mean().backward()
            opt.step()
    for key, stacked in ensemble.params.items(True, True):
        name = ".".join(key) if isinstance(key, tuple) else key
        expected = torch.stack([dict(m.named_parameters())[name] for m in models])
        torch.testing.assert_close(stacked, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("layer", "x", "state", "message"),
    [
        (lambda: nn.GRU(4, 6), torch.randn(5, 2, 4), torch.randn(1, 1, 6), "hidden size"),
        (lambda: nn.GRU(4, 6), torch.randn(5, 4), torch.randn(1, 2, 6), "hidden size"),
        (lambda: nn.GRU(4, 6), torch.randn(5, 2, 3), None, "input_size"),
        (lambda: nn.LSTM(4, 6), torch.randn(5, 2, 4), (torch.randn(1, 2, 6),), "tuple"),
        (
            lambda: nn.LSTM(4, 6, proj_size=2),
            torch.randn(5, 2, 4),
            (torch.randn(1, 2, 6), torch.randn(1, 2, 6)),
            "hidden size",
        ),
        (lambda: nn.GRUCell(4, 6), torch.randn(5, 4), torch.randn(1, 6), "hidden size"),
        (lambda: nn.LSTMCell(4, 6), torch.randn(4), (torch.randn(6), torch.randn(5)), "cell"),
    ],
)
def test_states_and_inputs_of_the_wrong_shape_are_refused_as_torch_does(layer, x, state, message):
    models = _members(layer)
    args = (x,) if state is None else (x, state)
    with pytest.raises((RuntimeError, IndexError)):  # torch's own layer refuses them too
        models[0](*args)
    ensemble = Ensemble(*models)  # a state broadcast over the batch would be a wrong answer
    with pytest.raises(RuntimeError, match=message):
        ensemble(*args)
