"""torch.optim's options (maximize, amsgrad, implementation switches) as porting users meet them.

The contract of each option over the table (torch.optim per member, bit for bit for the
stateful step, chains bit for bit) runs in ``test_optim_contract``; here are the doors a
hostile or careless user opens: options of the wrong type, implementation switches this
step cannot honour, state dicts whose options do not match, schedulers, complex and
low-precision parameters, steps of some members.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tdfunc import TensorDict, optim

STATEFUL = [
    (optim.Adam, torch.optim.Adam),
    (optim.AdamW, torch.optim.AdamW),
    (optim.SGD, torch.optim.SGD),
    (optim.RMSprop, torch.optim.RMSprop),
]
FUNCTIONAL = [optim.adam, optim.adamw, optim.sgd, optim.rmsprop]


def torch_steps(cls, start, grads, **kwargs):
    """``cls`` (torch.optim) over one tensor per member: the stacked result and the optimizers."""
    members = [torch.nn.Parameter(start[i].clone()) for i in range(start.shape[0])]
    opts = [cls([p], **kwargs) for p in members]
    for grad in grads:
        for index, (param, opt) in enumerate(zip(members, opts)):
            param.grad = grad[index].clone()
            opt.step()
    return torch.stack([p.detach() for p in members]), opts


# ------------------------------------------------------------------ the options' types
@pytest.mark.parametrize("make", FUNCTIONAL)
@pytest.mark.parametrize("value", [1, "yes", None, torch.tensor(True)])
def test_functional_maximize_must_be_a_bool(make, value):
    with pytest.raises(TypeError, match=rf"tdfunc.optim.{make.__name__}: maximize must be True"):
        make(lr=0.1, maximize=value)


@pytest.mark.parametrize("make", [optim.adam, optim.adamw, optim.scale_by_adam])
def test_amsgrad_must_be_a_bool(make):
    with pytest.raises(TypeError, match="amsgrad must be True or False, got int"):
        make(amsgrad=1)


@pytest.mark.parametrize(("ours", "theirs"), STATEFUL)
def test_stateful_maximize_must_be_a_bool(ours, theirs):
    param = torch.nn.Parameter(torch.ones(2, 3))
    with pytest.raises(TypeError, match=rf"{ours.__name__}.*maximize must be True or False"):
        ours([param], lr=0.1, maximize="no")
    opt = ours([param], lr=0.1)
    opt.param_groups[0]["maximize"] = 1  # between steps: refused by the next step
    param.grad = torch.ones(2, 3)
    with pytest.raises(TypeError, match="maximize must be True or False, got int"):
        opt.step()
    assert torch.equal(param.detach(), torch.ones(2, 3))


# ------------------------------------------------------------------ implementation switches
@pytest.mark.parametrize("foreach", [None, False, True])
@pytest.mark.parametrize(("ours", "theirs"), STATEFUL)
def test_foreach_is_accepted_and_changes_nothing(ours, theirs, foreach):
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, generator=generator)
    grads = [torch.randn(3, 4, generator=generator) for _ in range(3)]
    expected, _ = torch_steps(theirs, start, grads, lr=0.1, foreach=False)
    param = torch.nn.Parameter(start.clone())
    opt = ours([param], lr=0.1, foreach=foreach)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    assert torch.equal(param.detach(), expected)


SWITCHES = {
    "capturable": "torch.compile",
    "differentiable": "functional tdfunc.optim",
    "fused": "leave fused unset",
}


@pytest.mark.parametrize(("ours", "theirs"), STATEFUL)
@pytest.mark.parametrize("switch", list(SWITCHES))
def test_implementation_switches_are_refused_with_the_alternative(ours, theirs, switch):
    import inspect

    param = torch.nn.Parameter(torch.ones(2, 3))
    if switch not in inspect.signature(theirs).parameters:
        # torch.optim does not take it either: the same TypeError
        with pytest.raises(TypeError, match=switch):
            ours([param], **{switch: True})
        return
    ours([param], **{switch: False})  # torch.optim's default: accepted
    with pytest.raises(ValueError, match=rf"{switch}=True is not supported.*{SWITCHES[switch]}"):
        ours([param], **{switch: True})
    with pytest.raises(TypeError, match=rf"{switch} must be"):
        ours([param], **{switch: "yes"})


def test_adam_with_decoupled_weight_decay_points_to_adamw():
    param = torch.nn.Parameter(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"decoupled_weight_decay=True.*use tdfunc.optim.AdamW"):
        optim.Adam([param], decoupled_weight_decay=True)
    with pytest.raises(TypeError, match="decoupled_weight_decay must be True or False"):
        optim.Adam([param], decoupled_weight_decay=1)
    with pytest.raises(TypeError, match="decoupled_weight_decay"):
        optim.AdamW([param], decoupled_weight_decay=True)  # as torch.optim.AdamW


# ------------------------------------------------------------------ state dicts
def _saved_torch_adam(amsgrad: bool):
    generator = torch.Generator().manual_seed(1)
    param = torch.nn.Parameter(torch.randn(2, 3, dtype=torch.float64, generator=generator))
    grads = [torch.randn(2, 3, dtype=torch.float64, generator=generator) for _ in range(4)]
    theirs = torch.optim.Adam([param], lr=0.1, amsgrad=amsgrad, weight_decay=0.1)
    for grad in grads[:2]:
        param.grad = grad.clone()
        theirs.step()
    return param, theirs, grads


@pytest.mark.parametrize("saved_amsgrad", [False, True])
def test_a_torch_state_dict_brings_its_amsgrad_as_torch_optim_loads_it(saved_amsgrad):
    """Loaded into an optimizer made with the other setting, the saved groups' option wins."""
    param, theirs, grads = _saved_torch_adam(saved_amsgrad)
    ours_param = torch.nn.Parameter(param.detach().clone())
    ours = optim.Adam([ours_param], lr=0.1, amsgrad=not saved_amsgrad, weight_decay=0.1)
    ours.load_state_dict(copy.deepcopy(theirs.state_dict()))
    twin_param = torch.nn.Parameter(param.detach().clone())
    twin = torch.optim.Adam([twin_param], lr=0.1, amsgrad=not saved_amsgrad, weight_decay=0.1)
    twin.load_state_dict(copy.deepcopy(theirs.state_dict()))
    assert ours.param_groups[0]["amsgrad"] is saved_amsgrad
    for grad in grads[2:]:
        ours_param.grad, twin_param.grad = grad.clone(), grad.clone()
        ours.step()
        twin.step()
    assert torch.equal(ours_param.detach(), twin_param.detach())


@pytest.mark.parametrize(
    ("theirs", "ours", "options"),
    [
        (torch.optim.Adam, optim.Adam, {"amsgrad": True}),
        (torch.optim.Adam, optim.Adam, {"maximize": True}),
        (torch.optim.SGD, optim.SGD, {"maximize": True, "momentum": 0.9}),
        (torch.optim.RMSprop, optim.RMSprop, {"maximize": True}),
    ],
)
def test_state_dicts_saved_with_the_options_are_followed(theirs, ours, options):
    """Such state dicts were refused (or, earlier, followed without the options)."""
    generator = torch.Generator().manual_seed(7)
    param = torch.nn.Parameter(torch.randn(2, 3, generator=generator))
    twin = torch.nn.Parameter(param.detach().clone())
    saved = theirs([twin], lr=0.1, **options)
    twin.grad = torch.randn(2, 3, generator=generator)
    saved.step()
    with torch.no_grad():
        param.copy_(twin)
    plain = {k: v for k, v in options.items() if k == "momentum"}
    loaded = ours([param], lr=0.1, **plain)
    loaded.load_state_dict(copy.deepcopy(saved.state_dict()))
    for _ in range(2):
        grad = torch.randn(2, 3, generator=generator)
        param.grad, twin.grad = grad.clone(), grad.clone()
        loaded.step()
        saved.step()
    assert torch.equal(param.detach(), twin.detach())


def test_a_state_dict_with_amsgrad_but_no_maximum_is_refused_before_loading():
    param, theirs, _ = _saved_torch_adam(False)
    saved = copy.deepcopy(theirs.state_dict())
    saved["param_groups"][0]["amsgrad"] = True
    ours = optim.Adam([torch.nn.Parameter(param.detach().clone())], lr=0.5)
    with pytest.raises(ValueError, match=r"load_state_dict: amsgrad=True.*parameter 0.*max_exp"):
        ours.load_state_dict(saved)
    assert ours.param_groups[0]["lr"] == 0.5 and not ours.state


def test_amsgrad_switched_on_after_steps_is_refused_and_nothing_moves():
    first = torch.nn.Parameter(torch.ones(2, 3))
    second = torch.nn.Parameter(torch.ones(2))
    opt = optim.Adam([{"params": [second], "amsgrad": True}, {"params": [first]}], lr=0.1)
    for param in (first, second):
        param.grad = torch.ones_like(param)
    opt.step()
    before = copy.deepcopy((first.detach(), second.detach(), opt.state_dict()))
    opt.param_groups[1]["amsgrad"] = True
    with pytest.raises(ValueError, match=r"Adam.step: amsgrad=True.*shape \[2, 3\]"):
        opt.step()
    # the first group (which could step) did not move either
    assert torch.equal(first.detach(), before[0]) and torch.equal(second.detach(), before[1])
    assert float(opt.state[second]["step"]) == 1.0


def test_our_amsgrad_state_dict_continues_in_torch_optim():
    generator = torch.Generator().manual_seed(2)
    start = torch.randn(3, 4, generator=generator)
    grads = [torch.randn(3, 4, generator=generator) for _ in range(4)]
    ours = torch.nn.Parameter(start.clone())
    reference = torch.nn.Parameter(start.clone())
    opt = optim.AdamW([ours], lr=0.1, amsgrad=True, maximize=True)
    theirs = torch.optim.AdamW([reference], lr=0.1, amsgrad=True, maximize=True)
    for index, grad in enumerate(grads):
        if index == 2:
            saved = opt.state_dict()
            assert saved["param_groups"][0]["amsgrad"] and saved["param_groups"][0]["maximize"]
            opt = torch.optim.AdamW([ours], lr=0.1)  # the saved options replace these
            opt.load_state_dict(saved)
        ours.grad, reference.grad = grad.clone(), grad.clone()
        opt.step()
        theirs.step()
    assert torch.equal(ours.detach(), reference.detach())


# ------------------------------------------------------------------ schedulers, members
@pytest.mark.parametrize(("ours", "theirs"), STATEFUL)
def test_a_scheduler_with_maximize_and_per_member_lr(ours, theirs):
    generator = torch.Generator().manual_seed(3)
    start = torch.randn(3, 4, dtype=torch.float64, generator=generator)
    grads = [torch.randn(3, 4, dtype=torch.float64, generator=generator) for _ in range(4)]
    lrs = torch.tensor([0.1, 0.05, 0.2], dtype=torch.float64)
    param = torch.nn.Parameter(start.clone())
    opt = ours([param], lr=lrs, maximize=True)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    members = [torch.nn.Parameter(start[i].clone()) for i in range(3)]
    references = [theirs([p], lr=float(lrs[i]), maximize=True) for i, p in enumerate(members)]
    schedulers = [torch.optim.lr_scheduler.StepLR(r, step_size=1, gamma=0.5) for r in references]
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
        scheduler.step()
        for index, (member, reference, member_scheduler) in enumerate(
            zip(members, references, schedulers)
        ):
            member.grad = grad[index].clone()
            reference.step()
            member_scheduler.step()
    expected = torch.stack([m.detach() for m in members])
    torch.testing.assert_close(param.detach(), expected, rtol=1e-13, atol=1e-14)
    # ascending: the objective's gradient direction was followed
    assert not torch.equal(param.detach(), start)


@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW])
def test_steps_of_some_members_keep_the_others_maximum(cls):
    theirs_cls = torch.optim.AdamW if cls is optim.AdamW else torch.optim.Adam
    generator = torch.Generator().manual_seed(4)
    start = torch.randn(3, 4, dtype=torch.float64, generator=generator)
    grads = [torch.randn(3, 4, dtype=torch.float64, generator=generator) for _ in range(4)]
    param = torch.nn.Parameter(start.clone())
    opt = cls([param], lr=0.1, amsgrad=True)
    members = [torch.nn.Parameter(start[i].clone()) for i in range(3)]
    references = [theirs_cls([p], lr=0.1, amsgrad=True) for p in members]
    for step, grad in enumerate(grads):
        chosen = [0, 2] if step % 2 else [1]
        param.grad = grad.clone()
        opt.step(members=chosen)
        for index in chosen:
            members[index].grad = grad[index].clone()
            references[index].step()
    for index, (member, reference) in enumerate(zip(members, references)):
        torch.testing.assert_close(param.detach()[index], member.detach(), rtol=1e-13, atol=0)
        torch.testing.assert_close(
            opt.state[param]["max_exp_avg_sq"][index],
            reference.state[member]["max_exp_avg_sq"],
            rtol=1e-13,
            atol=0,
        )


# ------------------------------------------------------------------ numbers
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize(
    ("ours", "theirs", "functional", "kwargs"),
    [
        (optim.Adam, torch.optim.Adam, optim.adam, {"amsgrad": True, "maximize": True}),
        (optim.AdamW, torch.optim.AdamW, optim.adamw, {"amsgrad": True}),
        (optim.SGD, torch.optim.SGD, optim.sgd, {"maximize": True, "momentum": 0.9}),
        (optim.RMSprop, torch.optim.RMSprop, optim.rmsprop, {"maximize": True}),
    ],
)
def test_complex_parameters_with_the_options(ours, theirs, functional, kwargs, dtype):
    generator = torch.Generator().manual_seed(5)
    start = torch.randn(3, 4, dtype=dtype, generator=generator)
    grads = [torch.randn(3, 4, dtype=dtype, generator=generator) for _ in range(3)]
    kwargs = {"lr": 0.05, "weight_decay": 0.1, **kwargs}
    reference = torch.nn.Parameter(start.clone())
    torch_opt = theirs([reference], foreach=False, **kwargs)
    param = torch.nn.Parameter(start.clone())
    opt = ours([param], **kwargs)
    fn = functional(**kwargs)
    params = TensorDict({"w": start.clone()}, batch_size=[3])
    state = fn.init(params)
    for grad in grads:
        reference.grad, param.grad = grad.clone(), grad.clone()
        torch_opt.step()
        opt.step()
        updates, state = fn.update(TensorDict({"w": grad}, batch_size=[3]), state, params)
        params = optim.apply_updates(params, updates)
    # torch.optim adds L2 decay to a complex gradient in complex arithmetic, which can
    # round the last bits differently from the real pairs: equal within the dtype's rounding
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.complex64 else {"rtol": 1e-12, "atol": 0}
    torch.testing.assert_close(param.detach(), reference.detach(), **tol)
    torch.testing.assert_close(params["w"], reference.detach(), **tol)
    for name, value in torch_opt.state[reference].items():
        if name != "step" and value is not None:
            torch.testing.assert_close(opt.state[param][name], value, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [
        (optim.Adam, torch.optim.Adam, {"amsgrad": True, "maximize": True}),
        (optim.SGD, torch.optim.SGD, {"maximize": True, "momentum": 0.9, "nesterov": True}),
        (optim.RMSprop, torch.optim.RMSprop, {"maximize": True, "centered": True}),
    ],
)
def test_low_precision_parameters_with_the_options(ours, theirs, kwargs, dtype):
    """torch.optim's bits; where its two paths disagree (float16 centered RMSprop), one of them."""
    generator = torch.Generator().manual_seed(6)
    start = torch.randn(3, 4, generator=generator).to(dtype)
    grads = [torch.randn(3, 4, generator=generator).to(dtype) for _ in range(3)]
    references = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    param = torch.nn.Parameter(start.clone())
    torch_opts = [
        theirs([reference], lr=0.01, foreach=foreach, **kwargs)
        for reference, foreach in zip(references, (False, True))
    ]
    opt = ours([param], lr=0.01, **kwargs)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
        for reference, torch_opt in zip(references, torch_opts):
            reference.grad = grad.clone()
            torch_opt.step()
    assert any(torch.equal(param.detach(), reference.detach()) for reference in references)


def test_maximize_ascends_where_minimize_descends():
    """The sign, checked without torch.optim: one SGD step of each on f(w) = w."""
    params = {"w": torch.zeros(3)}
    grads = {"w": torch.ones(3)}
    for maximize, expected in [(False, -0.5), (True, 0.5)]:
        opt = optim.sgd(lr=0.5, maximize=maximize)
        updates, _ = opt.update(grads, opt.init(params), params)
        assert torch.equal(updates["w"], torch.full((3,), expected))


def test_amsgrad_divides_by_the_running_maximum():
    """Written out by hand: a large then a small gradient; the denominator keeps the large one."""
    lr, beta1, beta2, eps = 0.1, 0.9, 0.999, 1e-8
    opt = optim.adam(lr=lr, betas=(beta1, beta2), eps=eps, amsgrad=True)
    params = {"w": torch.zeros(1, dtype=torch.float64)}
    state = opt.init(params)
    m = v = v_max = 0.0
    w = 0.0
    for step, g in enumerate([10.0, 0.1, 0.1], start=1):
        updates, state = opt.update({"w": torch.full((1,), g, dtype=torch.float64)}, state, params)
        params = optim.apply_updates(params, updates)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        v_max = max(v_max, v)
        denom = (v_max**0.5) / (1 - beta2**step) ** 0.5 + eps
        w -= lr / (1 - beta1**step) * m / denom
        assert float(state["max_exp_avg_sq"]["w"]) == pytest.approx(v_max, rel=1e-12)
        assert float(params["w"]) == pytest.approx(w, rel=1e-12)
    assert float(state["max_exp_avg_sq"]["w"]) > float(state["exp_avg_sq"]["w"])


@pytest.mark.parametrize(
    ("ours", "theirs", "changes"),
    [
        (optim.Adam, torch.optim.Adam, [("maximize", True), ("amsgrad", False), ("lr", 0.2)]),
        (optim.SGD, torch.optim.SGD, [("maximize", True), ("momentum", 0.9), ("nesterov", True)]),
        (optim.RMSprop, torch.optim.RMSprop, [("maximize", True), ("centered", False)]),
    ],
)
def test_group_values_changed_between_steps_take_effect_as_in_torch_optim(ours, theirs, changes):
    """What a group's values decide (the stages to run) is made once per change, never stale."""
    generator = torch.Generator().manual_seed(8)
    start = torch.randn(3, 4, dtype=torch.float64, generator=generator)
    kwargs = {"amsgrad": True} if ours is optim.Adam else {}
    kwargs.update({"centered": True} if ours is optim.RMSprop else {})
    param = torch.nn.Parameter(start.clone())
    reference = torch.nn.Parameter(start.clone())
    opt = ours([param], lr=0.1, **kwargs)
    torch_opt = theirs([reference], lr=0.1, foreach=False, **kwargs)
    for change in [None, *changes]:
        if change is not None:
            opt.param_groups[0][change[0]] = torch_opt.param_groups[0][change[0]] = change[1]
        for _ in range(2):
            grad = torch.randn(3, 4, dtype=torch.float64, generator=generator)
            param.grad, reference.grad = grad.clone(), grad.clone()
            opt.step()
            torch_opt.step()
        assert torch.equal(param.detach(), reference.detach()), change


def test_a_state_without_the_maximum_is_refused_by_the_functional_amsgrad():
    params = {"w": torch.zeros(2)}
    plain_state = optim.adam(lr=0.1).init(params)
    with pytest.raises(ValueError, match=r"state must hold \['step', 'exp_avg', 'exp_avg_sq', "):
        optim.adam(lr=0.1, amsgrad=True).update({"w": torch.ones(2)}, plain_state, params)


def test_amsgrad_is_the_sixth_positional_argument_as_in_torch_optim():
    param = torch.nn.Parameter(torch.ones(2, 3))
    for cls in (optim.Adam, optim.AdamW):
        opt = cls([param], 1e-3, (0.9, 0.999), 1e-8, 0.0, True)
        assert opt.param_groups[0]["amsgrad"] is True
    assert optim.adam(1e-3, (0.9, 0.999), 1e-8, 0.0, True)._moments[-1] == "max_exp_avg_sq"


@pytest.mark.parametrize("lr", [float("nan"), -0.1, torch.tensor([1, 2])])
@pytest.mark.parametrize(("ours", "theirs"), STATEFUL)
def test_hostile_learning_rates_with_maximize_are_refused(ours, theirs, lr):
    param = torch.nn.Parameter(torch.ones(2, 3))
    error = TypeError if isinstance(lr, torch.Tensor) else ValueError
    with pytest.raises(error, match="lr"):
        ours([param], lr=lr, maximize=True)
    name = ours.__name__.lower()
    with pytest.raises(error, match=rf"tdfunc.optim.{name}: .*lr"):
        getattr(optim, name)(lr=lr, maximize=True)
