"""``torch.jit.trace`` of an Ensemble, through every part that asks "is this traced?".

The derived views kept between eager calls, the first-use check of a registered
batched layer, and the custom autograd functions of the transformer steps all ask
one question (``tracing()``); under the jit tracer each must take the plain path:
a view kept from an eager call would enter the trace as a constant, a check would
put its comparisons (and reads of values) into the graph, and a custom autograd
function enters it as a Python call that a saved trace cannot hold. The reference
is a loop over ordinary modules.
"""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, register_batched

pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.trace.*` is deprecated:DeprecationWarning",
    "ignore:.*torch.jit.(save|load).*deprecated:DeprecationWarning",
)


def _loop(models, x):
    return torch.stack([model(x) for model in models])


def _replace_first_weight(ensemble: Ensemble, models: list, path: str) -> None:
    """``p.data = ...`` on one weight of the ensemble and of every model alike."""
    stacked = ensemble.get_parameter(f"stacked.{path}")
    fresh = torch.randn_like(stacked)
    stacked.data = fresh.clone()
    for index, model in enumerate(models):
        model.get_parameter(path).data = fresh[index].clone()


def _trace_saved_and_loaded(ensemble: Ensemble, x: torch.Tensor):
    traced = torch.jit.trace(ensemble, (x,), check_trace=False)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)  # refused for a graph holding a Python call
    buffer.seek(0)
    return traced, torch.jit.load(buffer)


def test_a_traced_transformer_ensemble_holds_only_torch_ops():
    torch.manual_seed(0)
    models = [
        nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        for _ in range(3)
    ]
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(2, 5, 8, requires_grad=True)
    ensemble(x).sum().backward()  # an eager training call first: its views are cached
    traced, loaded = _trace_saved_and_loaded(ensemble, x)
    assert "PythonOp" not in str(traced.graph)
    torch.testing.assert_close(loaded(x), _loop(models, x), rtol=1e-4, atol=1e-5)
    _replace_first_weight(ensemble, models, "linear1.weight")
    torch.testing.assert_close(traced(x), _loop(models, x), rtol=1e-4, atol=1e-5)


def test_a_traced_mlp_ensemble_reads_its_live_parameters():
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)) for _ in range(4)]
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(6, 3)
    ensemble(x)
    traced, loaded = _trace_saved_and_loaded(ensemble, x)
    torch.testing.assert_close(loaded(x), _loop(models, x))  # a copy of the parameters
    _replace_first_weight(ensemble, models, "0.weight")
    torch.testing.assert_close(traced(x), _loop(models, x))


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.weight


def _scale_batched(module, params, x):
    return x * params["weight"].unsqueeze(1)


def test_the_first_use_check_stays_out_of_a_trace():
    register_batched(_Scale, _scale_batched)
    torch.manual_seed(0)
    models = [nn.Sequential(_Scale(), nn.Linear(4, 2)) for _ in range(3)]
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 4)
    with warnings.catch_warnings():
        # the check reads values back to Python: the tracer would warn that the
        # trace might not generalise
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(ensemble, (x,), check_trace=False)
    assert "aten::allclose" not in str(traced.graph)
    torch.testing.assert_close(traced(x), _loop(models, x))
    torch.testing.assert_close(ensemble(x), _loop(models, x))  # and checked when eager
