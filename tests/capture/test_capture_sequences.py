"""Random sequences of what users do between captured steps, against a loop of modules.

Between steps a user loads new values into the ensemble, changes a learning rate,
switches to eval mode and back, feeds a batch of the wrong shape, or puts back a
snapshot of the carry. After every action the ensemble's parameters are compared
with one ``torch.optim.Adam`` per member given the same actions; a refused action
must change nothing.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from capture_loop import OptimLoop, batches, members
from test_capture_step import KEYS, LOOP_TOLERANCE, leaf, make_step

from tdfunc import Ensemble, capture_step, optim


def assert_same(ensemble, loop) -> None:
    for key in KEYS:
        torch.testing.assert_close(
            leaf(ensemble.params, key).detach(), loop.stacked(key), **LOOP_TOLERANCE
        )


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_follow_the_loop(seed):
    rng = random.Random(seed)
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.Adam(p, lr=0.01))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    lr = torch.tensor(0.01)
    opt = optim.adam(lr=lr)
    data = batches(6, seed=seed)
    step = capture_step(make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)),
                        *data[0])  # fmt: skip
    snapshot = None
    for _ in range(14):
        action = rng.choice(["step", "step", "step", "load", "lr", "eval", "bad", "snap", "back"])
        if action == "step":
            x, y = rng.choice(data)
            torch.testing.assert_close(step(x, y), loop.step(x, y), **LOOP_TOLERANCE)
        elif action == "load":  # new values copied into the same tensors
            fresh = members()
            ensemble.load_member_state_dicts([model.state_dict() for model in fresh])
            for model, new in zip(loop.models, fresh):
                model.load_state_dict(new.state_dict())
        elif action == "lr":
            value = rng.choice([0.001, 0.005, 0.02])
            lr.fill_(value)
            for optimizer in loop.optimizers:
                optimizer.param_groups[0]["lr"] = value
        elif action == "eval":
            ensemble.eval()
            with pytest.raises(RuntimeError, match="eval mode now"):
                step(*data[0])
            ensemble.train()
        elif action == "bad":
            x, y = data[0]
            with pytest.raises(ValueError, match="the step was captured for"):
                step(x[:, :3], y[:, :3])
        elif action == "snap":
            snapshot = (
                torch.utils._pytree.tree_map(torch.clone, step.carry),
                copy.deepcopy([m.state_dict() for m in loop.models]),
                copy.deepcopy([o.state_dict() for o in loop.optimizers]),
            )
        elif action == "back" and snapshot is not None:
            carry, states, optimizer_states = snapshot
            with torch.no_grad():
                for mine, saved in zip(
                    torch.utils._pytree.tree_leaves(step.carry),
                    torch.utils._pytree.tree_leaves(carry),
                ):
                    mine.copy_(saved)
            for model, optimizer, state, optimizer_state in zip(
                loop.models, loop.optimizers, states, optimizer_states
            ):
                model.load_state_dict(state)
                optimizer.load_state_dict(optimizer_state)
                for group in optimizer.param_groups:  # the lr now in force, as ours
                    group["lr"] = float(lr)
        assert_same(ensemble, loop)
