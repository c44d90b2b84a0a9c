"""Compiled stateful steps: they compile once, as ``torch.optim``'s do, and give eager's numbers.

``aot_eager`` runs the graphs through AOTAutograd (where a tensor subclass input
fails) without generating code, so these tests stay quick.
"""

from __future__ import annotations

import pytest
import torch
from optimizer_table import OPTIMIZERS
from torch._dynamo.utils import counters

from tdfunc import optim

LRS = torch.tensor([0.1, 0.2, 0.3])


def compiled_steps(opt, params, steps: int) -> list[int]:
    """Run ``steps`` compiled steps; the number of graphs compiled after each."""
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(opt.step, backend="aot_eager")
    graphs = []
    for index in range(steps):
        for param in params:
            param.grad = torch.full_like(param, float(index + 1)).sin()
        step()
        graphs.append(counters["stats"]["unique_graphs"])
    return graphs


def eager_steps(opt, params, steps: int) -> None:
    for index in range(steps):
        for param in params:
            param.grad = torch.full_like(param, float(index + 1)).sin()
        opt.step()


CASES = [
    # every optimizer of the table, with its contract hyperparameters and per-member lr
    *[(row.stateful, {"lr": LRS, **row.contract}) for row in OPTIMIZERS.values()],
    (optim.SGD, {"lr": LRS, "momentum": 0.9, "weight_decay": 0.1}),
    (optim.Adam, {"lr": 0.1}),
    (optim.AdamW, {"lr": LRS, "betas": (0.9, torch.tensor([0.99, 0.9, 0.5])), "weight_decay": 0.1}),
]


@pytest.mark.parametrize(("cls", "kwargs"), CASES)
def test_compiled_step_compiles_once_and_matches_eager(cls, kwargs):
    ours = [torch.nn.Parameter(torch.ones(3, 4)), torch.nn.Parameter(torch.ones(3))]
    theirs = [torch.nn.Parameter(torch.ones(3, 4)), torch.nn.Parameter(torch.ones(3))]
    graphs = compiled_steps(cls(ours, **kwargs), ours, 5)
    eager_steps(cls(theirs, **kwargs), theirs, 5)
    # the first step makes the state, the second compiles the steady step; then no more
    assert graphs[-1] == graphs[2], graphs
    assert not counters["graph_break"], dict(counters["graph_break"])
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine.detach(), reference.detach())


def test_compiles_at_most_once_more_than_torch_optim():
    # torch.optim's state is made before tracing (dynamo knows its classes); ours is
    # made by the first compiled step, which is one more graph, never one per step
    ours = [torch.nn.Parameter(torch.ones(3, 4))]
    theirs = [torch.nn.Parameter(torch.ones(3, 4))]
    mine = compiled_steps(optim.Adam(ours, lr=0.1), ours, 4)
    reference = compiled_steps(torch.optim.Adam(theirs, lr=0.1), theirs, 4)
    assert mine[-1] <= reference[-1] + 1, (mine, reference)
