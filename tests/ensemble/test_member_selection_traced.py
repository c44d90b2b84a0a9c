"""Member selections (``ens[idx]``) inside ``torch.compile(fullgraph=True)`` and ``torch.export``.

References are loops over the ordinary member modules.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble

N = 4


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def normed() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def models(make) -> list[nn.Module]:
    torch.manual_seed(0)
    return [make() for _ in range(N)]


class Pick(nn.Module):
    def __init__(self, ensemble: Ensemble, index):
        super().__init__()
        self.ensemble = ensemble
        self.index = index

    def forward(self, x):
        return self.ensemble[self.index](x)


def positions(index) -> list[int]:
    return [i % N for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]


def traced(kind: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if kind == "compile":
        return torch.compile(module, fullgraph=True, backend="aot_eager")(x)
    return torch.export.export(module, (x,), strict=kind == "export-strict").module()(x)


KINDS = ["compile", "export", "export-strict"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("index", [[2, 0, -1], torch.tensor([-4, 3, 3])])
def test_a_selection_traces_whole_and_matches_the_loop(kind, index):
    loop = models(mlp)
    ensemble = Ensemble(*copy.deepcopy(loop))
    x = torch.randn(5, 3)
    out = traced(kind, Pick(ensemble, index), x)
    expected = torch.stack([loop[k](x) for k in positions(index)])
    torch.testing.assert_close(out, expected)


def test_gradients_of_a_compiled_selection_reach_the_selected_rows_like_the_loop():
    loop = models(mlp)
    ensemble = Ensemble(*copy.deepcopy(loop))
    x = torch.randn(5, 3)
    index = [3, 1, 3]
    compiled = torch.compile(Pick(ensemble, index), fullgraph=True, backend="aot_eager")
    compiled(x).square().sum().backward()
    sum(loop[k](x).square().sum() for k in index).backward()
    for name, grad in ((n, p.grad) for n, p in ensemble.params.flatten_keys(".").items()):
        expected = torch.stack(
            [
                p.grad if p.grad is not None else torch.zeros_like(p)
                for p in (dict(m.named_parameters())[name] for m in loop)
            ]
        )
        torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_running_statistics_of_a_traced_selection_reach_the_ensemble_like_the_loop(kind):
    loop = models(normed)
    ensemble = Ensemble(*copy.deepcopy(loop))
    x = torch.randn(6, 3)
    index = [3, 1]
    out = traced(kind, Pick(ensemble, index), x)
    expected = torch.stack([loop[k](x) for k in index])
    torch.testing.assert_close(out, expected)
    for name, value in ensemble.params.flatten_keys(".").items():
        reference = torch.stack([dict(m.state_dict(keep_vars=True))[name] for m in loop])
        torch.testing.assert_close(value, reference.to(value.dtype), msg=name)


@pytest.mark.parametrize("kind", KINDS)
def test_a_repeated_member_in_eval_mode_traces(kind):
    loop = models(normed)
    for model in loop:
        model.eval()
    ensemble = Ensemble(*copy.deepcopy(loop))
    x = torch.randn(6, 3)
    out = traced(kind, Pick(ensemble, [1, 1, 0]), x)
    torch.testing.assert_close(out, torch.stack([loop[k](x) for k in [1, 1, 0]]))


@pytest.mark.parametrize("kind", KINDS)
def test_a_repeated_member_whose_statistics_change_is_refused_before_any_write(kind):
    ensemble = Ensemble(*models(normed))
    before = ensemble.params.clone()
    with pytest.raises((RuntimeError, ValueError), match="repeats members"):
        traced(kind, Pick(ensemble, [1, 1]), torch.randn(6, 3))
    assert (ensemble.params == before).all()
    assert torch.is_grad_enabled()  # the failed graph left no no_grad region open


@pytest.mark.parametrize("kind", ["compile", "export-strict"])
@pytest.mark.parametrize("index", [torch.tensor([4, 0]), torch.tensor([-5, 0])])
def test_an_index_tensor_out_of_range_is_refused_when_the_graph_runs(kind, index):
    ensemble = Ensemble(*models(mlp))
    with pytest.raises(RuntimeError, match=r"select_members: a member index is out of range"):
        traced(kind, Pick(ensemble, index), torch.randn(5, 3))
    assert torch.is_grad_enabled()


def test_a_list_out_of_range_is_refused_while_tracing():
    ensemble = Ensemble(*models(mlp))
    with pytest.raises(Exception, match=r"member indices \[4\] out of range"):
        traced("export", Pick(ensemble, [0, 4]), torch.randn(5, 3))
