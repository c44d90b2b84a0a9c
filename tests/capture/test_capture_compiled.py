"""A functional training step through ``torch.compile(fullgraph=True)``, alone and captured.

``aot_eager`` runs the graphs through AOTAutograd without generating code, so each
compile costs seconds, not minutes; ``eager`` where only graph breaks are counted.
The compiled step runs the same ATen ops as the eager one, but AOTAutograd may
reorder or fuse their rounding (functionalisation, decompositions), so it is
compared with float32's default tolerance; against the loop of modules the batched
kernels sum in another order (``LOOP_TOLERANCE``, as in ``test_capture_step.py``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from capture_loop import OptimLoop, batches, members
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch.func import grad_and_value, vmap

from tdfunc import Ensemble, capture_step, optim

LOOP_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
KEYS = ("0.weight", "0.bias", "2.weight", "2.bias")


def leaf(params, key: str) -> torch.Tensor:
    return params[tuple(key.split("."))]


def batched_step(ensemble, opt, **update_options):
    """Forward through the ensemble's batched kernels, one ``grad`` over all members."""

    def train_step(carry, x, y):
        params, state = carry

        def loss(p):
            losses = ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2))
            return losses.sum(), losses

        grads, losses = grad_and_value(loss, has_aux=True)(params)
        updates, state = opt.update(grads, state, params, **update_options)
        return (optim.apply_updates(params, updates), state), losses[1]

    return train_step


def per_member_step(ensemble, opt):
    """``vmap(grad(...))`` over the members, each running the template with its parameters."""

    def train_step(carry, x, y):
        params, state = carry

        def loss(p, x, y):
            return ((ensemble.call_member(p, x) - y) ** 2).mean()

        grads, losses = vmap(grad_and_value(loss))(params, x, y)
        updates, state = opt.update(grads, state, params)
        return (optim.apply_updates(params, updates), state), losses

    return train_step


def fresh_counters() -> CompileCounterWithBackend:
    torch._dynamo.reset()
    counters.clear()
    return CompileCounterWithBackend("aot_eager")


@pytest.mark.slow
def test_captured_compiled_step_has_no_graph_break_and_no_recompile():
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.Adam(p, lr=0.01))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    eager_ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=0.01)
    counter = fresh_counters()
    compiled = torch.compile(batched_step(ensemble, opt), backend=counter, fullgraph=True)
    data = batches(3)
    step = capture_step(compiled, (ensemble.params, opt.init(ensemble.params)), *data[0],
                        warmup=1)  # fmt: skip
    eager = batched_step(eager_ensemble, opt)
    carry = (eager_ensemble.params.detach(), opt.init(eager_ensemble.params))
    for x, y in data:
        losses = step(x, y)
        with torch.no_grad():
            carry, expected = eager(carry, x, y)
        torch.testing.assert_close(losses, expected)
        torch.testing.assert_close(losses, loop.step(x, y), **LOOP_TOLERANCE)
        for key in KEYS:
            torch.testing.assert_close(leaf(ensemble.params, key), leaf(carry[0], key))
            torch.testing.assert_close(
                leaf(ensemble.params, key), loop.stacked(key), **LOOP_TOLERANCE
            )
    assert counter.frame_count == 1, counter.frame_count  # the warm-up compiled it; no more
    assert not counters["graph_break"], dict(counters["graph_break"])
    # what the compiled function reads is found through torch.compile's wrapper
    opt.hyperparameters["lr"] = 0.02
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr' of opt changed"):
        step(*data[0])


@pytest.mark.slow
def test_compiled_vmap_grad_step_fed_its_own_outputs_compiles_once():
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.sgd(lr=0.05, momentum=0.9)
    counter = fresh_counters()
    compiled = torch.compile(per_member_step(ensemble, opt), backend=counter, fullgraph=True)
    # detached: the outputs fed back are plain tensors, and so must the first inputs be
    carry = (ensemble.params.detach(), opt.init(ensemble.params))
    for x, y in batches(3):
        carry, losses = compiled(carry, x, y)
        torch.testing.assert_close(losses, loop.step(x, y), **LOOP_TOLERANCE)
    for key in KEYS:
        torch.testing.assert_close(leaf(carry[0], key), loop.stacked(key), **LOOP_TOLERANCE)
    assert counter.frame_count == 1, counter.frame_count
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_a_member_subset_of_python_indices_compiles_without_graph_break():
    # the indices used to be range-checked by reading a tensor back (a graph break)
    models = members()
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    reference = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=0.01)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(
        batched_step(ensemble, opt, members=[0, -2]), backend="eager", fullgraph=True
    )
    eager = batched_step(reference, opt, members=[0, -2])
    x, y = batches(1)[0]
    with torch.no_grad():
        (params, state), _ = compiled((ensemble.params.detach(), opt.init(ensemble.params)), x, y)
        (expected, _), _ = eager((reference.params.detach(), opt.init(reference.params)), x, y)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert state["step"].tolist() == [1.0, 0.0, 1.0, 0.0]
    for key in KEYS:
        torch.testing.assert_close(leaf(params, key), leaf(expected, key))
        assert torch.equal(leaf(params, key)[1], leaf(ensemble.params, key)[1].detach())


def test_member_indices_as_a_tensor_are_refused_inside_compile():
    ensemble = Ensemble(*members(), in_dims=0)
    opt = optim.adam(lr=0.01)
    torch._dynamo.reset()
    compiled = torch.compile(
        batched_step(ensemble, opt, members=torch.tensor([0, 2])), backend="eager", fullgraph=True
    )
    carry = (ensemble.params.detach(), opt.init(ensemble.params))
    with pytest.raises(Exception, match=r"members given as a tensor of indices cannot be checked"):
        compiled(carry, *batches(1)[0])
