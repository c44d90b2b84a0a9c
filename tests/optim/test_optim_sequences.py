"""Random sequences of what users do with a stateful optimizer, against N ``torch.optim``.

Each member of the stacked parameters has its own ``torch.optim`` instance over
ordinary tensors (the loop a user would write); after every operation (a step of
all or some members, gradients missing for some leaves, a new learning rate, a
scheduler step, a state-dict round trip) parameters and moments must agree.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optimizer_table import OPTIMIZERS, family

SHAPES = [(3,), (2, 2)]
TOLERANCE = {
    torch.float64: {"rtol": 1e-9, "atol": 1e-10},
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},
    torch.complex64: {"rtol": 1e-5, "atol": 1e-6},
    torch.float16: {"rtol": 1e-2, "atol": 1e-3},
}


@st.composite
def scenarios(draw):
    kind = draw(st.sampled_from(sorted(OPTIMIZERS)))
    members = draw(st.integers(1, 3))
    dtype = draw(st.sampled_from(sorted(TOLERANCE, key=str)))
    per_member = draw(st.booleans())
    lr = [draw(st.sampled_from([0.5, 0.1, 0.01])) for _ in range(members)] if per_member else 0.1
    kwargs = {"lr": lr}
    if family(kind) == "sgd":
        kwargs.update(momentum=draw(st.sampled_from([0.0, 0.9])))
        kwargs.update(weight_decay=draw(st.sampled_from([0.0, 0.1])))
    elif family(kind) == "rmsprop":
        kwargs.update(momentum=draw(st.sampled_from([0.0, 0.5])), centered=draw(st.booleans()))
        kwargs.update(alpha=draw(st.sampled_from([0.99, 0.5])))
    else:
        kwargs.update(weight_decay=draw(st.sampled_from([0.0, 0.1])))
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["step", "step", "subset", "lr", "schedule", "reload"]))
        if op in ("step", "subset"):
            missing = draw(st.lists(st.booleans(), min_size=len(SHAPES), max_size=len(SHAPES)))
            subset = None
            if op == "subset":
                subset = sorted(draw(st.sets(st.integers(0, members - 1), min_size=1)))
            ops.append(("step", draw(st.integers(0, 2**16)), missing, subset))
        elif op == "lr":
            values = [draw(st.sampled_from([0.2, 0.05])) for _ in range(members)]
            ops.append(("lr", values if per_member else values[0]))
        else:
            ops.append((op,))
    return kind, members, dtype, kwargs, ops


def member_lr(lr, index):
    # the number the member's tensor holds (float32), as the loop's optimizer gets it
    return float(as_hyper(lr)[index]) if isinstance(lr, list) else lr


def as_hyper(lr):
    return torch.tensor(lr) if isinstance(lr, list) else lr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_sequences_match_one_torch_optim_per_member(scenario):
    kind, members, dtype, kwargs, ops = scenario
    generator = torch.Generator().manual_seed(0)
    starts = [torch.randn(members, *s, generator=generator).to(dtype) for s in SHAPES]
    ours = [torch.nn.Parameter(start.clone()) for start in starts]
    row = OPTIMIZERS[kind]
    opt = row.stateful(ours, **{**kwargs, "lr": as_hyper(kwargs["lr"])})
    theirs = [[torch.nn.Parameter(start[i].clone()) for start in starts] for i in range(members)]
    torch_kind = row.torch
    references = [
        torch_kind(params, foreach=False, **{**kwargs, "lr": member_lr(kwargs["lr"], i)})
        for i, params in enumerate(theirs)
    ]
    scheduler = references_schedulers = None
    for op in ops:
        if op[0] == "step":
            _, seed, missing, subset = op
            grad_generator = torch.Generator().manual_seed(seed)
            grads = [torch.randn(p.shape, generator=grad_generator).to(dtype) for p in ours]
            for leaf, (param, grad) in enumerate(zip(ours, grads)):
                param.grad = None if missing[leaf] else grad.clone()
            opt.step(members=subset)
            for i in subset if subset is not None else range(members):
                for leaf, param in enumerate(theirs[i]):
                    param.grad = None if missing[leaf] else grads[leaf][i].clone()
                references[i].step()
        elif op[0] == "lr":
            opt.param_groups[0]["lr"] = as_hyper(op[1])
            for i, reference in enumerate(references):
                reference.param_groups[0]["lr"] = member_lr(op[1], i)
        elif op[0] == "schedule":
            if scheduler is None:
                scheduler = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
                references_schedulers = [
                    torch.optim.lr_scheduler.ExponentialLR(r, gamma=0.5) for r in references
                ]
            scheduler.step()
            for s in references_schedulers:
                s.step()
        else:  # a checkpoint and resume into a fresh optimizer
            saved = opt.state_dict()
            opt = row.stateful(ours, **{**kwargs, "lr": as_hyper(kwargs["lr"])})
            opt.load_state_dict(saved)
            scheduler = references_schedulers = None
            for i, reference in enumerate(references):
                saved = reference.state_dict()
                references[i] = torch_kind(theirs[i], foreach=False, **{**kwargs, "lr": 0.1})
                references[i].load_state_dict(saved)
        tolerance = TOLERANCE[dtype]
        for i in range(members):
            for leaf, param in enumerate(ours):
                reference = theirs[i][leaf]
                torch.testing.assert_close(param.detach()[i], reference.detach(), **tolerance)
                state, expected = opt.state.get(param, {}), references[i].state.get(reference, {})
                for name in row.moments:
                    if expected.get(name) is not None:
                        torch.testing.assert_close(state[name][i], expected[name], **tolerance)


@pytest.mark.parametrize("saver", ["adamw", "adam"])
def test_round_trips_across_classes_are_refused(saver):
    param = torch.nn.Parameter(torch.ones(2, 3))
    param.grad = torch.ones(2, 3)
    opt = OPTIMIZERS[saver].stateful([param], lr=0.1)
    opt.step()
    other = "adam" if saver == "adamw" else "adamw"
    with pytest.raises(ValueError, match="decoupled_weight_decay"):
        OPTIMIZERS[other].stateful([param], lr=0.1).load_state_dict(opt.state_dict())
