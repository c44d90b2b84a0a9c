"""Target networks as RL users update them, against ``torch.no_grad`` parameter loops.

``TensorDict.from_module(q)`` holds the module's own tensors: a Polyak update
(``lerp_``, or ``mul_`` then ``add_``), a hard update (``copy_``) or ``update_``
on it changes the target module, which a loop over ``parameters()`` and
``buffers()`` does by hand. An update that cannot apply to every entry (an
integer buffer such as batch norm's ``num_batches_tracked``) changes nothing and
names the entry.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import TensorDict

TAU = 0.1


def critic() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def floating(td: TensorDict) -> TensorDict:
    return td.select(*[k for k, v in td.items(True, True) if v.is_floating_point()])


def train_step(q: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))
    opt.zero_grad()
    q(x).pow(2).mean().backward()
    opt.step()


def plain_update(target: nn.Module, source: nn.Module, rule: str) -> None:
    with torch.no_grad():
        pairs = list(zip(target.parameters(), source.parameters()))
        pairs += [
            (t, s) for t, s in zip(target.buffers(), source.buffers()) if t.is_floating_point()
        ]
        for t, s in pairs:
            if rule == "lerp":
                t.lerp_(s, TAU)
            elif rule == "mul_add":
                t.mul_(1 - TAU).add_(s * TAU)
            else:
                t.copy_(s)


@pytest.mark.parametrize("rule", ["lerp", "mul_add", "copy"])
def test_polyak_updates_through_from_module_match_a_parameter_loop(rule):
    q = critic()
    target, reference = copy.deepcopy(q), copy.deepcopy(q)
    opt = torch.optim.SGD(q.parameters(), lr=0.1)
    source_params = floating(TensorDict.from_module(q))
    target_params = floating(TensorDict.from_module(target))
    weight = target[0].weight
    for step in range(4):
        train_step(q, opt, step)
        with torch.no_grad():
            if rule == "lerp":
                target_params.lerp_(source_params, TAU)
            elif rule == "mul_add":
                target_params.mul_(1 - TAU).add_(source_params * TAU)
            else:
                target_params.copy_(source_params)
        plain_update(reference, q, rule)
        for (name, a), b in zip(target.state_dict().items(), reference.state_dict().values()):
            torch.testing.assert_close(a, b, msg=name)
    assert target[0].weight is weight and isinstance(weight, nn.Parameter)


def test_update_and_to_module_match_a_parameter_loop():
    q = critic()
    target, reference = copy.deepcopy(q), copy.deepcopy(q)
    params = TensorDict.from_module(target)
    shifted = TensorDict.from_module(q).apply(lambda t: t + 1)
    with torch.no_grad():
        params.update_(shifted)
        for t, s in zip(reference.state_dict().values(), q.state_dict().values()):
            t.copy_(s + 1)
    for a, b in zip(target.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)
    halved = floating(TensorDict.from_module(q)).detach().clone() * 0.5
    halved.to_module(target)
    with torch.no_grad():
        for t, s in zip(reference.parameters(), q.parameters()):
            t.copy_(s * 0.5)
        reference[1].running_mean.copy_(q[1].running_mean * 0.5)
        reference[1].running_var.copy_(q[1].running_var * 0.5)
    for a, b in zip(target.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)
    assert isinstance(target[0].weight, nn.Parameter)


@pytest.mark.parametrize(
    "update",
    [
        lambda t, s: t.lerp_(s, TAU),
        lambda t, s: t.mul_(1 - TAU),
        lambda t, s: t.add_(s.apply(lambda v: v.float())),
        lambda t, s: t.div_(2),
    ],
    ids=["lerp_", "mul_", "add_", "div_"],
)
def test_an_update_that_cannot_reach_an_integer_buffer_changes_nothing(update):
    q = critic()
    target = copy.deepcopy(q)
    params, before = TensorDict.from_module(target), copy.deepcopy(target.state_dict())
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"num_batches_tracked.*no entry"):
        update(params, TensorDict.from_module(q))
    for name, value in target.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.parametrize("method", ["add_", "mul_", "maximum_", "clamp_min_", "lerp_"])
def test_an_operand_of_the_wrong_shape_changes_nothing(method):
    params = TensorDict({"a": torch.zeros(3), "b": {"c": torch.zeros(2)}}, [])
    other = TensorDict({"a": torch.ones(3), "b": {"c": torch.ones(5)}}, [])
    args = (TAU,) if method == "lerp_" else ()
    with pytest.raises(RuntimeError, match=r"\('b', 'c'\).*no entry was changed"):
        getattr(params, method)(other, *args)
    assert not params["a"].any()


@pytest.mark.parametrize("method", ["clamp_min_", "pow_", "maximum_"])
def test_a_pointwise_update_that_cannot_reach_an_integer_entry_changes_nothing(method):
    params = TensorDict({"a": torch.full((3,), 2.0), "n": torch.ones((), dtype=torch.long)}, [])
    with pytest.raises(RuntimeError, match=r"'n'.*no entry was changed"):
        getattr(params, method)(0.5)
    assert torch.equal(params["a"], torch.full((3,), 2.0))
