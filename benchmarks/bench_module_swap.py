"""Parameters in and out of modules: ``from_module`` and ``to_module`` beside plain dicts.

Model: a three-Linear MLP (``3 -> 64 -> 64 -> 1``, six parameter tensors).

- ``from_module``: tdfunc's nested TensorDict against a flat dict built from
  ``named_parameters()`` / ``named_buffers()`` and ``tensordict``'s
  ``from_module``.
- ``to_module``: entering and leaving ``with params.to_module(model):``
  against the raw dict assignments it performs (save the six module slots,
  assign the new tensors, put the old ones back) and ``tensordict``'s
  ``to_module``. Target: tdfunc within 3x of the raw assignments.
- ``vmap_forward``: an ensemble forward of 8 stacked members, ``vmap`` of a
  function that runs the model inside ``to_module``, against
  ``torch.func.functional_call`` with a dict of stacked tensors (the
  ``torch.func`` way) and ``tensordict``.

- ``functional_call``: one forward through ``tdfunc.functional_call`` with a
  nested TensorDict, against the same forward inside ``with
  params.to_module(model):`` (target: no slower) and
  ``torch.func.functional_call`` with a dict of dotted names.

Run: ``.venv-bench/bin/python -m pytest benchmarks/bench_module_swap.py --benchmark-enable -q``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tdfunc
from tdfunc import TensorDict

MEMBERS = 8


pytestmark = pytest.mark.usefixtures("one_thread")


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(3, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
    )


def _flat_params(model: nn.Module) -> dict:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _fresh_values(model: nn.Module) -> dict:
    """New tensors for every parameter: ``{dotted name: tensor}``."""
    return {name: torch.randn_like(value) for name, value in _flat_params(model).items()}


def _check_swapped(model: nn.Module, values: dict, inside: bool, same_object: bool = True) -> None:
    for name, value in model.named_parameters():
        if same_object:
            assert (value is values[name]) is inside, name
        else:  # tensordict wraps the tensors in new Parameters sharing their storage
            assert (value.data_ptr() == values[name].data_ptr()) is inside, name


# ---------------------------------------------------------------- from_module
@pytest.mark.benchmark(group="from_module")
def test_from_module_tdfunc(benchmark):
    model = _mlp()
    params = benchmark(TensorDict.from_module, model)
    assert params["2", "weight"] is model[2].weight
    assert len(list(params.keys(True, True))) == len(_flat_params(model))


@pytest.mark.benchmark(group="from_module")
def test_from_module_baseline(benchmark):
    model = _mlp()
    params = benchmark(_flat_params, model)
    assert params["2.weight"] is model[2].weight


@pytest.mark.benchmark(group="from_module")
def test_from_module_tensordict(benchmark, tensordict_lib):
    model = _mlp()
    params = benchmark(tensordict_lib.TensorDict.from_module, model)
    assert params["2", "weight"] is model[2].weight


# ---------------------------------------------------------------- to_module
@pytest.mark.benchmark(group="to_module")
def test_to_module_tdfunc(benchmark):
    model = _mlp()
    values = _fresh_values(model)
    params = TensorDict(values, []).unflatten_keys(".")
    seen = []

    def enter_exit():
        with params.to_module(model):
            pass

    with params.to_module(model):
        _check_swapped(model, values, inside=True)
        seen.append(model(torch.ones(1, 3)))
    benchmark(enter_exit)
    _check_swapped(model, values, inside=False)
    assert torch.allclose(seen[0], torch.func.functional_call(model, values, (torch.ones(1, 3),)))


@pytest.mark.benchmark(group="to_module")
def test_to_module_baseline(benchmark):
    model = _mlp()
    values = _fresh_values(model)
    modules = dict(model.named_modules())
    slots = []
    for name, value in values.items():
        owner, _, attribute = name.rpartition(".")
        slots.append((modules[owner]._parameters, attribute, value))

    def enter_exit():  # restores in finally, as ``with`` does on an exception
        olds = [owner[attribute] for owner, attribute, _ in slots]
        try:
            for owner, attribute, value in slots:
                owner[attribute] = value
        finally:
            for (owner, attribute, _), old in zip(slots, olds):
                owner[attribute] = old

    benchmark(enter_exit)
    _check_swapped(model, values, inside=False)


@pytest.mark.benchmark(group="to_module")
def test_to_module_tensordict(benchmark, tensordict_lib):
    model = _mlp()
    values = _fresh_values(model)
    params = tensordict_lib.TensorDict(values, []).unflatten_keys(".")

    def enter_exit():
        with params.to_module(model):
            pass

    with params.to_module(model):
        _check_swapped(model, values, inside=True, same_object=False)
    benchmark(enter_exit)
    _check_swapped(model, values, inside=False, same_object=False)


# ---------------------------------------------------------------- vmap forward
def _ensemble():
    models = [_mlp(seed) for seed in range(MEMBERS)]
    x = torch.randn(16, 3)
    expected = torch.stack([m(x) for m in models]).detach()
    return models, x, expected


@pytest.mark.benchmark(group="vmap_forward")
def test_vmap_forward_tdfunc(benchmark):
    models, x, expected = _ensemble()
    template = models[0]
    params = TensorDict.from_modules(*models)

    def member(p, x):
        with p.to_module(template):
            return template(x)

    run = torch.func.vmap(member, (0, None))
    out = benchmark(run, params, x)
    assert torch.allclose(out, expected, atol=1e-6)


@pytest.mark.benchmark(group="vmap_forward")
def test_vmap_forward_baseline(benchmark):
    models, x, expected = _ensemble()
    template = models[0]
    params, buffers = torch.func.stack_module_state(models)

    def member(p, b, x):
        return torch.func.functional_call(template, (p, b), (x,))

    run = torch.func.vmap(member, (0, 0, None))
    out = benchmark(run, params, buffers, x)
    assert torch.allclose(out, expected, atol=1e-6)


@pytest.mark.benchmark(group="vmap_forward")
def test_vmap_forward_tensordict(benchmark, tensordict_lib):
    models, x, expected = _ensemble()
    template = models[0]
    params = tensordict_lib.TensorDict.from_modules(*models)

    def member(p, x):
        with p.to_module(template):
            return template(x)

    run = torch.func.vmap(member, (0, None))
    out = benchmark(run, params, x)
    assert torch.allclose(out, expected, atol=1e-6)


# ---------------------------------------------------------------- functional_call
@pytest.mark.benchmark(group="functional_call")
def test_functional_call_tdfunc(benchmark):
    model = _mlp()
    values = _fresh_values(model)
    params = TensorDict(values, []).unflatten_keys(".")
    x = torch.randn(4, 3)
    out = benchmark(tdfunc.functional_call, model, params, (x,))
    assert torch.equal(out, torch.func.functional_call(model, values, (x,)))


@pytest.mark.benchmark(group="functional_call")
def test_functional_call_to_module(benchmark):
    model = _mlp()
    values = _fresh_values(model)
    params = TensorDict(values, []).unflatten_keys(".")
    x = torch.randn(4, 3)

    def call():
        with params.to_module(model):
            return model(x)

    out = benchmark(call)
    assert torch.equal(out, torch.func.functional_call(model, values, (x,)))


@pytest.mark.benchmark(group="functional_call")
def test_functional_call_baseline(benchmark):
    model = _mlp()
    values = _fresh_values(model)
    x = torch.randn(4, 3)
    out = benchmark(torch.func.functional_call, model, values, (x,))
    assert out.shape == (4, 1)
