"""``Ensemble.explain()`` and the once-per-ensemble ``EnsembleFallbackWarning``."""

from __future__ import annotations

import copy
import pickle
import warnings

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, EnsembleFallbackWarning
from tdfunc._ensemble.explain import Route


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.linalg.vector_norm(self.fc(x), dim=-1, keepdim=True)


class Mixed(nn.Module):
    """A traced forward holding a batched layer, a layer without a batched form, an
    inlined custom submodule with an op that has no batched rule, and a Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.drop = nn.AlphaDropout(0.0)  # a torch layer without a batched form
        self.inner = Inner()
        self.head = nn.Sequential(nn.Linear(4, 2), nn.Tanh())

    def forward(self, x):
        h = self.inp(x)
        mixed = self.drop(h)
        return self.head(mixed * self.inner(h))


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x) / len(x)


def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EnsembleFallbackWarning)
        return make()


def test_explain_lists_every_part_and_its_route():
    ensemble = _quiet(lambda: Ensemble(Mixed(), num_members=3))
    rows = ensemble.explain()
    assert all(isinstance(row, Route) for row in rows)
    routes = {(row.path, row.module): (row.route, row.reason) for row in rows}
    assert routes[("", "Mixed")] == ("traced", "")
    assert routes[("inp", "Linear")] == ("batched", "")
    assert routes[("inner.fc", "Linear")] == ("batched", "")
    assert routes[("head.0", "Linear")] == ("batched", "")
    assert routes[("head.1", "Tanh")] == ("batched", "")
    assert routes[("drop", "AlphaDropout")][0] == "vmap"
    assert routes[("inner", "op linalg_vector_norm")] == ("vmap", "no batched rule")
    assert {(row.path, row.module) for row in rows.fallbacks} == {
        ("drop", "AlphaDropout"),
        ("inner", "op linalg_vector_norm"),
    }
    text = str(rows)
    assert text.splitlines()[0].split() == ["path", "module", "route", "why"]
    assert "<template>" in text and "inner.fc" in text
    assert repr(rows) == text


def test_explain_of_a_whole_vmapped_forward_names_the_reason():
    ensemble = _quiet(lambda: Ensemble(Untraceable(), num_members=2))
    (row,) = ensemble.explain()
    assert (row.path, row.module, row.route) == ("", "Untraceable", "vmap")
    assert "untraceable by torch.fx" in row.reason
    # an activation function with no batched form: the whole transformer is vmapped
    template = nn.Transformer(8, 2, 1, 1, 16, activation=lambda x: x * torch.sigmoid(x))
    ensemble = _quiet(lambda: Ensemble(template, num_members=2))
    rows = ensemble.explain()
    assert rows[0].path == "" and rows[0].route == "vmap" and len(rows) == 1
    assert "nothing to batch" in rows[0].reason


def test_explain_agrees_with_the_summary():
    ensemble = _quiet(lambda: Ensemble(Mixed(), num_members=2))
    summary = ensemble.batched_summary
    for row in ensemble.explain().fallbacks:
        name = row.module if row.module.startswith("op ") else row.path
        assert f"`{name}` vmapped" in summary


def test_fully_batched_ensemble_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ensemble = Ensemble(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), num_members=2)
        ensemble(torch.randn(2, 3))
        ensemble.eval()(torch.randn(2, 3))
    assert ensemble.explain().fallbacks == ()


def test_fallback_warns_once_per_ensemble_and_points_at_the_caller():
    with pytest.warns(EnsembleFallbackWarning) as record:
        ensemble = Ensemble(Mixed(), num_members=2)
    assert len(record) == 1
    message = str(record[0].message)
    assert "`drop` (AlphaDropout" in message and "linalg_vector_norm" in message
    assert "explain()" in message and "EnsembleFallbackWarning" in message
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnsembleFallbackWarning)
        x = torch.randn(5, 3)
        ensemble(x)
        ensemble.eval()  # a new plan for eval mode: the ensemble has already said it
        ensemble(x)
        ensemble.train()
        copy.deepcopy(ensemble)(x)
        pickle.loads(pickle.dumps(ensemble))(x)


def test_each_new_ensemble_warns_and_the_category_silences_it():
    for _ in range(2):
        with pytest.warns(EnsembleFallbackWarning):
            Ensemble(Untraceable(), num_members=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=EnsembleFallbackWarning)
        Ensemble(Untraceable(), num_members=2)


def test_fallback_results_still_equal_the_loop():
    torch.manual_seed(0)
    models = [Mixed() for _ in range(3)]
    ensemble = _quiet(lambda: Ensemble(*copy.deepcopy(models)))
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(ensemble(x), torch.stack([m(x) for m in models]))


def test_a_configuration_without_batched_form_names_the_limits():
    ensemble = _quiet(lambda: Ensemble(nn.Sequential(nn.Linear(3, 4), nn.Softmax()), num_members=2))
    (row,) = ensemble.explain().fallbacks
    assert (row.path, row.module, row.route) == ("1", "Softmax", "vmap")
    assert row.reason == "this configuration has no batched form (`dim=None`)"


class EvalOnlyFallback(nn.Module):
    """Batched in train mode; in eval mode its forward cannot be traced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        if self.training:
            return self.fc(x)
        return self.fc(x) / len(x)


def test_a_warning_raised_as_an_error_leaves_the_ensemble_consistent():
    torch.manual_seed(0)
    models = [EvalOnlyFallback() for _ in range(2)]
    x = torch.randn(4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EnsembleFallbackWarning)
        ensemble = Ensemble(*copy.deepcopy(models))  # train mode: batched, no warning
        with pytest.raises(EnsembleFallbackWarning, match="EvalOnlyFallback"):
            ensemble.eval()
        assert ensemble.explain().fallbacks  # the eval plan is in place
        expected = torch.stack([m.eval()(x) for m in models])
        torch.testing.assert_close(ensemble(x), expected)
        ensemble.train()
        ensemble.eval()  # said once: no second warning
