"""Param groups of the stateful optimizers: every door checked, member dims declared, subsets.

References: N ``torch.optim`` instances over N ordinary modules.
"""

from __future__ import annotations

import copy

import pytest
import torch
from optimizer_table import OPTIMIZERS, cases, member_kwargs
from torch import nn

from tdfunc import Ensemble, TensorDict, optim

N = 4
LRS = torch.tensor([1e-3, 1e-2, 3e-2, 1e-1])


def make_models(n: int = N, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Linear(3, 2) for _ in range(n)]


def stepped(opt, ensemble, x, sign: float = 1.0) -> None:
    opt.zero_grad()
    (sign * ensemble(x).pow(2).sum()).backward()
    opt.step()


# ------------------------------------------------------------------ every door
@pytest.mark.parametrize("length", [1, N + 1])
@pytest.mark.parametrize("cls", [optim.SGD, optim.Adam])
def test_load_state_dict_checks_per_member_lengths_before_loading(cls, length):
    other = Ensemble(*make_models(length))
    saved_opt = cls(other.parameters(), lr=torch.linspace(0.1, 0.2, length))
    stepped(saved_opt, other, torch.randn(2, 3))
    ensemble = Ensemble(*make_models())
    opt = cls(ensemble.parameters(), lr=LRS)
    with pytest.raises(ValueError, match=rf"load_state_dict: lr has {length} values"):
        opt.load_state_dict(saved_opt.state_dict())
    torch.testing.assert_close(opt.param_groups[0]["lr"].as_subclass(torch.Tensor), LRS)
    assert not opt.state


EDITS = [
    (torch.tensor([0.5]), ValueError, r"lr has 1 values"),
    (torch.ones(N + 1), ValueError, r"lr has 5 values"),
    (torch.ones(N, 1), ValueError, r"a tensor lr must have shape \[N\]"),
    (-1.0, ValueError, r"lr must be >= 0.0, got -1.0"),
    ("fast", TypeError, r"lr must be a float or a tensor"),
]


@pytest.mark.parametrize("write", ["assign", "update"])
@pytest.mark.parametrize(("value", "error", "message"), EDITS)
def test_param_group_writes_are_checked_at_the_next_step(value, error, message, write):
    ensemble = Ensemble(*make_models())
    opt = optim.Adam(ensemble.parameters(), lr=LRS)
    stepped(opt, ensemble, torch.randn(2, 3))
    before = ensemble.params.detach().clone()
    if write == "assign":
        opt.param_groups[0]["lr"] = value
    else:
        opt.param_groups[0].update({"lr": value})
    with pytest.raises(error, match=rf"^Adam.step: {message}"):
        stepped(opt, ensemble, torch.randn(2, 3))
    torch.testing.assert_close(ensemble.params.detach(), before, rtol=0, atol=0)


def test_a_new_per_member_lr_is_used_and_scheduled():
    models = make_models()
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = optim.SGD(ensemble.parameters(), lr=0.1)
    opt.param_groups[0]["lr"] = LRS.clone()
    references = [torch.optim.SGD(m.parameters(), lr=float(lr)) for m, lr in zip(models, LRS)]
    x = torch.randn(2, 3)
    stepped(opt, ensemble, x)  # checks the new value and keeps it schedulable
    for model, o in zip(models, references):
        stepped(o, model, x)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in references]
    for _ in range(3):
        x = torch.randn(2, 3)
        stepped(opt, ensemble, x)
        scheduler.step()
        for model, o, s in zip(models, references, schedulers):
            stepped(o, model, x)
            s.step()
    torch.testing.assert_close(ensemble.params.detach(), TensorDict.from_modules(*models).detach())


def test_a_scheduler_writing_one_value_for_all_members_is_refused():
    ensemble = Ensemble(*make_models())
    opt = optim.SGD(ensemble.parameters(), lr=LRS)
    with pytest.raises(ValueError, match=r"shape \[4\] was written with a tensor of shape \[1\]"):
        opt.param_groups[0]["lr"].fill_(torch.tensor([0.5]))


def test_reduce_lr_on_plateau_of_torch_refuses_a_per_member_lr_clearly():
    ensemble = Ensemble(*make_models())
    opt = optim.SGD(ensemble.parameters(), lr=LRS)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    with pytest.raises(TypeError, match=r"use tdfunc.optim.ReduceLROnPlateau"):
        for _ in range(3):
            scheduler.step(1.0)


# ------------------------------------------------------------------ declared member dims
def shared_models(n: int = N) -> list[nn.Module]:
    # the shared bias has N entries: its size equals the member count by coincidence
    torch.manual_seed(0)
    bias = nn.Parameter(torch.randn(n))
    models = []
    for _ in range(n):
        model = nn.Linear(3, n)
        model.bias = bias
        models.append(model)
    return models


def test_ensemble_groups_declare_shared_tensors_without_a_member_dim():
    ensemble = Ensemble(*shared_models(), shared=["bias"])
    opt = optim.Adam(ensemble, lr=0.1)
    assert [g["member_dim"] for g in opt.param_groups] == [True, False]
    assert opt.param_groups[1]["params"][0].shape == (N,)
    with pytest.raises(ValueError, match=r"declared without a member dim"):
        optim.Adam(ensemble, lr=LRS)
    with pytest.raises(ValueError, match=r"declared without a member dim"):
        optim.SGD(ensemble[[0, 1]], lr=LRS)


def shared_and_stacked(ensemble) -> dict:
    """The ensemble's stacked weight and its shared bias (its size equals N), as given."""
    stacked, shared = (g["params"] for g in optim.Adam(ensemble).param_groups)
    return {"weight": stacked[0], "bias": shared[0]}


def test_functional_update_refuses_a_per_member_value_for_a_shared_parameter():
    """The gradients are fresh tensors: only the parameters carry what the ensemble shares."""
    ensemble = Ensemble(*shared_models(), shared=["bias"])
    params = shared_and_stacked(ensemble)  # as a user collects them: the tensors themselves
    grads = {k: torch.ones_like(v) for k, v in params.items()}
    opt = optim.sgd(lr=LRS)
    with pytest.raises(
        ValueError, match=r"sgd\(\.\.\.\)\.update: lr has shape \[4\].*'bias'.*shared"
    ):
        opt.update(grads, opt.init(params), params)
    per_leaf = optim.sgd(lr={"weight": LRS.reshape(N, 1, 1), "bias": torch.tensor(0.1)})
    per_leaf.update(grads, per_leaf.init(params), params)  # a per-leaf tree is the way


def test_compiled_update_checks_shared_parameters_and_compiles_once():
    """Under torch.compile the mark is checked (it was skipped: only shapes were), without
    a graph per step for fresh parameters and gradients."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    ensemble = Ensemble(*shared_models(), shared=["bias"])
    shared = shared_and_stacked(ensemble)
    opt = optim.adam(lr=LRS)
    counter = CompileCounter()
    update = torch.compile(opt.update, backend=counter, fullgraph=True)
    params = {"weight": torch.randn(N, N, 3), "bias": torch.randn(N, 1)}
    state = eager_state = opt.init(params)
    eager = params
    for seed in range(3):  # fresh parameters and gradients every step
        generator = torch.Generator().manual_seed(seed)
        grads = {k: torch.randn(v.shape, generator=generator) for k, v in params.items()}
        updates, state = update(grads, state, params)
        params = optim.apply_updates(params, updates)
        expected, eager_state = opt.update(grads, eager_state, eager)
        eager = optim.apply_updates(eager, expected)
        for key in params:
            torch.testing.assert_close(params[key], eager[key])
    assert counter.frame_count == 1
    marked = {"weight": params["weight"], "bias": shared["bias"]}
    grads = {k: torch.ones_like(v) for k, v in marked.items()}
    with pytest.raises(Exception, match="keeps shared"):
        update(grads, opt.init(marked), marked)


def test_per_member_lr_with_a_shared_tensor_matches_a_loop():
    models = shared_models()
    ensemble = Ensemble(*copy.deepcopy(models), shared=["bias"])
    stacked, shared = (g["params"] for g in optim.Adam(ensemble).param_groups)
    opt = optim.Adam(
        [{"params": stacked}, {"params": shared, "lr": 0.05, "member_dim": False}], lr=LRS
    )
    references = [torch.optim.Adam([m.weight], lr=float(lr)) for m, lr in zip(models, LRS)]
    bias_opt = torch.optim.Adam([models[0].bias], lr=0.05)
    for _ in range(3):
        x = torch.randn(2, 3)
        stepped(opt, ensemble, x)
        for o in (*references, bias_opt):
            o.zero_grad()
        sum(m(x).pow(2).sum() for m in models).backward()
        for o in (*references, bias_opt):
            o.step()
    expected = torch.stack([m.weight.detach() for m in models])
    torch.testing.assert_close(ensemble.stacked.weight.detach(), expected)
    torch.testing.assert_close(ensemble.stacked.bias.detach(), models[0].bias.detach())


# ------------------------------------------------------------------ member subsets
SUBSETS = [[0, 2], [1], slice(0, 4), [3, 0], torch.tensor([True, False, False, True])]


# torch.optim.SGD's first step of a member is not damped: a step of some members with
# dampening is refused (below), every other case of the table steps subsets
@pytest.mark.parametrize(("name", "kwargs"), cases(N, where=lambda _, k: not k.get("dampening")))
@pytest.mark.parametrize("by_selection", [False, True])
def test_stepping_a_member_subset_matches_a_loop_stepping_those_members(name, kwargs, by_selection):
    row = OPTIMIZERS[name]
    sign = -1.0 if row.maximize else 1.0  # an ascending optimizer: the negated loss
    models = make_models()
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = row.stateful(ensemble, **kwargs)
    references = [
        row.torch(model.parameters(), foreach=False, **member_kwargs(kwargs, index))
        for index, model in enumerate(models)
    ]
    for subset in SUBSETS:
        x = torch.randn(2, 3)
        selection = ensemble[subset]
        opt.zero_grad()
        (sign * selection(x).pow(2).sum()).backward()
        opt.step(members=selection if by_selection else subset)
        for index in selection.indices:
            references[index].zero_grad()
            (sign * models[index](x).pow(2).sum()).backward()
            references[index].step()
    expected = TensorDict.from_modules(*models).detach()
    torch.testing.assert_close(ensemble.params.detach(), expected)
    # a whole step afterwards continues every member from its own count
    x = torch.randn(2, 3)
    stepped(opt, ensemble, x, sign)
    for model, reference in zip(models, references):
        stepped(reference, model, x, sign)
    torch.testing.assert_close(ensemble.params.detach(), TensorDict.from_modules(*models).detach())


@pytest.mark.parametrize(
    ("members", "error", "message"),
    [
        ([0, 0], ValueError, "repeat a member"),
        ([7], IndexError, "out of range"),
        (torch.tensor([True, False]), ValueError, r"mask must have shape \[4\]"),
        ([0.5], TypeError, "member indices or a bool mask"),
    ],
)
def test_bad_member_subsets_are_refused_before_any_change(members, error, message):
    ensemble = Ensemble(*make_models())
    opt = optim.Adam(ensemble, lr=0.1)
    ensemble(torch.randn(2, 3)).sum().backward()
    before = ensemble.params.detach().clone()
    with pytest.raises(error, match=message):
        opt.step(members=members)
    torch.testing.assert_close(ensemble.params.detach(), before, rtol=0, atol=0)


def test_sgd_subset_with_dampening_is_refused():
    ensemble = Ensemble(*make_models())
    opt = optim.SGD(ensemble, lr=0.1, momentum=0.9, dampening=0.5)
    ensemble(torch.randn(2, 3)).sum().backward()
    with pytest.raises(ValueError, match="dampening"):
        opt.step(members=[0])


# ------------------------------------------------------------------ schedulers
@pytest.mark.parametrize(
    "kwargs",
    [
        {"patience": 0, "factor": 0.5},
        {"patience": 1, "factor": 0.3, "cooldown": 1, "mode": "max", "threshold_mode": "abs"},
        {"patience": 0, "factor": 0.5, "min_lr": 4e-3},
    ],
)
def test_reduce_lr_on_plateau_per_member_matches_one_scheduler_per_member(kwargs):
    ensemble = Ensemble(*make_models())
    opt = optim.SGD(ensemble, lr=LRS.clone())
    scheduler = optim.ReduceLROnPlateau(opt, **kwargs)
    models = make_models()
    references = [torch.optim.SGD(m.parameters(), lr=float(lr)) for m, lr in zip(models, LRS)]
    schedulers = [torch.optim.lr_scheduler.ReduceLROnPlateau(o, **kwargs) for o in references]
    generator = torch.Generator().manual_seed(0)
    for _ in range(8):
        metrics = torch.randint(0, 3, (N,), generator=generator).double()
        scheduler.step(metrics)
        for metric, s in zip(metrics.tolist(), schedulers):
            s.step(metric)
        expected = torch.tensor([o.param_groups[0]["lr"] for o in references])
        torch.testing.assert_close(
            opt.param_groups[0]["lr"].as_subclass(torch.Tensor), expected.float()
        )


def test_reduce_lr_on_plateau_per_member_refuses_what_it_cannot_follow():
    p = nn.Parameter(torch.zeros(N, 2))
    with pytest.raises(ValueError, match="not one value per member"):
        optim.ReduceLROnPlateau(optim.SGD([p], lr=0.1))
    scheduler = optim.ReduceLROnPlateau(optim.SGD([p], lr=LRS))
    with pytest.raises(ValueError, match=r"one metric per member \(4\), got 3"):
        scheduler.step([1.0, 2.0, 3.0])


@pytest.mark.parametrize("copier", ["deepcopy", "pickle"])
def test_copied_optimizer_steps_and_schedules_its_own_per_member_lr(copier):
    import io
    import pickle

    models = make_models()
    ensemble = Ensemble(*copy.deepcopy(models))
    opt = optim.Adam(ensemble.parameters(), lr=LRS)
    references = [torch.optim.Adam(m.parameters(), lr=float(lr)) for m, lr in zip(models, LRS)]
    x = torch.randn(2, 3)
    stepped(opt, ensemble, x)
    for model, o in zip(models, references):
        stepped(o, model, x)
    if copier == "deepcopy":
        ensemble, opt = copy.deepcopy((ensemble, opt))
    else:
        buffer = io.BytesIO()
        pickle.dump((ensemble, opt), buffer)
        ensemble, opt = pickle.loads(buffer.getvalue())
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in references]
    for _ in range(2):
        x = torch.randn(2, 3)
        stepped(opt, ensemble, x)
        for model, o in zip(models, references):
            stepped(o, model, x)
        scheduler.step()
        for s in schedulers:
            s.step()
    torch.testing.assert_close(ensemble.params.detach(), TensorDict.from_modules(*models).detach())


def test_a_plain_per_member_lr_written_before_a_scheduler_is_made_is_schedulable():
    param = nn.Parameter(torch.zeros(N, 2))
    opt = optim.SGD([param], lr=0.1)
    opt.param_groups[0]["lr"] = LRS.clone()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    param.grad = torch.ones(N, 2)
    opt.step()
    scheduler.step()
    torch.testing.assert_close(opt.param_groups[0]["lr"].as_subclass(torch.Tensor), LRS / 2)
    torch.testing.assert_close(param.detach()[:, 0], -LRS)


def test_a_bad_value_leaves_the_groups_readable_to_fix_it():
    param = nn.Parameter(torch.zeros(N, 2))
    opt = optim.SGD([param], lr=0.1)
    opt.param_groups[0]["lr"] = torch.ones(N + 1)
    param.grad = torch.ones(N, 2)
    with pytest.raises(ValueError, match="lr has 5 values"):
        opt.step()
    opt.param_groups[0]["lr"] = 0.5
    opt.step()
    torch.testing.assert_close(param.detach(), torch.full((N, 2), -0.5))


@pytest.mark.parametrize(
    "bad",
    [
        {"lr": torch.tensor([0.1, 0.2])},  # one value short
        {"lr": torch.tensor([[0.1], [0.2], [0.3]])},  # [N, 1]
        {"weight_decay": torch.tensor([0.1, 0.2, 0.3]), "member_dim": False},
        {"lr": "fast"},
    ],
)
@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW, optim.SGD, optim.RMSprop])
def test_a_refused_param_group_is_not_kept(cls, bad):
    """The group torch.optim appended is taken back: the optimizer steps as before,
    and the same parameters can be added again with good values."""
    first = nn.Parameter(torch.ones(3, 2))
    second = nn.Parameter(torch.ones(3, 4))
    opt = cls([first], lr=0.1)
    reference = torch.optim.__dict__[cls.__name__]([nn.Parameter(torch.ones(3, 2))], lr=0.1)
    with pytest.raises((TypeError, ValueError), match=cls.__name__):
        opt.add_param_group({"params": [second], **bad})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [second], "lr": torch.tensor([0.1, 0.2, 0.3])})
    first.grad = torch.ones(3, 2)
    second.grad = torch.ones(3, 4)
    reference.param_groups[0]["params"][0].grad = torch.ones(3, 2)
    opt.step()
    reference.step()
    torch.testing.assert_close(first.detach(), reference.param_groups[0]["params"][0].detach())
    assert not torch.equal(second.detach(), torch.ones(3, 4))
