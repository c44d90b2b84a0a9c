"""Switches whose state entries a state made without them lacks (Adam's ``amsgrad`` and
its ``max_exp_avg_sq``, RMSprop's ``centered`` and its ``grad_avg``): where such a state
can come from, each against ``torch.optim`` given the same sequence, and what a step
costs when none can.

A state lacks the entry when it was made by a step while the switch was off, or came
with a load; ``torch.optim`` then fails with a ``KeyError``; tdfunc refuses the step
with a clear error before any parameter or state moves.
"""

from __future__ import annotations

import collections
import copy

import pytest
import torch

from tdfunc import optim


class _CountingState(collections.defaultdict):
    """``optimizer.state`` that counts the lookups made with ``get``."""

    gets = 0

    def get(self, key, default=None):
        type(self).gets += 1
        return super().get(key, default)


def _params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(20)]


def test_steps_with_nothing_switched_do_not_walk_the_states():
    params = _params()
    opt = optim.Adam(params, lr=0.1, amsgrad=True)
    for param in params:
        param.grad = torch.ones_like(param)
    opt.step()
    opt.state = _CountingState(dict, opt.state)
    _CountingState.gets = 0
    opt.step()  # new states object: looked at once
    first = _CountingState.gets
    for _ in range(3):
        opt.step()
    assert _CountingState.gets == first  # and not again while nothing changed
    opt.param_groups[0]["lr"] = 0.05  # a scheduler's change: a new plan, no new states
    opt.step()
    assert _CountingState.gets == first


def _switch_sequence(make, steps: list, flag: str) -> list:
    """Run ``steps`` on a fresh optimizer; record each step's outcome and parameters."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(2, 3)) for _ in range(2)]
    opt = make(params)
    out = []
    for action in steps:
        if action == "step":
            for index, param in enumerate(params):
                param.grad = torch.full_like(param, 0.5 + index)
            try:
                opt.step()
                out.append("ok")
            except (KeyError, ValueError):
                out.append("refused")
        elif action == "only_second":
            params[0].grad = None
            params[1].grad = torch.ones_like(params[1])
            try:
                opt.step()
                out.append("ok")
            except (KeyError, ValueError):
                out.append("refused")
        else:
            opt.param_groups[0][flag] = action == "on"
        out.append([p.detach().clone() for p in params])
    return out


SEQUENCES = [
    ["step", "on", "step"],  # switched on after steps: refused
    ["on", "step", "off", "step", "on", "step"],  # on, off (max kept), on again
    ["step", "on", "off", "step"],  # on then off before a step: nothing to refuse
    ["on", "step", "step", "off", "on", "step"],  # off and on with no step between
]


SWITCHES = [
    (optim.Adam, torch.optim.Adam, "amsgrad"),
    (optim.AdamW, torch.optim.AdamW, "amsgrad"),
    (optim.RMSprop, torch.optim.RMSprop, "centered"),
]


@pytest.mark.parametrize("sequence", SEQUENCES)
@pytest.mark.parametrize(("ours_cls", "theirs_cls", "flag"), SWITCHES)
def test_switching_follows_torch_optim(ours_cls, theirs_cls, flag, sequence):
    ours = _switch_sequence(lambda p: ours_cls(p, lr=0.1), sequence, flag)
    theirs = _switch_sequence(lambda p: theirs_cls(p, lr=0.1), sequence, flag)
    assert [o for o in ours if isinstance(o, str)] == [t for t in theirs if isinstance(t, str)]
    for mine, reference in zip(ours, theirs):
        if not isinstance(mine, str):
            for a, b in zip(mine, reference):
                torch.testing.assert_close(a, b)


def test_a_state_without_maximum_and_without_gradient_is_checked_again_later():
    """A parameter whose state lacks the maximum steps when it has a gradient again."""
    params = _params()[:2]
    opt = optim.Adam(params, lr=0.1)
    for param in params:
        param.grad = torch.ones_like(param)
    opt.step()
    opt.param_groups[0]["amsgrad"] = True
    params[0].grad = None
    with pytest.raises(ValueError, match=r"Adam.step: amsgrad=True.*shape \[3, 4\]"):
        opt.step()  # the second one still lacks it
    params[1].grad = None
    opt.step()  # nothing with a gradient lacks it: torch.optim steps nothing either
    params[0].grad = torch.ones_like(params[0])
    with pytest.raises(ValueError, match=r"Adam.step: amsgrad=True"):
        opt.step()


def test_a_loaded_state_without_maximum_is_refused_after_the_switch():
    params = _params()[:2]
    source = optim.Adam(copy.deepcopy(params), lr=0.1)
    for param in source.param_groups[0]["params"]:
        param.grad = torch.ones_like(param)
    source.step()
    opt = optim.Adam(params, lr=0.1, amsgrad=True)
    for param in params:
        param.grad = torch.ones_like(param)
    opt.step()  # checked once: every state has its maximum
    opt.load_state_dict(source.state_dict())  # amsgrad=False comes with it
    assert opt.param_groups[0]["amsgrad"] is False
    opt.param_groups[0]["amsgrad"] = True
    before = [p.detach().clone() for p in params]
    with pytest.raises(ValueError, match=r"Adam.step: amsgrad=True"):
        opt.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))


def test_a_state_written_by_hand_without_maximum_is_a_clear_error():
    params = _params()[:1]
    opt = optim.AdamW(params, lr=0.1, amsgrad=True)
    params[0].grad = torch.ones_like(params[0])
    opt.step()
    del opt.state[params[0]]["max_exp_avg_sq"]
    with pytest.raises(ValueError, match=r"AdamW.step: amsgrad=True.*max_exp_avg_sq"):
        opt.step()


@pytest.mark.parametrize(
    ("cls", "flag", "entry"),
    [(optim.Adam, "amsgrad", "max_exp_avg_sq"), (optim.RMSprop, "centered", "grad_avg")],
)
def test_states_put_back_by_hand_are_checked_before_any_group_steps(cls, flag, entry):
    """States replaced inside the same ``opt.state`` (``update``), the last group's
    lacking the entry: refused before the first group moves (torch.optim raises a
    ``KeyError`` after the first group has stepped)."""
    params = _params()[:2]
    opt = cls([{"params": params[:1]}, {"params": params[1:]}], lr=0.1, **{flag: True})
    for param in params:
        param.grad = torch.ones_like(param)
    opt.step()
    saved = {param: dict(state) for param, state in opt.state.items()}
    del saved[params[1]][entry]
    opt.state.clear()
    opt.state.update(saved)
    before = [p.detach().clone() for p in params]
    steps = [opt.state[p]["step"].clone() for p in params]
    with pytest.raises(ValueError, match=rf"{cls.__name__}.step: {flag}=True.*{entry}"):
        opt.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before))
    assert all(torch.equal(opt.state[p]["step"], s) for p, s in zip(params, steps))


def test_centered_switched_on_is_refused_before_anything_moves():
    params = _params()[:2]
    opt = optim.RMSprop([{"params": params[:1], "centered": True}, {"params": params[1:]}])
    for param in params:
        param.grad = torch.ones_like(param)
    opt.step()
    before = copy.deepcopy(([p.detach() for p in params], opt.state_dict()))
    opt.param_groups[1]["centered"] = True
    with pytest.raises(ValueError, match=r"RMSprop.step: centered=True.*'grad_avg'"):
        opt.step()
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before[0]))
    after = opt.state_dict()["state"]
    for index, state in before[1]["state"].items():
        for name, value in state.items():
            assert torch.equal(after[index][name], value), name  # the step counts too


def test_a_centered_state_dict_without_gradient_average_is_refused_before_loading():
    param = torch.nn.Parameter(torch.ones(2, 3))
    source = torch.optim.RMSprop([param], lr=0.1)
    param.grad = torch.ones_like(param)
    source.step()
    saved = source.state_dict()
    saved["param_groups"][0]["centered"] = True
    ours = optim.RMSprop([torch.nn.Parameter(torch.ones(2, 3))], lr=0.5)
    with pytest.raises(ValueError, match=r"load_state_dict: centered=True.*parameter 0.*grad_avg"):
        ours.load_state_dict(saved)
    assert ours.param_groups[0]["lr"] == 0.5 and not ours.state


def _momentum_sequence(make, steps: list) -> list:
    """SGD's momentum switched on and off, with some parameters without gradients."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(2, 3)) for _ in range(3)]
    opt = make(params)
    out = []
    for action in steps:
        if isinstance(action, tuple):  # the indices of the parameters with gradients
            for index, param in enumerate(params):
                param.grad = torch.full_like(param, 0.5 + index) if index in action else None
            opt.step()
            out.append([p.detach().clone() for p in params])
        elif action == "reload":
            opt.load_state_dict(copy.deepcopy(opt.state_dict()))
        else:
            opt.param_groups[0]["momentum"] = action
    return out


MOMENTUM_SEQUENCES = [
    [(0, 1, 2), 0.9, (0, 1, 2), (0, 1, 2)],
    [(0, 1, 2), 0.9, (0,), (1,), (0, 1, 2)],  # buffers started when each has a gradient
    [(0,), 0.9, (0, 1), 0.0, (2,), 0.5, (0, 1, 2)],
    [(0, 1, 2), "reload", 0.9, (1,), "reload", (0, 1, 2)],
]


@pytest.mark.parametrize("sequence", MOMENTUM_SEQUENCES)
@pytest.mark.parametrize("dampening", [0.0, 0.3])
def test_momentum_switched_on_follows_torch_optim(sequence, dampening):
    def ours(params):
        return optim.SGD(params, lr=0.1, dampening=dampening)

    def theirs(params):
        return torch.optim.SGD(params, lr=0.1, dampening=dampening)

    for mine, reference in zip(
        _momentum_sequence(ours, sequence), _momentum_sequence(theirs, sequence)
    ):
        for a, b in zip(mine, reference):
            torch.testing.assert_close(a, b)


def test_momentum_steps_do_not_walk_the_states():
    params = _params()
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    for param in params:
        param.grad = torch.ones_like(param)
    opt.step()
    opt.state = _CountingState(dict, opt.state)
    _CountingState.gets = 0
    opt.step()  # new states object: looked at once
    first = _CountingState.gets
    for _ in range(3):
        opt.step()
    assert _CountingState.gets == first


@pytest.mark.parametrize("removal", ["del", "none"])
def test_a_momentum_buffer_removed_by_hand_starts_again_as_in_torch_optim(removal):
    def run(cls):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(2, 3)) for _ in range(2)]
        opt = cls(params, lr=0.1, momentum=0.9, dampening=0.3)
        for step in range(4):
            for index, param in enumerate(params):
                param.grad = torch.full_like(param, 0.5 + index + step)
            opt.step()
            if step == 1:
                if removal == "del":
                    del opt.state[params[0]]["momentum_buffer"]
                else:
                    opt.state[params[0]]["momentum_buffer"] = None
        return [p.detach() for p in params]

    for mine, reference in zip(run(optim.SGD), run(torch.optim.SGD)):
        torch.testing.assert_close(mine, reference)
