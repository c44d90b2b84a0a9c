"""Ensembles: the README's vmap example and the ``Ensemble`` module.

References are computed without tdfunc: a Python loop over the member models,
``torch.stack`` of their outputs, and plain per-model training loops.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from tdfunc import Ensemble, TensorDict


def mlp(width: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(2, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                         nn.Linear(width, 1))  # fmt: skip


def models(n: int = 4, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [mlp() for _ in range(n)]


def loop_forward(members, *inputs) -> torch.Tensor:
    return torch.stack([m(*inputs) for m in members])


def stacked_state(members) -> dict:
    """The reference stacked parameters: ``torch.stack`` of each state_dict entry."""
    states = [m.state_dict() for m in members]
    return {key: torch.stack([s[key] for s in states]) for key in states[0]}


def ensemble_state(ensemble: Ensemble) -> dict:
    prefix = "stacked."
    return {k[len(prefix) :]: v for k, v in ensemble.state_dict().items()}


# ----------------------------------------------------------------- README example
def test_readme_functional_example():
    layer1 = nn.Linear(3, 4)
    layer2 = nn.Linear(4, 4)
    model = nn.Sequential(layer1, layer2)
    params = TensorDict.from_module(model)
    weights1 = TensorDict(layer1.state_dict(), []).unflatten_keys(".")
    weights2 = TensorDict(layer2.state_dict(), []).unflatten_keys(".")
    assert (params == TensorDict({"0": weights1, "1": weights2}, [])).all()
    x = torch.randn(10, 3)
    with params.to_module(model):
        out = model(x)
    torch.testing.assert_close(out, layer2(layer1(x)))
    params_stack = torch.stack([params, params], 0)

    def func(x, params):
        with params.to_module(model):
            return model(x)

    y = vmap(func, (None, 0))(x, params_stack)
    assert y.shape == torch.Size([2, 10, 4])
    torch.testing.assert_close(y, torch.stack([out, out]))


def test_readme_pattern_with_different_members():
    members = models(3)
    params = TensorDict.from_modules(*members)
    template = copy.deepcopy(members[0]).to("meta")

    def func(x, p):
        with p.to_module(template):
            return template(x)

    x = torch.randn(5, 2)
    torch.testing.assert_close(vmap(func, (None, 0))(x, params), loop_forward(members, x))


# ----------------------------------------------------------------- construction
def test_forward_matches_loop_and_registers_stacked_params():
    members = models(4)
    ensemble = Ensemble(*members)
    x = torch.randn(7, 2)
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))
    reference = stacked_state(members)
    state = ensemble_state(ensemble)
    assert list(state) == list(reference)
    for key in reference:
        torch.testing.assert_close(state[key], reference[key])
    assert len(list(ensemble.parameters())) == len(reference)
    assert all(p.device.type == "cpu" for p in ensemble.parameters())
    assert all(isinstance(p, nn.Parameter) for p in ensemble.params.values(True, True))
    assert len(ensemble) == ensemble.num_members == 4


def test_list_of_models_and_modulelist():
    members = models(3)
    x = torch.randn(4, 2)
    for built in (Ensemble(members), Ensemble(nn.ModuleList(members))):
        torch.testing.assert_close(built(x), loop_forward(members, x))


def test_template_is_outside_the_module_tree():
    members = models(2)
    ensemble = Ensemble(*members)
    names = [name for name, _ in ensemble.named_parameters()]
    assert all(name.startswith("stacked.") for name in names)
    assert all(p.shape[0] == 2 for p in ensemble.parameters())
    assert all(p.device.type == "meta" for p in ensemble.template.parameters())
    assert "template" not in dict(ensemble.named_modules())
    # the member models given are left alone
    assert all(p.device.type == "cpu" for p in members[0].parameters())


def test_params_are_the_registered_parameters():
    ensemble = Ensemble(*models(3))
    params = ensemble.params
    assert params.batch_size == torch.Size([3])
    assert list(params.keys()) == ["0", "2", "4"]  # no empty levels for the activations
    assert params["0", "weight"] is ensemble.stacked.get_submodule("0").weight
    ids = {id(p) for p in ensemble.parameters()}
    assert {id(v) for v in params.values(True, True)} == ids


def test_num_members_fresh_initialisations_match_manual_resets():
    torch.manual_seed(1)
    model = mlp()
    torch.manual_seed(5)
    ensemble = Ensemble(model, num_members=3)
    torch.manual_seed(5)
    expected = []
    for _ in range(3):
        member = copy.deepcopy(model)
        for module in member.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        expected.append(member)
    state = ensemble_state(ensemble)
    for key, value in stacked_state(expected).items():
        torch.testing.assert_close(state[key], value)
    weights = state["0.weight"]
    assert not torch.equal(weights[0], weights[1])
    assert not torch.equal(weights[0], model[0].weight.detach())


def test_num_members_with_init_function():
    model = nn.Linear(2, 2)
    values = iter(range(10))

    def init(module):
        module.weight.fill_(next(values))

    ensemble = Ensemble(model, num_members=3, init=init)
    torch.testing.assert_close(ensemble.stacked.weight[:, 0, 0], torch.tensor([0.0, 1.0, 2.0]))


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x):
        return self.linear(x) * self.scale


def test_num_members_refuses_parameters_it_cannot_reinitialise():
    with pytest.raises(ValueError, match=r"\['scale'\].*init=fn"):
        Ensemble(Scaled(), num_members=2)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: Ensemble(), ValueError, "at least one model"),
        (lambda: Ensemble(nn.Linear(2, 2), nn.Linear(2, 2), num_members=3), ValueError,
         "exactly one model"),
        (lambda: Ensemble(nn.Linear(2, 2), num_members=0), ValueError, "positive int"),
        (lambda: Ensemble(nn.Linear(2, 2), nn.Tanh()), TypeError, "same class"),
        (lambda: Ensemble(nn.Linear(2, 2), "model"), TypeError, "position 1"),
        (lambda: Ensemble(nn.Linear(2, 2), init=print), ValueError, "num_members"),
        (lambda: Ensemble(nn.Linear(2, 2), randomness="sometimes"), ValueError, "randomness"),
        (lambda: Ensemble(nn.Linear(2, 2), chunk_size=0), ValueError, "chunk_size"),
        (lambda: Ensemble(nn.Linear(2, 2), in_dims="0"), TypeError, "in_dims"),
        (lambda: Ensemble(nn.Tanh(), nn.Tanh()), ValueError, "no parameters"),
    ],
)  # fmt: skip
def test_construction_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ----------------------------------------------------------------- running
class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 3)

    def forward(self, x, shift, *, scale=1.0):
        return self.linear(x) * scale + shift


def test_per_member_inputs_in_dims():
    members = models(3)
    ensemble = Ensemble(*members, in_dims=0)
    xs = torch.randn(3, 5, 2)
    expected = torch.stack([m(x) for m, x in zip(members, xs)])
    torch.testing.assert_close(ensemble(xs), expected)


def test_in_dims_tuple_and_keyword_inputs():
    torch.manual_seed(0)
    members = [TwoInputs() for _ in range(3)]
    ensemble = Ensemble(*members, in_dims=(None, 0))
    x, shifts = torch.randn(4, 2), torch.randn(3, 1)
    expected = torch.stack([m(x, s, scale=2.0) for m, s in zip(members, shifts)])
    torch.testing.assert_close(ensemble(x, shifts, scale=2.0), expected)
    with pytest.raises(ValueError, match="in_dims has 2 entries"):
        ensemble(x)


def test_chunk_size_gives_the_same_result():
    members = models(5)
    x = torch.randn(6, 2)
    torch.testing.assert_close(Ensemble(*members, chunk_size=2)(x), loop_forward(members, x))


def test_randomness_of_dropout():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5))
    same_members = [copy.deepcopy(model) for _ in range(3)]
    x = torch.randn(2, 4)
    different = Ensemble(*same_members)(x)
    assert not torch.equal(different[0], different[1])
    same = Ensemble(*same_members, randomness="same")(x)
    torch.testing.assert_close(same[0], same[1])
    with pytest.raises(RuntimeError, match="randomness"):
        Ensemble(*same_members, randomness="error")(x)


def test_train_and_eval_reach_the_template():
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5)) for _ in range(2)]
    ensemble = Ensemble(*members).eval()
    assert not ensemble.template.training
    x = torch.randn(3, 4)
    for m in members:
        m.eval()
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))
    assert ensemble.train().template.training


def test_batchnorm_buffers_are_stacked_and_updated():
    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)) for _ in range(3)]
    ensemble = Ensemble(*members)
    x = torch.randn(10, 3)
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))  # updates running stats
    batchnorm = ensemble.stacked.get_submodule("1")
    assert "running_mean" in dict(batchnorm.named_buffers())
    torch.testing.assert_close(
        batchnorm.running_mean, torch.stack([m[1].running_mean for m in members])
    )
    ensemble.eval()
    for m in members:
        m.eval()
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))


def test_tied_weights_stay_tied():
    torch.manual_seed(0)
    members = []
    for _ in range(2):
        model = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
        model[1].weight = model[0].weight
        members.append(model)
    ensemble = Ensemble(*members)
    assert len(list(ensemble.parameters())) == 1
    x = torch.randn(4, 3)
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))


def test_functional_call_with_other_params_and_wrong_keys():
    members = models(3)
    ensemble = Ensemble(*members)
    x = torch.randn(4, 2)
    doubled = ensemble.params * 2
    expected = torch.stack(
        [torch.func.functional_call(m, {k: 2 * v for k, v in m.state_dict().items()}, (x,))
         for m in members]
    )  # fmt: skip
    torch.testing.assert_close(ensemble.functional_call(doubled, x), expected)
    with pytest.raises(KeyError, match="'0'"):
        ensemble.functional_call(doubled.exclude("0"), x)


# ----------------------------------------------------------------- members, copies
def test_member_is_a_standalone_copy():
    members = models(3)
    ensemble = Ensemble(*members)
    x = torch.randn(4, 2)
    member = ensemble.member(1)
    assert type(member) is type(members[1])
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in member.parameters())
    torch.testing.assert_close(member(x), members[1](x))
    torch.testing.assert_close(ensemble.member(-1)(x), members[2](x))
    with torch.no_grad():
        member[0].weight.add_(1.0)
    torch.testing.assert_close(ensemble(x)[1], members[1](x))
    with pytest.raises(IndexError, match="out of range"):
        ensemble.member(3)


def test_state_dict_round_trip_deepcopy_and_pickle():
    x = torch.randn(4, 2)
    source = Ensemble(*models(3, seed=0))
    target = Ensemble(*models(3, seed=1))
    target.load_state_dict(source.state_dict())
    torch.testing.assert_close(target(x), source(x))
    clone = copy.deepcopy(source)
    torch.testing.assert_close(clone(x), source(x))
    with torch.no_grad():
        clone.stacked.get_submodule("0").weight.zero_()
    assert not torch.equal(clone(x), source(x))  # the copy has its own parameters
    buffer = io.BytesIO()
    torch.save(source, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer, weights_only=False)(x), source(x))


def test_to_dtype_converts_the_stacked_params():
    members = models(2)
    ensemble = Ensemble(*members).to(torch.float64)
    x = torch.randn(3, 2, dtype=torch.float64)
    out = ensemble(x)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, loop_forward([m.double() for m in members], x))


# ----------------------------------------------------------------- training
STEPS, LR = 4, 0.1


def _data():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(16, 2, generator=generator)
    return x, torch.sin(x.sum(-1, keepdim=True))


def _train_separately(members, optimizer_cls, **kwargs) -> dict:
    x, y = _data()
    for model in members:
        optimizer = optimizer_cls(model.parameters(), lr=LR, **kwargs)
        for _ in range(STEPS):
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
    return stacked_state(members)


def test_vmapped_grad_step_matches_separate_training():
    members = models(4)
    ensemble = Ensemble(*copy.deepcopy(members))
    expected = _train_separately(members, torch.optim.SGD)
    x, y = _data()

    def loss(params, x, y):
        return ((ensemble.call_member(params, x) - y) ** 2).mean()

    step = vmap(grad(loss), (0, None, None))
    params = ensemble.params.detach()
    for _ in range(STEPS):
        params = params - LR * step(params, x, y)  # functional: a new TensorDict
        with torch.no_grad():  # in place: the ensemble's registered parameters
            ensemble.params.sub_(LR * step(ensemble.params, x, y))
    flat = params.flatten_keys(".")
    state = ensemble_state(ensemble)
    for key, value in expected.items():
        torch.testing.assert_close(flat[key], value)
        torch.testing.assert_close(state[key], value)


@pytest.mark.parametrize(
    ("optimizer_cls", "kwargs"), [(torch.optim.SGD, {"momentum": 0.9}), (torch.optim.Adam, {})]
)
def test_optimizer_training_matches_separate_training(optimizer_cls, kwargs):
    members = models(4)
    ensemble = Ensemble(*copy.deepcopy(members))
    expected = _train_separately(members, optimizer_cls, **kwargs)
    x, y = _data()
    optimizer = optimizer_cls(ensemble.parameters(), lr=LR, **kwargs)
    for _ in range(STEPS):
        optimizer.zero_grad()
        # members are independent: the sum of their losses has each member's gradient
        ((ensemble(x) - y) ** 2).mean(dim=(1, 2)).sum().backward()
        optimizer.step()
    state = ensemble_state(ensemble)
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value)


# ----------------------------------------------------------------- compile
@pytest.mark.slow
def test_compiled_forward_fullgraph_without_recompiles():
    from torch._dynamo.testing import CompileCounter

    members = models(3)
    ensemble = Ensemble(*members)
    counter = CompileCounter()
    compiled = torch.compile(ensemble, backend=counter, fullgraph=True)
    for _ in range(2):
        x = torch.randn(5, 2)
        torch.testing.assert_close(compiled(x), loop_forward(members, x))
    assert counter.frame_count == 1
