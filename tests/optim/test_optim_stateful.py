"""tdfunc.optim.SGD / Adam / AdamW over an Ensemble against torch.optim run per member."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from optimizer_table import OPTIMIZERS, cases
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from tdfunc import Ensemble, TensorDict, optim

N = 4
LRS = torch.tensor([1e-3, 1e-2, 3e-2, 1e-1])


def make_models(seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)) for _ in range(N)]


def member_value(value, index: int) -> float:
    return float(value[index]) if isinstance(value, torch.Tensor) else value


def member_kwargs(kwargs: dict, index: int) -> dict:
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, tuple):
            out[key] = tuple(member_value(v, index) for v in value)
        else:
            out[key] = member_value(value, index)
    return out


def train_both(ours, theirs, kwargs: dict, steps: int = 5, sign: float = 1.0):
    """Run ``ours`` over an Ensemble and ``theirs`` over N modules; return both.

    ``sign=-1`` gives an ascending optimizer the negated loss: a bounded run either way.
    """
    models = make_models()
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = ours(ensemble.parameters(), **kwargs)
    references = [theirs(m.parameters(), **member_kwargs(kwargs, i)) for i, m in enumerate(models)]
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(6, 3, generator=generator)
        opt.zero_grad()
        (sign * ensemble(x).pow(2).sum()).backward()
        opt.step()
        for model, reference in zip(models, references):
            reference.zero_grad()
            (sign * model(x).pow(2).sum()).backward()
            reference.step()
    return ensemble, opt, models, references


def assert_same(ensemble, opt, models, references, state_keys):
    expected = TensorDict.from_modules(*models)
    torch.testing.assert_close(ensemble.params.detach(), expected.detach())
    for stacked, *members in zip(
        ensemble.parameters(), *[m.parameters() for m in models], strict=True
    ):
        for key in state_keys:
            ours = opt.state[stacked][key]
            theirs = torch.stack([ref.state[p][key] for ref, p in zip(references, members)])
            if key == "step":
                assert float(ours) == float(theirs[0])
            else:
                torch.testing.assert_close(ours, theirs)


def torch_keys(row, references) -> tuple:
    """The state entries torch.optim keeps for every member (torch.optim.SGD keeps no
    state for a member without momentum)."""
    return tuple(
        key
        for key in ("step", *row.moments)
        if all(
            ref.state and all(state.get(key) is not None for state in ref.state.values())
            for ref in references
        )
    )


@pytest.mark.parametrize(("name", "kwargs"), cases(N))
def test_matches_torch_optim_per_member(name, kwargs):
    row = OPTIMIZERS[name]
    sign = -1.0 if row.maximize else 1.0
    ensemble, opt, models, references = train_both(row.stateful, row.torch, kwargs, sign=sign)
    assert_same(ensemble, opt, models, references, torch_keys(row, references))


def test_is_a_torch_optimizer_with_hooks():
    ensemble = Ensemble(*make_models())
    opt = optim.Adam(ensemble.parameters(), lr=LRS)
    assert isinstance(opt, torch.optim.Optimizer)
    calls = []
    opt.register_step_post_hook(lambda *args: calls.append(1))
    ensemble(torch.randn(2, 3)).sum().backward()
    loss = opt.step(lambda: torch.tensor(3.0))
    assert float(loss) == 3.0 and calls == [1]


def test_parameters_without_grad_are_skipped():
    p, q = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(2, 3))
    opt = optim.Adam([p, q], lr=torch.tensor([0.1, 0.2]))
    p.grad = torch.ones(2, 3)
    opt.step()
    assert torch.equal(q.detach(), torch.ones(2, 3)) and q not in opt.state
    torch.testing.assert_close(p.detach()[:, 0], torch.tensor([0.9, 0.8]))


@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam, optim.AdamW])
def test_state_dict_round_trip(cls):
    kwargs = {"lr": LRS.clone()} if cls is not optim.SGD else {"lr": LRS, "momentum": 0.9}
    ensemble, opt, *_ = train_both(cls, getattr(torch.optim, cls.__name__), kwargs, steps=2)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    twin = copy.deepcopy(ensemble)
    twin_opt = cls(twin.parameters(), **kwargs)
    twin_opt.load_state_dict(saved)
    assert isinstance(twin_opt.param_groups[0]["lr"], optim.PerMember)
    x = torch.randn(5, 3)
    for model, o in ((ensemble, opt), (twin, twin_opt)):
        o.zero_grad()
        model(x).sum().backward()
        o.step()
    torch.testing.assert_close(twin.params.detach(), ensemble.params.detach(), rtol=0, atol=0)


def test_step_lr_scales_per_member_lr():
    ensemble = Ensemble(*make_models())
    opt = optim.Adam(ensemble.parameters(), lr=LRS)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(3):
        ensemble(torch.randn(2, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
        scheduler.step()
    torch.testing.assert_close(opt.param_groups[0]["lr"].as_subclass(torch.Tensor), LRS / 8)
    torch.testing.assert_close(scheduler.get_last_lr()[0], LRS / 8)


def test_lambda_lr_matches_torch_per_member():
    """A scheduled per-member lr gives what N schedulers over N optimizers give."""
    models = make_models()
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = optim.SGD(ensemble.parameters(), lr=LRS, momentum=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 1.0 / (1 + epoch))
    references = [torch.optim.SGD(m.parameters(), lr=float(LRS[i]), momentum=0.5)
                  for i, m in enumerate(models)]  # fmt: skip
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 / (1 + e)) for o in references]
    for _ in range(4):
        x = torch.randn(3, 3)
        opt.zero_grad()
        ensemble(x).sum().backward()
        opt.step()
        scheduler.step()
        for model, o, s in zip(models, references, schedulers):
            o.zero_grad()
            model(x).sum().backward()
            o.step()
            s.step()
    torch.testing.assert_close(ensemble.params.detach(), TensorDict.from_modules(*models).detach())


def test_param_groups_do_not_share_a_scheduled_lr():
    p, q = nn.Parameter(torch.zeros(4, 2)), nn.Parameter(torch.zeros(4))
    opt = optim.SGD([{"params": [p]}, {"params": [q]}], lr=LRS)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    p.grad, q.grad = torch.ones(4, 2), torch.ones(4)
    opt.step()
    scheduler.step()
    for group in opt.param_groups:
        torch.testing.assert_close(group["lr"].as_subclass(torch.Tensor), LRS * 0.1)


# ------------------------------------------------------------------ bad input
def test_lr_length_must_match_leading_dim():
    ensemble = Ensemble(*make_models())
    with pytest.raises(ValueError, match=r"Adam: lr has 3 values, but a parameter of the group"):
        optim.Adam(ensemble.parameters(), lr=torch.tensor([0.1, 0.2, 0.3]))


@pytest.mark.parametrize(
    ("cls", "kwargs", "error", "message"),
    [
        (optim.Adam, {"lr": -0.1}, ValueError, r"Adam: lr must be >= 0.0, got -0.1"),
        (optim.Adam, {"betas": (0.9, 1.0)}, ValueError, r"betas\[1\] must be >= 0.0 and < 1.0"),
        (optim.Adam, {"betas": 0.9}, TypeError, "betas must be a pair"),
        (optim.AdamW, {"lr": "fast"}, TypeError, "lr must be a float or a tensor"),
        (optim.SGD, {"lr": 0.1, "nesterov": True}, ValueError, "nesterov=True needs momentum"),
        (optim.SGD, {"lr": torch.tensor([1, 2, 3, 4])}, TypeError, "floating dtype"),
        (optim.SGD, {"lr": torch.ones(4, 1)}, ValueError, r"shape \[N\]"),
    ],
)
def test_bad_hyperparameters(cls, kwargs, error, message):
    ensemble = Ensemble(*make_models())
    with pytest.raises(error, match=message):
        cls(ensemble.parameters(), **kwargs)


# ------------------------------------------------------------------ torch.optim machinery
def test_step_hooks_and_profiler_label_as_torch_optim():
    ensemble = Ensemble(*make_models())
    opt = optim.Adam(ensemble.parameters(), lr=LRS)
    calls = []

    def pre_hook(optimizer, args, kwargs):
        calls.append(("pre", optimizer is opt))
        return args, {"closure": lambda: torch.tensor(5.0)}

    handles = [
        opt.register_step_pre_hook(pre_hook),
        opt.register_step_post_hook(lambda optimizer, args, kwargs: calls.append(("post", kwargs))),
        register_optimizer_step_pre_hook(
            lambda optimizer, args, kwargs: calls.append(("global", None))
        ),
    ]
    try:
        ensemble(torch.randn(2, 3)).sum().backward()
        with torch.profiler.profile() as profiler:
            loss = opt.step()
    finally:
        for handle in handles:
            handle.remove()
    assert float(loss) == 5.0
    assert [name for name, _ in calls] == ["global", "pre", "post"] and calls[1][1]
    names = {event.name for event in profiler.events()}
    assert "Optimizer.step#Adam.step" in names
    opt.step()  # no hook left, no profiler: nothing recorded
    assert len(calls) == 3


def test_parameters_started_at_different_steps_match_torch():
    """Step counters of parameters whose gradients appear at different steps."""
    models = make_models()
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = optim.Adam(ensemble.parameters(), lr=LRS)
    references = [torch.optim.Adam(m.parameters(), lr=float(LRS[i])) for i, m in enumerate(models)]
    generator = torch.Generator().manual_seed(5)
    for index in range(5):
        x = torch.randn(6, 3, generator=generator)
        for module, optimizer in [(ensemble, opt), *zip(models, references)]:
            optimizer.zero_grad()
            module(x).pow(2).sum().backward()
            for name, param in module.named_parameters():
                if index < 2 and name.endswith("bias"):  # biases start training at step 3
                    param.grad = None
            optimizer.step()
    assert_same(ensemble, opt, models, references, ("step", "exp_avg", "exp_avg_sq"))


def test_state_dict_loads_into_torch_optim_adam():
    """A stacked state with float hyperparameters continues in torch.optim.Adam unchanged."""
    ensemble, opt, *_ = train_both(optim.Adam, torch.optim.Adam, {"lr": 0.01}, steps=3)
    twin = copy.deepcopy(ensemble)
    theirs = torch.optim.Adam(twin.parameters(), lr=0.01)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    theirs.load_state_dict(torch.load(buffer, weights_only=True))
    x = torch.randn(5, 3)
    for module, optimizer in ((ensemble, opt), (twin, theirs)):
        for _ in range(2):
            optimizer.zero_grad()
            module(x).pow(2).sum().backward()
            optimizer.step()
    torch.testing.assert_close(twin.params.detach(), ensemble.params.detach(), rtol=0, atol=0)
    for ours, other in zip(ensemble.parameters(), twin.parameters()):
        assert float(opt.state[ours]["step"]) == float(theirs.state[other]["step"]) == 5.0


def test_a_per_member_value_is_refused_for_a_shared_tensor_whose_size_equals_n():
    # the shared weight is [3, 3] with 3 members: its size alone would pass for stacked
    ensemble = Ensemble(
        nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)), num_members=3, shared=["0.weight"]
    )
    per_member = torch.tensor([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"keeps shared .*no member dim"):
        optim.Adam(list(ensemble.parameters()), lr=per_member)
    with pytest.raises(ValueError, match="keeps shared"):
        optim.SGD([{"params": list(ensemble.parameters()), "lr": per_member}], lr=0.1)
    # a float is fine for every tensor, and a per-member value for the stacked ones
    optim.Adam(list(ensemble.parameters()), lr=0.1)
    stacked = [p for name, p in ensemble.named_parameters() if name != "stacked.0.weight"]
    optim.Adam(stacked, lr=per_member)
