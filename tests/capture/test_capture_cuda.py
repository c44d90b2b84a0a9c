"""``capture_step`` on a CUDA device: the step is recorded once and replayed.

Skipped where no CUDA device is present; the same body, checks and refusals run on
the CPU in ``test_capture_step.py``. Here the replays are compared with one
``torch.optim`` optimizer per member module on the same device.
"""

from __future__ import annotations

import copy

import pytest
import torch
from capture_loop import OptimLoop, batches, members
from torch.func import grad_and_value

from tdfunc import Ensemble, capture_step, optim

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda", 0)
LOOP_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}


def make_step(ensemble, opt):
    def train_step(carry, x, y):
        params, state = carry

        def loss(p):
            losses = ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2))
            return losses.sum(), losses

        grads, losses = grad_and_value(loss, has_aux=True)(params)
        updates, state = opt.update(grads, state, params)
        return (optim.apply_updates(params, updates), state), losses[1]

    return train_step


@pytest.mark.parametrize("compiled", [False, True])
def test_replays_equal_one_torch_optim_per_member(compiled):
    models = [model.to(CUDA) for model in members()]
    loop = OptimLoop(models, lambda p: torch.optim.Adam(p, lr=0.01))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=0.01)
    train_step = make_step(ensemble, opt)
    if compiled:
        torch._dynamo.reset()
        train_step = torch.compile(train_step, fullgraph=True)
    data = [(x.to(CUDA), y.to(CUDA)) for x, y in batches(5)]
    before = ensemble.params.detach().clone()
    step = capture_step(train_step, (ensemble.params, opt.init(ensemble.params)), *data[0])
    assert step.captured
    assert (ensemble.params == before).all()  # warm-up undone, capture ran nothing
    kept = []
    for x, y in data:
        losses = step(x, y)
        kept.append(losses)
        expected = loop.step(x, y)
        torch.testing.assert_close(losses, expected, **LOOP_TOLERANCE)
    for key in ("0.weight", "2.bias"):
        torch.testing.assert_close(
            ensemble.params[tuple(key.split("."))], loop.stacked(key), **LOOP_TOLERANCE
        )
    assert len({id(losses) for losses in kept}) == len(kept)  # each call's own outputs
    assert not torch.equal(kept[0], kept[-1])


def test_refusals_hold_on_the_device():
    ensemble = Ensemble(*[model.to(CUDA) for model in members()], in_dims=0)
    opt = optim.sgd(lr=0.1)
    x, y = (t.to(CUDA) for t in batches(1)[0])
    step = capture_step(make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)),
                        x, y)  # fmt: skip
    with pytest.raises(
        ValueError, match=r"input at \[0\] has shape \[4, 8, 3\], torch.float32 on cpu"
    ):
        step(x.cpu(), y)
    opt.hyperparameters["lr"] = 0.2
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr'"):
        step(x, y)
    opt.hyperparameters["lr"] = 0.1
    step(x, y)
    ensemble.cpu()
    with pytest.raises(RuntimeError, match=r"moved to other memory|replaced"):
        step(x, y)
