"""The memory layout of an Ensemble's stacked ``Linear`` weights.

They are ``[N, out, in]`` tensors (the shape users see) over ``[N, in, out]``
memory, so that the batched matmul reads ``weight.mT`` contiguous. Everything a
user does with parameters must work on that layout and give what N ordinary
modules give: gradients, optimizers, state dicts, copies, moves, checkpoints,
member views. References are the members run one by one, or plain tensors.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tdfunc import Ensemble, TensorDict
from tdfunc import optim as tdfunc_optim

MEMBERS = 4


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def _models(make=_mlp, members: int = MEMBERS) -> list:
    torch.manual_seed(0)
    return [make() for _ in range(members)]


def _transposed_memory(tensor: torch.Tensor) -> bool:
    return not tensor.is_contiguous() and tensor.mT.is_contiguous()


def _loop(models: list, x: torch.Tensor) -> torch.Tensor:
    return torch.stack([model(x) for model in models])


def test_linear_weights_keep_their_shape_over_transposed_memory():
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    for name, param in models[0].named_parameters():
        stacked = ens.get_parameter(f"stacked.{name}")
        assert stacked.shape == (MEMBERS, *param.shape)
        assert _transposed_memory(stacked) == name.endswith("weight"), name
        torch.testing.assert_close(stacked, torch.stack([m.get_parameter(name) for m in models]))


def test_gradients_take_the_layout_and_equal_the_loop():
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 5)
    ens(x).square().sum().backward()
    _loop(models, x).square().sum().backward()
    for name, _ in models[0].named_parameters():
        stacked = ens.get_parameter(f"stacked.{name}")
        assert stacked.grad.stride() == stacked.stride(), name  # no copy into another layout
        torch.testing.assert_close(
            stacked.grad, torch.stack([m.get_parameter(name).grad for m in models])
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=False),
        lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
        lambda p: torch.optim.Adam(p, lr=0.01, foreach=False),
        lambda p: torch.optim.AdamW(p, lr=0.01, fused=True),
    ],
    ids=["sgd-foreach", "sgd-loop", "adam-foreach", "adam-loop", "adamw-fused"],
)
def test_torch_optimizers_step_the_layout_as_n_optimizers(make):
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    ens_opt, opts = make(ens.parameters()), [make(m.parameters()) for m in models]
    for step in range(3):
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(step))
        ens_opt.zero_grad()
        ens(x).square().sum().backward()
        ens_opt.step()
        for model, opt in zip(models, opts):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    x = torch.randn(6, 5)
    torch.testing.assert_close(ens(x), _loop(models, x), rtol=1e-5, atol=1e-6)
    assert _transposed_memory(ens.stacked[0].weight)


def test_tdfunc_optim_steps_the_layout_as_n_optimizers():
    from tdfunc.optim import Adam

    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    ens_opt = Adam(ens.parameters(), lr=0.01)
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
    for step in range(3):
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(step))
        ens_opt.zero_grad()
        ens(x).square().sum().backward()
        ens_opt.step()
        for model, opt in zip(models, opts):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    x = torch.randn(6, 5)
    torch.testing.assert_close(ens(x), _loop(models, x), rtol=1e-5, atol=1e-6)


def test_copies_keep_values_and_run_like_the_original():
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 5)
    expected = _loop(models, x)
    buffer = io.BytesIO()
    torch.save(ens, buffer)
    buffer.seek(0)
    copies = {
        "deepcopy": copy.deepcopy(ens),
        "pickle": pickle.loads(pickle.dumps(ens)),
        "torch.save": torch.load(buffer, weights_only=False),
    }
    for how, other in copies.items():
        torch.testing.assert_close(other(x), expected, msg=how)
        assert other.stacked[0].weight.stride() == ens.stacked[0].weight.stride(), how
    double = copy.deepcopy(ens).double()
    torch.testing.assert_close(double(x.double()), expected.double())


def test_state_dicts_load_both_ways():
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    fresh = Ensemble(*_models(members=MEMBERS)[::-1])
    buffer = io.BytesIO()
    torch.save(ens.state_dict(), buffer)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer))
    x = torch.randn(6, 5)
    torch.testing.assert_close(fresh(x), _loop(models, x))
    # the members' own state dicts, and back into ordinary modules
    states = ens.member_state_dicts()
    for model, state in zip(models, states):
        loaded = _mlp()
        loaded.load_state_dict(state)
        torch.testing.assert_close(loaded(x), model(x))
    other = Ensemble(*_models(members=MEMBERS)[::-1])
    other.load_member_state_dicts([m.state_dict() for m in models])
    torch.testing.assert_close(other(x), _loop(models, x))
    assert _transposed_memory(other.stacked[0].weight)


def test_checkpoint_of_the_params_round_trips(tmp_path):
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    ens.params.memmap(tmp_path / "ckpt")
    loaded = TensorDict.load_memmap(tmp_path / "ckpt")
    for key, value in ens.params.items(include_nested=True, leaves_only=True):
        assert torch.equal(torch.as_tensor(loaded[key]).clone(), value.detach()), key
    fresh = Ensemble(*_models(members=MEMBERS)[::-1])
    with torch.no_grad():
        fresh.params.update_(loaded)
    x = torch.randn(6, 5)
    torch.testing.assert_close(fresh(x), _loop(models, x))


def test_member_copies_are_contiguous_modules():
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    member = ens.member(2)
    assert all(p.is_contiguous() for p in member.parameters())
    x = torch.randn(6, 5)
    torch.testing.assert_close(member(x), models[2](x))
    assert member[0].weight.view(-1).shape == (35,)  # an ordinary module's tensors


@pytest.mark.parametrize("index", [slice(1, 3), [3, 0], slice(None, None, 2), 1])
def test_selections_read_the_layout(index):
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 5)
    expected = _loop(models, x)[index]
    out = ens[index](x)
    torch.testing.assert_close(out, expected)
    out.sum().backward()  # reaches the stacked parameters
    assert ens.stacked[0].weight.grad is not None


def test_a_weight_tied_to_an_embedding_keeps_the_contiguous_layout():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(6, 4)
            self.head = nn.Linear(4, 6, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    models = _models(Tied)
    ens = Ensemble(*copy.deepcopy(models))
    assert ens.stacked.embed.weight.is_contiguous()
    tokens = torch.randint(0, 6, (3, 2))
    torch.testing.assert_close(ens(tokens), _loop(models, tokens))


def test_a_shared_linear_weight_stays_as_given():
    models = _models()
    for model in models[1:]:
        model[2].weight = models[0][2].weight
    ens = Ensemble(*copy.deepcopy(models), shared=["2.weight"])
    assert ens.stacked[2].weight.shape == (3, 7) and ens.stacked[2].weight.is_contiguous()
    x = torch.randn(6, 5)
    torch.testing.assert_close(ens(x), _loop(models, x))


def test_a_contiguous_weight_given_back_takes_the_shared_input_matmul(monkeypatch):
    """A wide shared input runs one matmul over the merged weights when the weight is
    stored ``[N, out, in]`` contiguous (the user assigned one), and bmm otherwise:
    both give the loop's numbers."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(512, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(3)]
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(16, 512)
    expected = _loop(models, x)
    calls = []
    linear = F.linear

    def spy(*args, **kwargs):
        calls.append(1)
        return linear(*args, **kwargs)

    monkeypatch.setattr(F, "linear", spy)
    torch.testing.assert_close(ens(x), expected, rtol=1e-5, atol=1e-5)
    assert not calls  # the ensemble's own layout: bmm
    state = {k: v.contiguous() for k, v in ens.state_dict().items()}
    ens.load_state_dict(state, assign=True)
    assert ens.stacked[0].weight.is_contiguous()
    out = ens(x)
    assert calls  # the merged-weight matmul
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(
        ens.stacked[0].weight.grad, torch.stack([m[0].weight.grad for m in models])
    )


def _contiguous_data(ens: Ensemble) -> None:
    for param in ens.parameters():
        param.data = param.data.contiguous()


def _vector_to_parameters(ens: Ensemble) -> None:
    vector = torch.cat([p.detach().reshape(-1) for p in ens.parameters()])
    torch.nn.utils.vector_to_parameters(vector, ens.parameters())


@pytest.mark.parametrize("change", [_contiguous_data, _vector_to_parameters, "grad"])
@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
        lambda p: torch.optim.Adam(p, lr=0.01, foreach=False),
        lambda p: tdfunc_optim.Adam(p, lr=0.01),
    ],
    ids=["adam-foreach", "adam-loop", "tdfunc-adam"],
)
def test_a_layout_changed_mid_training_steps_as_n_optimizers(make, change):
    # the optimizer state keeps the layout it was made in; the parameter or the gradient
    # takes another one (a contiguous weight given back, a gradient assigned by hand)
    models = _models()
    ens = Ensemble(*copy.deepcopy(models))
    ens_opt = make(list(ens.parameters()))
    opts = [make(list(m.parameters())) for m in models]
    for step in range(3):
        if step == 1 and change != "grad":
            change(ens)
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(step))
        ens_opt.zero_grad()
        ens(x).square().sum().backward()
        if change == "grad":
            for param in ens.parameters():
                param.grad = param.grad.contiguous()
        ens_opt.step()
        for model, opt in zip(models, opts):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    x = torch.randn(6, 5)
    torch.testing.assert_close(ens(x), _loop(models, x), rtol=1e-5, atol=1e-6)
