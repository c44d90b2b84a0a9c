"""torch.export of an Ensemble leaves the eager module intact; exported programs
save, load and run equal to a loop over the member modules, at other batch sizes."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from tdfunc import Ensemble


def _loop(models, x):
    return torch.stack([m(x) for m in models])


@pytest.mark.parametrize("strict", [False, True])
def test_export_keeps_the_eager_ensemble_and_round_trips(strict):
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(3)]
    ens = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 3)
    ens(x)  # a forward before the export fills the cache of derived views
    batch = torch.export.Dim("batch")
    program = torch.export.export(ens, (x,), dynamic_shapes=(({0: batch},),), strict=strict)
    after = ens(x)
    assert type(after) is torch.Tensor and all(type(p) is nn.Parameter for p in ens.parameters())
    torch.testing.assert_close(after, _loop(models, x))
    after.sum().backward()  # the eager module still trains
    assert all(p.grad is not None for p in ens.parameters())
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    for rows in (5, 9):
        x = torch.randn(rows, 3)
        torch.testing.assert_close(loaded(x), _loop(models, x))
