"""The functional optimizers: torch.optim per member, purity, state as a TensorDict, errors."""

from __future__ import annotations

import copy

import pytest
import torch
from optimizer_table import OPTIMIZERS, cases, member_kwargs
from torch import nn
from torch.func import grad, vmap

from tdfunc import TensorDict, functional_call, optim

N = 4
LRS = torch.tensor([1e-3, 1e-2, 3e-2, 1e-1])


def make_models(seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)) for _ in range(N)]


def member(value, index):
    if isinstance(value, tuple):
        return tuple(member(v, index) for v in value)
    return float(value[index]) if isinstance(value, torch.Tensor) else value


def batches(steps: int):
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(6, 3, generator=generator) for _ in range(steps)]


def run_functional(make_opt, kwargs, steps=4, sign=1.0):
    models = make_models()
    params = TensorDict.from_modules(*models).detach()
    template = models[0]

    def loss(p, x):
        return sign * vmap(lambda q: functional_call(template, q, (x,)))(p).pow(2).sum()

    opt = make_opt(**kwargs)
    state = opt.init(params)
    for x in batches(steps):
        updates, state = opt.update(grad(loss)(params, x), state, params)
        params = optim.apply_updates(params, updates)
    return params, state


def run_torch(torch_cls, kwargs, steps=4, sign=1.0):
    models = make_models()
    optimizers = [
        torch_cls(m.parameters(), **{k: member(v, i) for k, v in kwargs.items()})
        for i, m in enumerate(models)
    ]
    for x in batches(steps):
        for model, opt in zip(models, optimizers):
            opt.zero_grad()
            (sign * model(x).pow(2).sum()).backward()
            opt.step()
    return models, optimizers


def torch_state(models, optimizers, key):
    """The per-member state ``key`` stacked, nested like the parameters."""
    stacked = {}
    for name, _ in models[0].named_parameters():
        values = []
        for model, opt in zip(models, optimizers):
            values.append(opt.state[dict(model.named_parameters())[name]][key])
        stacked[name] = torch.stack(values)
    return TensorDict(stacked, batch_size=[N]).unflatten_keys(".")


def torch_moments(row, optimizers) -> list:
    """The moments of ``row`` that torch.optim keeps for every member (not None)."""
    # torch.optim.SGD keeps no state for a member without momentum
    return [
        key
        for key in row.moments
        if all(
            opt.state and all(state.get(key) is not None for state in opt.state.values())
            for opt in optimizers
        )
    ]


@pytest.mark.parametrize(("name", "kwargs"), cases(N))
def test_matches_torch_optim_per_member(name, kwargs):
    row = OPTIMIZERS[name]
    sign = -1.0 if row.maximize else 1.0  # an ascending optimizer: the negated loss
    params, state = run_functional(row.functional, kwargs, sign=sign)
    models, optimizers = run_torch(row.torch, kwargs, sign=sign)
    torch.testing.assert_close(params, TensorDict.from_modules(*models).detach())
    assert isinstance(state, TensorDict) and state.batch_size == torch.Size([N])
    assert torch.equal(state["step"], torch.full((N,), 4.0))
    for key in torch_moments(row, optimizers):
        torch.testing.assert_close(state[key], torch_state(models, optimizers, key))


def test_plain_dict_params_single_model():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = copy.deepcopy(model)
    params = {k: v.detach() for k, v in model.named_parameters()}
    opt = optim.adamw(lr=0.05)
    state = opt.init(params)
    assert isinstance(state, dict) and state["step"].shape == torch.Size([])
    torch_opt = torch.optim.AdamW(reference.parameters(), lr=0.05)
    for x in batches(3):
        grads = grad(lambda p, x=x: torch.func.functional_call(model, p, (x,)).pow(2).sum())(params)
        updates, state = opt.update(grads, state, params)
        params = optim.apply_updates(params, updates)
        torch_opt.zero_grad()
        reference(x).pow(2).sum().backward()
        torch_opt.step()
    for name, value in reference.named_parameters():
        torch.testing.assert_close(params[name], value.detach())
        torch.testing.assert_close(state["exp_avg_sq"][name], torch_opt.state[value]["exp_avg_sq"])


@pytest.mark.parametrize(("name", "kwargs"), cases(N))
def test_nothing_passed_in_is_mutated(name, kwargs):
    params = TensorDict.from_modules(*make_models()).detach()
    grads = params.apply(torch.randn_like)
    opt = OPTIMIZERS[name].functional(**kwargs)
    state = opt.init(params)
    _, state = opt.update(grads, state, params)  # a state with non-zero moments
    copies = [t.clone() for t in (params, grads, state)]
    updates, new_state = opt.update(grads, state, params)
    optim.apply_updates(params, updates)
    for before, after in zip(copies, (params, grads, state)):
        assert (before == after).all()
    assert float(new_state["step"][0]) == 2.0 and float(state["step"][0]) == 1.0


def test_state_indexes_and_stacks_like_separate_runs():
    """state[i] is member i's state; stacking per-member states gives the batched state."""
    params, state = run_functional(optim.adam, {"lr": LRS})
    models = make_models()
    for index in (0, 3):
        alone = TensorDict.from_module(models[index]).detach()
        template = models[index]
        opt = optim.adam(lr=float(LRS[index]))
        member_state = opt.init(alone)
        for x in batches(4):
            grads = grad(lambda p, x=x, m=template: functional_call(m, p, (x,)).pow(2).sum())(alone)
            updates, member_state = opt.update(grads, member_state, alone)
            alone = optim.apply_updates(alone, updates)
        torch.testing.assert_close(state[index], member_state)
        torch.testing.assert_close(params[index], alone)
    stacked = torch.stack([state[i] for i in range(N)])
    assert (stacked == state).all()


def test_state_saves_and_loads(tmp_path):
    _, state = run_functional(optim.adam, {"lr": LRS}, steps=2)
    torch.save(state.to_dict(), tmp_path / "state.pt")
    loaded = TensorDict(torch.load(tmp_path / "state.pt"), batch_size=[N])
    assert (loaded == state).all()


# ------------------------------------------------------------------ bad input
def test_lr_length_must_match_leading_dim():
    params = TensorDict.from_modules(*make_models()).detach()
    opt = optim.adam(lr=torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(
        ValueError, match=r"adam\(\.\.\.\)\.update: lr has shape \[3\], but the leaf"
    ):
        opt.update(params, opt.init(params), params)


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (
            lambda: optim.adam(lr=-1.0),
            ValueError,
            r"optim.adam: lr must be >= 0.0, got -1.0",
        ),
        (lambda: optim.adam(betas=(1.5, 0.9)), ValueError, r"betas\[0\] must be >= 0.0 and < 1.0"),
        (lambda: optim.sgd(lr=0.1, nesterov=True), ValueError, "nesterov=True needs momentum"),
        (lambda: optim.sgd(lr="0.1"), TypeError, "lr must be a float, a tensor, or a pytree"),
        (lambda: optim.sgd(lr={}), ValueError, "lr is an empty pytree"),
        (lambda: optim.rmsprop(alpha=2.0), ValueError, "alpha must be >= 0.0 and <= 1.0"),
        (lambda: optim.adam(lr=torch.tensor([1, 2])), TypeError, "floating dtype"),
    ],
)
def test_bad_hyperparameters(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_state_of_other_parameters_is_refused():
    params = TensorDict.from_modules(*make_models()).detach()
    opt = optim.adam(lr=0.1)
    state = opt.init(params.exclude("0"))
    with pytest.raises(ValueError, match="state\\['exp_avg'\\] has 2 leaves but grads has 4"):
        opt.update(params, state, params)
    with pytest.raises(ValueError, match=r"state must hold \['step', 'exp_avg', 'exp_avg_sq'\]"):
        opt.update(params, optim.sgd(lr=0.1).init(params), params)


def test_grads_and_params_structures_must_match():
    params = TensorDict.from_modules(*make_models()).detach()
    opt = optim.adam(lr=0.1, weight_decay=0.1)
    with pytest.raises(ValueError, match="grads and params must have the same structure"):
        opt.update(params, opt.init(params), params.exclude("0").update({"x": params["0"]}))
    with pytest.raises(ValueError, match="weight decay needs the parameters"):
        opt.update(params, opt.init(params))


def test_apply_updates_checks_structure():
    with pytest.raises(ValueError, match="apply_updates: updates has 1 leaves but params has 2"):
        optim.apply_updates({"a": torch.ones(1), "b": torch.ones(1)}, {"a": torch.ones(1)})


@pytest.mark.parametrize("make", ["tensordict", "dict"])
def test_init_puts_the_step_counter_beside_the_leaves(make):
    # A container built from modules has no device of its own: the counter must
    # follow the leaves (``meta`` stands in for an accelerator on a CPU machine).
    leaves = {"w": torch.zeros(3, 2, device="meta"), "b": torch.zeros(3, device="meta")}
    params = TensorDict(leaves, batch_size=[3]) if make == "tensordict" else leaves
    if make == "tensordict":
        assert params.device is None
    for opt in (optim.adam(lr=torch.ones(3, device="meta")), optim.sgd(lr=0.1)):
        state = opt.init(params)
        assert state["step"].device.type == "meta"
        updates, state = opt.update(params, state, params)
        assert updates["w"].device.type == "meta"


SUBSETS = ([0, 2], [1], [0, 1, 2], [2])


@pytest.mark.parametrize(("name", "kwargs"), cases(3))
@pytest.mark.parametrize("as_mask", [False, True])
def test_update_of_some_members_matches_a_loop_stepping_those(name, kwargs, as_mask):
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, generator=generator)
    row = OPTIMIZERS[name]
    opt = row.functional(**kwargs)
    params = TensorDict({"w": start.clone()}, batch_size=[3])
    state = opt.init(params)
    references = [torch.nn.Parameter(start[i].clone()) for i in range(3)]
    loops = [
        row.torch([p], foreach=False, **member_kwargs(kwargs, i)) for i, p in enumerate(references)
    ]
    for subset in SUBSETS:
        grad = torch.randn(3, 4, generator=generator)
        members = torch.tensor([i in subset for i in range(3)]) if as_mask else subset
        grads = TensorDict({"w": grad}, batch_size=[3])
        updates, state = opt.update(grads, state, params, members=members)
        params = optim.apply_updates(params, updates)
        for i in subset:
            references[i].grad = grad[i].clone()
            loops[i].step()
    for i in range(3):
        torch.testing.assert_close(params["w"][i], references[i].detach())
        assert float(state["step"][i]) == sum(i in subset for subset in SUBSETS)
