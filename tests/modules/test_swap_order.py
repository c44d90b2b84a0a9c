"""Swap plans of every size, and swaps that end out of order.

Each case runs under both kinds of plan (generated straight-line functions for
small models, C-level passes over the plan's lists for large ones) and is
checked against a reference computed without tdfunc: the module's own
``_parameters`` dicts, and which values each step should leave in them.
"""

from __future__ import annotations

import itertools
import sys
import threading

import pytest
import torch
from torch import nn

from tdfunc import TensorDict, functional_call
from tdfunc._modules import swap_plan


@pytest.fixture(params=["straight_line", "passes"])
def plan_kind(request, monkeypatch):
    if request.param == "passes":
        monkeypatch.setattr(swap_plan, "SMALL", 0)
    return request.param


def _slots(model: nn.Module) -> dict:
    """``{dotted name: object}`` read straight from the module's dicts."""
    return {
        f"{prefix}.{name}" if prefix else name: value
        for prefix, sub in model.named_modules(remove_duplicate=False)
        for owner in (sub._parameters, sub._buffers)
        for name, value in owner.items()
    }


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.decoder = nn.Linear(4, 4)
        self.decoder.weight = self.encoder.weight
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("scratch", torch.zeros(1), persistent=False)


def test_plans_agree_with_the_modules_dicts(plan_kind):
    model = nn.Sequential(*[nn.Linear(3, 3) for _ in range(40)], _Tied())
    before = _slots(model)
    params = TensorDict.from_module(model).apply(lambda t: t.detach().clone() + 1)
    params["note"] = "metadata is left alone"
    flat = dict(params.flatten_keys(".").items())
    for _ in range(2):  # a built plan, then the cached one
        with params.to_module(model) as old:
            inside = _slots(model)
            assert all(inside[name] is value for name, value in flat.items() if name != "note")
            assert inside["40.decoder.weight"] is flat["40.encoder.weight"]  # tied
            assert old["40", "encoder", "weight"] is before["40.encoder.weight"]
        after = _slots(model)
        assert after.keys() == before.keys()
        assert all(after[k] is before[k] for k in before)
    assert "scratch" not in model[40].state_dict()


def test_dotted_and_nested_dict_keys(plan_kind):
    model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Sequential(nn.Linear(3, 1)))
    values = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    x = torch.randn(5, 2)
    expected = torch.func.functional_call(model, values, (x,))
    nested = {"0.weight": values["0.weight"], "0": {"bias": values["0.bias"]}}
    nested["2"] = {"0.weight": values["2.0.weight"], "0": {"bias": values["2.0.bias"]}}
    for _ in range(2):
        assert torch.equal(functional_call(model, nested, (x,)), expected)


def test_a_replaced_submodule_gets_a_new_plan(plan_kind):
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    model[7] = nn.Linear(2, 2)
    with params.to_module(model):
        assert model[7].weight is params["7", "weight"]
    assert isinstance(model[7].weight, nn.Parameter)


def test_exception_restores(plan_kind):
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    before = _slots(model)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with pytest.raises(RuntimeError, match="boom"):
        with params.to_module(model):
            raise RuntimeError("boom")
    assert all(_slots(model)[k] is before[k] for k in before)


# ---------------------------------------------------------------- out of order
def _expected(original: dict, layers: list) -> dict:
    """What each slot should hold: the latest active swap covering it, or the original."""
    state = dict(original)
    for values in layers:
        state.update(values)
    return state


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("cover", ["same_keys", "overlapping_keys"])
def test_exits_in_any_order_leave_what_was_there(plan_kind, order, cover):
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    original = _slots(model)
    full = TensorDict.from_module(model)
    swaps = []
    for number in range(3):
        params = full.apply(lambda t, n=number: torch.full_like(t, float(n)))
        if cover == "overlapping_keys":  # each swap leaves one layer out
            params = params.exclude(str(number))
        swaps.append(params)
    handles, layers = [], []
    for params in swaps:
        handle = params.to_module(model)
        handle.__enter__()
        handles.append(handle)
        layers.append(dict(params.flatten_keys(".").items()))
    active = list(range(3))
    for position in order:
        handles[position].__exit__(None, None, None)
        active.remove(position)
        expected = _expected(original, [layers[i] for i in active])
        now = _slots(model)
        assert all(now[k] is expected[k] for k in expected), (order, position)
    assert all(_slots(model)[k] is original[k] for k in original)
    assert all(type(p) is nn.Parameter for p in model.parameters())


def test_a_load_for_good_inside_a_with_block_ends_with_it(plan_kind):
    model = nn.Linear(2, 2)
    original = _slots(model)
    zeros = TensorDict.from_module(model).apply(torch.zeros_like)
    ones = TensorDict.from_module(model).apply(torch.ones_like)
    with zeros.to_module(model):
        kept = ones.to_module(model)  # noqa: F841 - held: not committed yet
        assert torch.equal(model.weight, torch.ones(2, 2))
    assert all(_slots(model)[k] is original[k] for k in original)


def test_two_threads_on_one_module(plan_kind):
    # A thread switch after every few bytecodes: an exit that marks its handle
    # ended outside the lock let the other thread's swap drop its record first,
    # and the module kept one thread's values after both blocks ended.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(4):
            _swap_from_two_threads(100)
    finally:
        sys.setswitchinterval(interval)


def test_two_threads_on_two_modules(plan_kind):
    # Each thread swaps into its own model of one architecture: the module swapped
    # last (remembered apart from the cache) changes under the other thread, and
    # a swap must still reach only the module it names.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        models = [nn.Sequential(*[nn.Linear(2, 2) for _ in range(20)]) for _ in range(2)]
        originals = [_slots(model) for model in models]
        start = threading.Barrier(2)
        errors: list = []

        def work(index: int) -> None:
            model, other = models[index], models[1 - index]
            params = TensorDict.from_module(model).apply(torch.zeros_like)
            try:
                start.wait()
                for _ in range(300):
                    with params.to_module(model):
                        assert model[7].weight is params["7", "weight"]
                        assert other[7].weight is not params["7", "weight"]
            except Exception as error:  # reported below: a thread cannot fail the test
                errors.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors
    for model, original in zip(models, originals):
        assert all(_slots(model)[k] is original[k] for k in original)


def _swap_from_two_threads(rounds: int) -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(20)])
    original = _slots(model)
    start = threading.Barrier(2)
    errors: list = []

    def work(value: float) -> None:
        params = TensorDict.from_module(model).apply(lambda t: torch.full_like(t, value))
        try:
            start.wait()
            for _ in range(rounds):
                with params.to_module(model):
                    model(torch.ones(1, 2))
        except Exception as error:  # reported below: a thread cannot fail the test
            errors.append(error)

    threads = [threading.Thread(target=work, args=(v,)) for v in (1.0, 2.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert all(_slots(model)[k] is original[k] for k in original)


# ---------------------------------------------------------------- one cache
def test_to_module_and_functional_call_share_one_bounded_cache(plan_kind, monkeypatch):
    from tdfunc._modules import module_swap

    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    builds = []
    original = module_swap.build_swap_plan
    monkeypatch.setattr(
        module_swap, "build_swap_plan", lambda *a, **k: builds.append(1) or original(*a, **k)
    )
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    x = torch.ones(1, 2)
    with params.to_module(model):
        expected = model(x)
    assert torch.equal(functional_call(model, params, (x,)), expected)
    assert len(builds) == 1  # the plan of to_module served functional_call
    for index in range(10):  # ten key structures: the cache keeps the latest few
        with params.exclude(str(index)).to_module(model):
            pass
    plans = module_swap._PLANS[id(model)][1]
    assert len(plans) == module_swap._MAX_PLANS


def test_the_module_swapped_last_is_found_by_identity(plan_kind):
    # the module swapped last is remembered apart from the cache: swaps alternating
    # between two models of one structure, and into a model made after the last one
    # died, each reach only their own module
    import gc

    def make() -> nn.Module:
        return nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])

    first, second = make(), make()
    params = TensorDict.from_module(first).apply(torch.zeros_like)
    before = {id(m): _slots(m) for m in (first, second)}
    for model, other in ((first, second), (second, first), (first, second)):
        with params.to_module(model):
            assert model[3].weight is params["3", "weight"]
            assert all(_slots(other)[k] is v for k, v in before[id(other)].items())
        assert all(_slots(model)[k] is v for k, v in before[id(model)].items())
    del first, second, model, other, before
    gc.collect()
    third = make()  # perhaps at the address of a dead one
    reference = _slots(third)
    with params.to_module(third):
        assert third[29].bias is params["29", "bias"]
    assert all(_slots(third)[k] is v for k, v in reference.items())
    del third
    gc.collect()
    with pytest.raises(TypeError, match=r"nn\.Module"):
        params.to_module(None)


# ---------------------------------------------------------------- plan fits
def test_reordered_extra_and_missing_root_keys(plan_kind):
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    original = _slots(model)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    # the same keys in another order: the same values go to the same slots
    reordered = TensorDict({key: params[key] for key in reversed(list(params.keys()))}, [])
    with reordered.to_module(model):
        assert all(model[i].weight is params[str(i), "weight"] for i in range(30))
    assert all(_slots(model)[k] is original[k] for k in original)
    extra = params.clone(recurse=False)
    extra["30"] = TensorDict({"weight": torch.zeros(2, 2)}, [])
    with pytest.raises(KeyError, match="30"):
        with extra.to_module(model):
            pass
    fewer = params.exclude("29")
    with fewer.to_module(model):
        assert model[29].weight is original["29.weight"]
        assert model[28].weight is params["28", "weight"]
    assert all(_slots(model)[k] is original[k] for k in original)


def test_an_extra_key_in_a_nested_level_is_refused(plan_kind):
    # a nested level with a key the module lacks, alone or beside a level missing
    # one (the levels' total size is then the plan's): the module stays untouched
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(30)])
    original = _slots(model)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    extra = params.clone()
    extra["3", "scale"] = torch.ones(2)
    both = extra.clone()
    del both["4", "bias"]
    for changed in (extra, both):
        with pytest.raises(KeyError, match="scale"):
            with changed.to_module(model):
                pass
        assert all(_slots(model)[k] is original[k] for k in original)
    with params.to_module(model):  # the plan that fits is still there
        assert model[3].weight is params["3", "weight"]


def test_a_handle_dropped_inside_its_with_block_ends_as_it_stands(plan_kind):
    model = nn.Linear(2, 2)
    original = dict(model.named_parameters())
    zeros = TensorDict.from_module(model).apply(torch.zeros_like)
    ones = TensorDict.from_module(model).apply(torch.ones_like)
    handle = zeros.to_module(model)
    handle.__enter__()
    del handle  # never exited: the module keeps the zeros, the swap is over
    assert model.weight is zeros["weight"]
    with ones.to_module(model):
        assert model.weight is ones["weight"]
    assert model.weight is zeros["weight"]
    with zeros.to_module(model) as old:  # puts back what it found
        pass
    assert model.weight is old["weight"] is zeros["weight"]
    assert original["weight"] is not zeros["weight"]


def test_the_handle_is_an_empty_batch_tensordict_until_changed(plan_kind):
    model = nn.Linear(2, 2)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model) as old:
        assert old.batch_size == torch.Size([]) and old.device is None
        assert old.names == [] and not old.is_locked
        old.lock_()
        assert old.is_locked
