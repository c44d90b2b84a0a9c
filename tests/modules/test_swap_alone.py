"""A swap alone is not recorded; a second one records both, and every order still restores.

The reference is the module's own ``_parameters`` dicts, read before any swap:
after every sequence each slot must hold the very object it held before. The
gate and the stack of recorded swaps are checked too, since a swap that leaves
the gate taken makes every later swap take the recorded (slower) way.
"""

from __future__ import annotations

import gc
import random
import sys
import threading

import pytest
import torch
from torch import nn

from tdfunc import TensorDict, functional_call
from tdfunc._modules import module_swap, swap_plan


@pytest.fixture(params=["straight_line", "passes"])
def plan_kind(request, monkeypatch):
    if request.param == "passes":
        monkeypatch.setattr(swap_plan, "SMALL", 0)
    return request.param


def _slots(model: nn.Module) -> dict:
    return {
        f"{prefix}.{name}" if prefix else name: value
        for prefix, sub in model.named_modules(remove_duplicate=False)
        for owner in (sub._parameters, sub._buffers)
        for name, value in owner.items()
    }


def _same(model: nn.Module, reference: dict) -> bool:
    now = _slots(model)
    return now.keys() == reference.keys() and all(now[k] is reference[k] for k in reference)


def _idle() -> bool:
    """No swap in effect: nothing recorded, nothing published, the gate open."""
    return not module_swap._ACTIVE and not module_swap._SOLE and not module_swap._GATE.locked()


def _filled(model: nn.Module, value: float) -> TensorDict:
    return TensorDict.from_module(model).apply(lambda t: torch.full_like(t, value))


def test_a_swap_alone_is_not_recorded(plan_kind):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    original = _slots(model)
    zeros, ones = _filled(model, 0.0), _filled(model, 1.0)
    assert _idle()
    with zeros.to_module(model):
        assert module_swap._ACTIVE == [] and len(module_swap._SOLE) == 1
        with ones.to_module(model):  # the second swap records the first below itself
            assert len(module_swap._ACTIVE) == 2 and not module_swap._SOLE
            assert model[0].weight is ones["0", "weight"]
        assert model[0].weight is zeros["0", "weight"]
    assert _same(model, original) and _idle()
    with ones.to_module(model):  # alone again
        assert module_swap._ACTIVE == [] and len(module_swap._SOLE) == 1
    assert _same(model, original) and _idle()


def test_a_refused_swap_leaves_the_gate_open(plan_kind):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    original = _slots(model)
    params = _filled(model, 0.0)
    with params.to_module(model):
        pass
    model[1] = nn.Linear(2, 2)  # the cached plan no longer fits: a new one is built
    original = _slots(model)
    with params.to_module(model):
        assert model[1].weight is params["1", "weight"]
    assert _same(model, original) and _idle()
    with pytest.raises(KeyError):
        TensorDict({"nope": torch.zeros(1)}, []).to_module(model)
    assert _same(model, original) and _idle()


def test_an_exit_repeated_after_another_swap_began_takes_nothing_of_it(plan_kind):
    model = nn.Linear(2, 2)
    original = _slots(model)
    zeros, ones = _filled(model, 0.0), _filled(model, 1.0)
    first = zeros.to_module(model)
    with first:
        pass
    with ones.to_module(model):
        first.__exit__(None, None, None)  # ended already: nothing happens
        assert model.weight is ones["weight"]
        assert len(module_swap._SOLE) == 1
    assert _same(model, original) and _idle()


def test_a_handle_dropped_inside_its_block_gives_the_gate_back(plan_kind):
    model = nn.Linear(2, 2)
    zeros = _filled(model, 0.0)
    handle = zeros.to_module(model)
    handle.__enter__()
    del handle
    gc.collect()
    assert model.weight is zeros["weight"]  # ends as it stands
    assert _idle()


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_loads_for_good_kept_and_dropped_around_with_blocks(plan_kind, depth):
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(3)])
    original = _slots(model)
    loads = [_filled(model, float(n)) for n in range(depth)]
    kept = [params.to_module(model) for params in loads]  # held: not committed yet
    loaded = _slots(model)
    assert loaded["0.weight"] is loads[-1]["0", "weight"]
    inner = _filled(model, 9.0)
    for _ in range(3):
        with inner.to_module(model):
            assert model[2].bias is inner["2", "bias"]
        assert _same(model, loaded)
    for handle in reversed(kept):  # each puts back what it found
        handle.restore()
    assert _same(model, original)
    del kept, handle
    gc.collect()
    assert _idle()


def test_functional_call_inside_a_with_block_and_alone(plan_kind):
    model = nn.Linear(3, 2)
    original = _slots(model)
    zeros, ones = _filled(model, 0.0), _filled(model, 1.0)
    x = torch.ones(1, 3)
    expected = torch.nn.functional.linear(x, ones["weight"], ones["bias"])
    with zeros.to_module(model):
        torch.testing.assert_close(functional_call(model, ones, (x,)), expected)
        assert model.weight is zeros["weight"]
    torch.testing.assert_close(functional_call(model, ones, (x,)), expected)
    assert _same(model, original) and _idle()


def test_threads_mixing_every_kind_of_swap_leave_the_modules_as_they_were(plan_kind):
    # A thread switch after every few bytecodes, so that a swap alone is caught while
    # it takes the gate, publishes its record or ends, by another thread's swap.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    models = [nn.Sequential(*[nn.Linear(2, 2) for _ in range(6)]) for _ in range(2)]
    originals = [_slots(model) for model in models]
    errors: list = []
    start = threading.Barrier(3)
    x = torch.ones(1, 2)

    def work(seed: int) -> None:
        generator = random.Random(seed)
        try:
            start.wait()
            for step in range(150):
                model = models[generator.randrange(2)]
                params = _filled(model, float(seed * 1000 + step))
                kind = generator.randrange(4)
                if kind == 0:
                    with params.to_module(model):
                        model(x)
                elif kind == 1:  # two blocks nested in one thread
                    with params.to_module(model), _filled(model, -1.0).to_module(model):
                        model(x)
                elif kind == 2:
                    functional_call(model, params, (x,))
                else:  # a load kept, then put back
                    old = params.to_module(model)
                    old.restore()
        except Exception as error:  # reported below: a thread cannot fail the test
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(3)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    gc.collect()
    for model, original in zip(models, originals):
        assert _same(model, original)
    assert _idle()


def test_a_swap_of_another_thread_not_entered_yet_survives_an_exit_below_it(plan_kind):
    # One thread's swap was made (not yet entered) above this thread's, which then
    # ended out of order: the other swap was dropped from the record, this one put
    # back the originals, and the other's exit then put back this one's values.
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    original = _slots(model)
    first, second = _filled(model, 1.0), _filled(model, 2.0)
    made, exited = threading.Event(), threading.Event()
    seen: list = []

    def other() -> None:
        handle = second.to_module(model)  # swapped, not entered yet
        made.set()
        exited.wait(10)
        with handle:
            seen.append(model[0].weight is second["0", "weight"])

    below = first.to_module(model)
    below.__enter__()
    thread = threading.Thread(target=other)
    thread.start()
    assert made.wait(10)
    below.__exit__(None, None, None)  # out of order: the other swap is above it
    assert model[0].weight is second["0", "weight"]  # the other swap still in effect
    exited.set()
    thread.join(10)
    assert seen == [True]
    assert _same(model, original) and _idle()


def test_a_swap_that_would_wait_forever_raises_instead(plan_kind, monkeypatch):
    # The gate held by a swap of this very thread that is still being made (as a swap
    # started from a finalizer in the middle of another would see it): never released
    # while this thread waits, so the wait is bounded and refused with an error.
    model = nn.Linear(2, 2)
    original = _slots(model)
    params = _filled(model, 0.0)
    monkeypatch.setattr(module_swap, "_MAX_WAITS", 50)
    assert module_swap._GATE.acquire(False)
    try:
        with pytest.raises(RuntimeError, match="waited for another swap"):
            params.to_module(model)
    finally:
        module_swap._GATE.release()
    assert _same(model, original) and _idle()
    with params.to_module(model):  # the gate open again: an ordinary swap
        assert model.weight is params["weight"]
    assert _same(model, original) and _idle()
