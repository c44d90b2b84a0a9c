"""A non-tensor (metadata) key of a swapped TensorDict that later holds a tensor.

A metadata key fills no slot, so a cached plan only looked it up: once it held a
tensor, the tensor was silently left out of the module, where a fresh module
says the key names no parameter. The reference is a fresh copy of the module.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import TensorDict

X = torch.randn(2, 3)


def _model(depth: int) -> nn.Sequential:
    torch.manual_seed(depth)
    return nn.Sequential(*[nn.Linear(3, 3) for _ in range(depth)])


# 5 layers: a generated plan; 200 layers: one past swap_plan.SMALL slots + levels
@pytest.mark.parametrize("depth", [5, 200])
@pytest.mark.parametrize("where", [("tag",), ("0", "tag")])
def test_metadata_key_that_now_holds_a_tensor_raises_as_on_a_fresh_module(depth, where):
    model = _model(depth)
    fresh = copy.deepcopy(model)
    params = TensorDict.from_module(model).apply(torch.randn_like)
    params[where] = "metadata"
    with params.to_module(model):  # caches the plan; the metadata fills no slot
        ref = copy.deepcopy(model)
        assert torch.equal(model(X), ref(X))
    params[where] = torch.ones(3)
    with pytest.raises(KeyError, match="tag"):
        with params.to_module(fresh):
            pass
    before = dict(model.named_parameters())
    with pytest.raises(KeyError, match="tag"):
        with params.to_module(model):
            pass
    assert all(value is before[name] for name, value in model.named_parameters())
