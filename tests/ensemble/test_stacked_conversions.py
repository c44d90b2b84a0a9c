"""Dtype moves of one stacked level (``ens.stacked[i].double()``), against a loop of
ordinary modules given the same moves.

With torch's swap-on-conversion setting, ``Module._apply`` swaps each parameter's
memory under the same Python object (``torch.utils.swap_tensors``), which torch
refuses while another tensor holds the parameter, such as a view the ensemble kept
from an earlier call.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

from tdfunc import Ensemble


@pytest.fixture
def swap_on_conversion():
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    yield
    torch.__future__.set_swap_module_params_on_conversion(previous)


def _models() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
        for _ in range(3)
    ]


def _compare(ensemble: Ensemble, models: list[nn.Module], x: torch.Tensor) -> None:
    """Outputs and gradients of the ensemble equal those of the loop."""
    ensemble.zero_grad()
    for model in models:
        model.zero_grad()
    out = ensemble(x)
    expected = torch.stack([model(x) for model in models])
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for name, stacked in ensemble.named_parameters():
        key = name.removeprefix("stacked.")
        grads = torch.stack([model.get_parameter(key).grad for model in models])
        torch.testing.assert_close(stacked.grad, grads, msg=name)


def _convert(module: nn.Module, how: str) -> None:
    if how == "double":
        module.double()
    elif how == "to":
        module.to(torch.float64)
    else:
        module.to(dtype=torch.float64)


@pytest.mark.parametrize("how", ["double", "to", "to_dtype"])
@pytest.mark.parametrize("grad", [True, False])
def test_a_level_converted_after_a_call_equals_the_loop(swap_on_conversion, how, grad):
    models = _models()
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 3)
    with torch.set_grad_enabled(grad):
        ensemble(x)  # fills the cache of derived views for this grad mode
    ensemble(x).sum().backward()
    weight = ensemble.stacked[0].weight
    for index in (0, 2, 4):
        _convert(ensemble.stacked[index], how)
        for model in models:
            _convert(model[index], how)
    assert ensemble.stacked[0].weight is weight and weight.dtype == torch.float64
    _compare(ensemble, models, x.double())
    # and back, one level at a time, after a call made in float64
    for index in (0, 2, 4):
        ensemble.stacked[index].float()
        for model in models:
            model[index].float()
    _compare(ensemble, models, x)


def test_a_copy_clears_its_own_cache_before_a_conversion(swap_on_conversion):
    models = _models()
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 3)
    ensemble(x).sum().backward()
    buffer = io.BytesIO()
    torch.save(ensemble, buffer)
    buffer.seek(0)
    for other in (
        copy.deepcopy(ensemble),
        pickle.loads(pickle.dumps(ensemble)),
        torch.load(buffer, weights_only=False),
    ):
        other(x).sum().backward()
        ensemble(x).sum().backward()  # the original's cache is full as well
        for index in (0, 2, 4):
            other.stacked[index].double()
        reference = copy.deepcopy(models)
        for model in reference:
            model.double()
        _compare(other, reference, x.double())
        _compare(ensemble, models, x)  # the original is untouched


@pytest.mark.parametrize("level", ["ensemble", "stacked", "one level"])
@pytest.mark.parametrize("assign", [False, True])
def test_a_load_after_a_call_equals_the_loop(swap_on_conversion, level, assign):
    """With swap-on-conversion, ``load_state_dict`` swaps each parameter too."""
    models = _models()
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 3)
    ensemble(x).sum().backward()
    torch.manual_seed(1)
    for model in models:  # new values for every member, loaded into the ensemble
        for param in model.parameters():
            param.data = torch.randn_like(param)
    stacked = {
        name: torch.stack([model.get_parameter(name.removeprefix("stacked.")).detach()
                           for model in models])
        for name in ensemble.state_dict()
    }  # fmt: skip
    if level == "ensemble":
        ensemble.load_state_dict(stacked, assign=assign)
    elif level == "stacked":
        state = {k.removeprefix("stacked."): v for k, v in stacked.items()}
        ensemble.stacked.load_state_dict(state, assign=assign)
    else:
        for index in (0, 2, 4):
            prefix = f"stacked.{index}."
            state = {k.removeprefix(prefix): v for k, v in stacked.items() if k.startswith(prefix)}
            ensemble.stacked[index].load_state_dict(state, assign=assign)
    _compare(ensemble, models, x)


def _shared_models() -> list[nn.Module]:
    models = _models()
    for model in models[1:]:  # the last layer is the same in every member
        model[4].load_state_dict(models[0][4].state_dict())
    return models


@pytest.mark.parametrize("route", ["ensemble", "levels", "load"])
def test_shared_tensors_convert_and_stay_shared(swap_on_conversion, route):
    """A shared tensor is converted like the others (torch refuses to swap a tensor
    that a weak reference points to), and stays known as shared afterwards."""
    from tdfunc._ensemble.shared import is_shared

    models = _shared_models()
    ensemble = Ensemble(*copy.deepcopy(models), shared=["4.weight", "4.bias"])
    x = torch.randn(5, 3)
    ensemble(x).sum().backward()
    if route == "ensemble":
        ensemble.double()
    elif route == "levels":
        for index in (0, 2, 4):
            ensemble.stacked[index].double()
    else:
        ensemble.load_state_dict({k: v * 2 for k, v in ensemble.state_dict().items()})
        for model in models:
            for param in model.parameters():
                param.data = param.data * 2
    if route != "load":
        for model in models:
            model.double()
        x = x.double()
    assert is_shared(ensemble.stacked[4].weight) and is_shared(ensemble.stacked[4].bias)
    assert not is_shared(ensemble.stacked[0].weight)
    out = ensemble(x)
    expected = torch.stack([model(x) for model in models])
    torch.testing.assert_close(out, expected)
    with pytest.raises(ValueError, match="member"):  # a per-member lr on a shared tensor
        from tdfunc import optim

        optim.Adam([ensemble.stacked[4].weight], lr=torch.ones(3, dtype=out.dtype))
