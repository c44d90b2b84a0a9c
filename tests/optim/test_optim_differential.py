"""Random cases against torch.optim run per member, plus the regressions they found.

The reference is ``torch.optim`` (single-tensor path) on one ordinary tensor per
member; every step compares the parameters and each state entry, in float32 and
float64 with tolerances of the dtype.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optimizer_table import OPTIMIZERS

from tdfunc import TensorDict, optim

SHAPES = {"a": (4,), "b": (2, 3), "c": ()}


def tolerances(dtype: torch.dtype) -> dict:
    if dtype == torch.float64:
        return {"rtol": 1e-11, "atol": 1e-12}
    return {"rtol": 1e-5, "atol": 1e-6}


def member_value(value, index: int):
    if isinstance(value, tuple):
        return tuple(member_value(v, index) for v in value)
    return float(value[index]) if isinstance(value, torch.Tensor) else value


def reference_runs(kind: str, kwargs: dict, start: torch.Tensor, grads: list) -> list:
    """``torch.optim`` on each member: per step, (params, state) of every member."""
    members = []
    for index in range(start.shape[0]):
        param = torch.nn.Parameter(start[index].clone())
        member_kwargs = {k: member_value(v, index) for k, v in kwargs.items()}
        opt = OPTIMIZERS[kind].torch([param], foreach=False, **member_kwargs)
        steps = []
        for grad in grads:
            param.grad = grad[index].clone()
            opt.step()
            state = {k: v.clone() for k, v in opt.state[param].items() if v is not None}
            steps.append((param.detach().clone(), state))
        members.append(steps)
    return members


def assert_member_state(ours: dict, theirs: dict, index: int, dtype) -> None:
    for name, value in theirs.items():
        if name == "step":
            assert float(ours["step"]) == float(value)
        else:
            torch.testing.assert_close(ours[name][index], value, **tolerances(dtype))


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(sorted(OPTIMIZERS)))
    members = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))

    def hyper(values):
        if draw(st.booleans()):  # one value per member, as a tensor
            chosen = [draw(st.sampled_from(values)) for _ in range(members)]
            return torch.tensor(chosen, dtype=draw(st.sampled_from([torch.float32, dtype])))
        return draw(st.sampled_from(values))

    kwargs = OPTIMIZERS[kind].draw(hyper, lambda values: draw(st.sampled_from(values)))
    seed = draw(st.integers(0, 2**16))
    return kind, members, dtype, kwargs, seed


def random_params(members: int, dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    leaves = {
        k: torch.randn(members, *s, dtype=dtype, generator=generator) for k, s in SHAPES.items()
    }
    params = TensorDict(
        {"a": leaves["a"], "nested": {"b": leaves["b"]}, "c": leaves["c"]}, batch_size=[members]
    )
    grads = [
        params.apply(lambda t: torch.randn(t.shape, dtype=dtype, generator=generator))
        for _ in range(3)
    ]
    return params, grads


KEYS = ["a", ("nested", "b"), "c"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_functional_and_stateful_match_torch_optim_per_member(case):
    kind, members, dtype, kwargs, seed = case
    params, grads = random_params(members, dtype, seed)
    references = {
        key: reference_runs(kind, kwargs, params[key], [g[key] for g in grads]) for key in KEYS
    }
    tol = tolerances(dtype)

    functional = OPTIMIZERS[kind].functional(**kwargs)
    chained = OPTIMIZERS[kind].chain(**kwargs)
    state, current = functional.init(params), params
    chain_state, chain_current = chained.init(params), params
    for step, grad in enumerate(grads):
        updates, state = functional.update(grad, state, current)
        current = optim.apply_updates(current, updates)
        # the same optimizer spelled as a chain of transforms: the same bits
        updates, chain_state = chained.update(grad, chain_state, chain_current)
        chain_current = optim.apply_updates(chain_current, updates)
        for key in KEYS:
            assert torch.equal(chain_current[key], current[key]), key
        for key in KEYS:
            for index in range(members):
                param, theirs = references[key][index][step]
                torch.testing.assert_close(current[key][index], param, **tol)
                ours = {name: state[name][key] for name in theirs if name != "step"}
                ours["step"] = state["step"][index]
                assert_member_state(ours, theirs, index, dtype)

    stateful_kwargs = kwargs
    tensors = [torch.nn.Parameter(params[key].clone()) for key in KEYS]
    opt = OPTIMIZERS[kind].stateful(tensors, **stateful_kwargs)
    for step, grad in enumerate(grads):
        for tensor, key in zip(tensors, KEYS):
            tensor.grad = grad[key].clone()
        opt.step()
        if step == 1:  # a saved state continues as the one that saved it
            saved = copy.deepcopy(opt.state_dict())
            opt = OPTIMIZERS[kind].stateful(tensors, **stateful_kwargs)
            opt.load_state_dict(saved)
        for tensor, key in zip(tensors, KEYS):
            for index in range(members):
                param, theirs = references[key][index][step]
                torch.testing.assert_close(tensor.detach()[index], param, **tol)
                assert_member_state(opt.state[tensor], theirs, index, dtype)


# ------------------------------------------------------------------ regressions
def test_sgd_dampening_weight_keeps_float64_precision():
    """``1 - dampening`` was rounded to float32 on float64 leaves (off by ~1e-8)."""
    params = TensorDict({"w": torch.randn(2, 5, dtype=torch.float64)}, batch_size=[2])
    grads = [params.apply(torch.randn_like) for _ in range(3)]
    kwargs = {"lr": 0.5, "momentum": 0.9, "dampening": 0.3}
    references = reference_runs("sgd", kwargs, params["w"], [g["w"] for g in grads])

    functional = optim.sgd(**kwargs)
    state, current = functional.init(params), params
    param = torch.nn.Parameter(params["w"].clone())
    # a per-member momentum tensor takes the other branch of the dampening weight
    stateful = optim.SGD(
        [param], lr=0.5, momentum=torch.tensor([0.9, 0.9], dtype=torch.float64), dampening=0.3
    )
    for step, grad in enumerate(grads):
        updates, state = functional.update(grad, state, current)
        current = optim.apply_updates(current, updates)
        param.grad = grad["w"].clone()
        stateful.step()
        for index in range(2):
            expected = references[index][step][0]
            torch.testing.assert_close(current["w"][index], expected, rtol=1e-13, atol=1e-14)
            torch.testing.assert_close(param.detach()[index], expected, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize(
    ("theirs", "ours", "option"),
    [
        (lambda p: torch.optim.AdamW(p), optim.Adam, "decoupled_weight_decay"),
        (lambda p: torch.optim.Adam(p), optim.AdamW, "decoupled_weight_decay"),
    ],
)
def test_load_state_dict_refuses_options_it_would_ignore(theirs, ours, option):
    """A torch.optim state dict saved with another weight decay is refused by name."""
    param = torch.nn.Parameter(torch.randn(2, 3))
    saved = theirs([param])
    param.grad = torch.randn(2, 3)
    saved.step()
    with pytest.raises(ValueError, match=f"load_state_dict.*{option}"):
        ours([param]).load_state_dict(saved.state_dict())


def test_load_state_dict_accepts_torch_optim_defaults():
    param = torch.nn.Parameter(torch.randn(2, 3))
    for theirs, ours in [(torch.optim.Adam, optim.Adam), (torch.optim.AdamW, optim.AdamW)]:
        saved = theirs([param], foreach=True)
        param.grad = torch.randn(2, 3)
        saved.step()
        ours([param]).load_state_dict(copy.deepcopy(saved.state_dict()))


def test_sgd_momentum_switched_on_mid_run_matches_torch():
    """A state made without momentum raised KeyError once momentum was set."""
    param = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
    twin = torch.nn.Parameter(param.detach().clone())
    ours = optim.SGD([param], lr=0.1, dampening=0.3)
    theirs = torch.optim.SGD([twin], lr=0.1, dampening=0.3)
    for step in range(4):
        if step == 1:
            ours.param_groups[0]["momentum"] = theirs.param_groups[0]["momentum"] = 0.9
        grad = torch.randn(3, 4, dtype=torch.float64)
        param.grad, twin.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
        torch.testing.assert_close(param, twin, rtol=0, atol=0)
    torch.testing.assert_close(
        ours.state[param]["momentum_buffer"], theirs.state[twin]["momentum_buffer"]
    )


@pytest.mark.parametrize("members", [3, 4])
@pytest.mark.parametrize("decoupled", [False, True])
def test_per_leaf_lr_broadcasting_from_the_right_with_members_at_different_steps(
    members, decoupled
):
    """A ``[4]`` lr leaf against ``[N, 4]`` leaves was aligned with per-member tensors

    (the step count's bias corrections, a per-member weight decay): wrong columns
    for N == 4, an error for N == 3.
    """
    params = TensorDict({"w": torch.randn(members, 4, dtype=torch.float64)}, batch_size=[members])
    lr = {"w": torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)}
    if decoupled:
        decay = torch.linspace(0.1, 0.4, members, dtype=torch.float64)
        opt = optim.adamw(lr=lr, weight_decay=decay)
    else:
        opt = optim.adam(lr=lr)
    state = opt.init(params)
    state["step"] = torch.arange(members, dtype=torch.float32) * 3  # e.g. stacked states
    grads = params.apply(torch.randn_like)
    updates, _ = opt.update(grads, state, params)
    for index in range(members):
        if decoupled:  # member ``index`` alone, with its own weight decay
            opt = optim.adamw(lr=lr, weight_decay=float(decay[index]))
        alone = opt.init(params[index])
        alone["step"] = state["step"][index].clone()
        expected, _ = opt.update(grads[index], alone, params[index])
        torch.testing.assert_close(updates["w"][index], expected["w"], rtol=1e-14, atol=0)


def test_per_leaf_lr_with_more_dims_than_its_leaf_is_refused():
    params = {"w": torch.zeros(4)}
    opt = optim.sgd(lr={"w": torch.full((2, 4), 0.1)})
    with pytest.raises(ValueError, match="does not broadcast to the parameter's shape"):
        opt.update({"w": torch.ones(4)}, opt.init(params), params)


@pytest.mark.parametrize(
    "updates",
    [
        TensorDict({"b": torch.ones(3), "a": torch.full((3,), 2.0)}),
        {"b": torch.ones(3), "a": torch.full((3,), 2.0)},
        {"x": torch.ones(3), "y": torch.full((3,), 2.0)},
    ],
    ids=["tensordict-reordered", "dict-reordered", "dict-other-keys"],
)
def test_apply_updates_refuses_updates_that_name_other_leaves(updates):
    """Updates in another key order were added by position: ``a`` got ``b``'s update."""
    params = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3)})
    with pytest.raises(ValueError, match="apply_updates: updates and params must name"):
        optim.apply_updates(params, updates)


def test_apply_updates_accepts_a_dict_with_the_params_keys():
    params = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(2)}})
    updates = {"a": torch.ones(3), "n": {"b": torch.full((2,), 2.0)}}
    result = optim.apply_updates(params, updates)
    torch.testing.assert_close(result["a"], updates["a"])
    torch.testing.assert_close(result["n", "b"], updates["n"]["b"])


def test_adam_loads_a_state_dict_with_python_step_counts():
    """Older torch.optim state dicts count steps in Python numbers (AttributeError before)."""
    param = torch.nn.Parameter(torch.randn(2, 3, dtype=torch.float64))
    twin = torch.nn.Parameter(param.detach().clone())
    theirs = torch.optim.Adam([twin], lr=0.1, foreach=False)
    twin.grad = torch.randn(2, 3, dtype=torch.float64)
    theirs.step()
    saved = copy.deepcopy(theirs.state_dict())
    saved["state"][0]["step"] = int(saved["state"][0]["step"])
    with torch.no_grad():
        param.copy_(twin)
    ours = optim.Adam([param], lr=0.1)
    ours.load_state_dict(saved)
    param.grad, twin.grad = (torch.randn(2, 3, dtype=torch.float64),) * 2
    ours.step()
    theirs.step()
    torch.testing.assert_close(param, twin, rtol=1e-13, atol=1e-14)
    assert float(ours.state[param]["step"]) == 2.0


@pytest.mark.parametrize("make", [optim.sgd, optim.rmsprop])
def test_momentum_set_after_construction_is_refused(make):
    """Setting momentum on an optimizer made without it was silently ignored."""
    params = {"w": torch.zeros(2)}
    opt = make(lr=1.0)
    state = opt.init(params)
    opt.hyperparameters["momentum"] = 0.9
    with pytest.raises(ValueError, match=r"hyperparameters\['momentum'\] was set to 0.9"):
        opt.update({"w": torch.ones(2)}, state, params)


@pytest.mark.parametrize("transformed", [False, True])
def test_eps_root_is_added_to_the_bias_corrected_second_moment(transformed):
    """As in optax: sqrt(v / (1 - beta2**t) + eps_root); it was sqrt(v + eps_root) / ...,

    eps_root scaled by 1 / (1 - beta2**t) (1000x at the first step).
    """
    params = TensorDict({"w": torch.randn(3, 5, dtype=torch.float64)}, batch_size=[3])
    grads = [params.apply(torch.randn_like) for _ in range(3)]
    lr, beta1, beta2, eps, eps_root = 0.1, 0.9, 0.999, 1e-8, 1e-3
    opt = optim.adam(lr=lr, betas=(beta1, beta2), eps=eps, eps_root=eps_root)
    update = torch.func.vmap(opt.update) if transformed else opt.update
    state, current = opt.init(params), params
    weights = params["w"]
    first = second = torch.zeros_like(weights)
    for step, grad in enumerate(grads, start=1):
        updates, state = update(grad, state, current)
        current = optim.apply_updates(current, updates)
        first = beta1 * first + (1 - beta1) * grad["w"]
        second = beta2 * second + (1 - beta2) * grad["w"] ** 2
        corrected = second / (1 - beta2**step)
        weights = weights - lr * first / (1 - beta1**step) / ((corrected + eps_root).sqrt() + eps)
        torch.testing.assert_close(current["w"], weights, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("kind", "kwargs"),
    [
        ("adamw", {"lr": 0.1, "weight_decay": torch.tensor([0.1, 0.3])}),
        ("adam", {"lr": 0.1, "betas": (torch.tensor([0.3, 0.2]), torch.tensor([0.3, 0.4]))}),
        ("rmsprop", {"lr": 0.01, "alpha": torch.tensor([0.3, 0.2]), "centered": True}),
    ],
)
def test_float32_tensor_hyperparameters_on_float64_leaves(kind, kwargs):
    """``1 - beta`` and ``lr * weight_decay`` were rounded to float32 before the leaves saw them."""
    params, grads = random_params(2, torch.float64, seed=0)
    references = reference_runs(kind, kwargs, params["a"], [g["a"] for g in grads])
    opt = getattr(optim, kind)(**kwargs)
    state, current = opt.init(params), params
    for step, grad in enumerate(grads):
        updates, state = opt.update(grad, state, current)
        current = optim.apply_updates(current, updates)
        for index in range(2):
            expected = references[index][step][0]
            torch.testing.assert_close(current["a"][index], expected, rtol=1e-13, atol=1e-14)


COMPLEX_CASES = [
    ("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
    ("adam", {"lr": 0.1, "weight_decay": 0.1}),
    ("adamw", {"lr": 0.1, "weight_decay": 0.1}),
    ("rmsprop", {"lr": 0.01, "momentum": 0.5, "centered": True, "weight_decay": 0.1}),
    ("rmsprop", {"lr": 0.01}),
]


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize(("kind", "kwargs"), COMPLEX_CASES)
def test_complex_parameters_step_as_torch_optim(kind, kwargs, dtype):
    generator = torch.Generator().manual_seed(3)
    start = torch.randn(3, 4, dtype=dtype, generator=generator)
    grads = [torch.randn(3, 4, dtype=dtype, generator=generator) for _ in range(3)]
    reference = torch.nn.Parameter(start.clone())
    theirs = OPTIMIZERS[kind].torch([reference], foreach=False, **kwargs)
    for grad in grads:
        reference.grad = grad.clone()
        theirs.step()
    tol = tolerances(torch.float64 if dtype == torch.complex128 else torch.float32)

    opt = OPTIMIZERS[kind].functional(**kwargs)
    params = TensorDict({"w": start.clone()}, batch_size=[3])
    state = opt.init(params)
    for grad in grads:
        updates, state = opt.update(TensorDict({"w": grad}, batch_size=[3]), state, params)
        params = optim.apply_updates(params, updates)
    torch.testing.assert_close(params["w"], reference.detach(), **tol)
    for name, value in theirs.state[reference].items():
        if name != "step":
            torch.testing.assert_close(state[name]["w"], value, **tol)

    ours = torch.nn.Parameter(start.clone())
    opt = OPTIMIZERS[kind].stateful([ours], **kwargs)
    for grad in grads:
        ours.grad = grad.clone()
        opt.step()
    torch.testing.assert_close(ours.detach(), reference.detach(), **tol)


@pytest.mark.parametrize(
    ("saver", "loader"),
    [
        (optim.AdamW, optim.Adam),
        (optim.Adam, optim.AdamW),
        (torch.optim.AdamW, optim.Adam),
        (torch.optim.Adam, optim.AdamW),
    ],
)
def test_state_dict_of_the_other_weight_decay_is_refused(saver, loader):
    param = torch.nn.Parameter(torch.ones(2, 3))
    param.grad = torch.ones(2, 3)
    saved = saver([param], lr=0.1, weight_decay=0.1)
    saved.step()
    with pytest.raises(ValueError, match="decoupled_weight_decay"):
        loader([param], lr=0.1, weight_decay=0.1).load_state_dict(saved.state_dict())


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_state_dict_of_the_same_weight_decay_loads_and_continues(cls):
    theirs_cls = torch.optim.AdamW if cls is optim.AdamW else torch.optim.Adam
    param = torch.nn.Parameter(torch.ones(2, 3))
    reference = torch.nn.Parameter(torch.ones(2, 3))
    torch_opt = theirs_cls([reference], lr=0.1, weight_decay=0.1, foreach=False)
    ours = cls([param], lr=0.1, weight_decay=0.1)
    for step in range(3):
        grad = torch.full((2, 3), float(step + 1))
        param.grad, reference.grad = grad.clone(), grad.clone()
        ours.step()
        torch_opt.step()
        saved = ours.state_dict()
        ours = cls([param], lr=0.1, weight_decay=0.1)
        ours.load_state_dict(saved)
    torch.testing.assert_close(param.detach(), reference.detach())
