"""Changes to ``Ensemble.template`` after the ensemble was made, and hooks on the
members' submodules, against a loop of ordinary modules given the same changes.

The batched plan is built from the template: what it read (a Python attribute of a
traced ``forward``, a layer's setting, the submodules, the hooks) must not go stale.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, EnsembleFallbackWarning


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4)
        self.act = nn.LeakyReLU(0.1)
        self.scale = 2.0

    def forward(self, x):
        return self.act(self.layer(x)) * self.scale


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EnsembleFallbackWarning)
        yield


def _pair():
    torch.manual_seed(0)
    models = [_Scaled() for _ in range(3)]
    return models, Ensemble(*copy.deepcopy(models)), torch.randn(5, 3)


def _check(ensemble, models, x):
    for model in models:
        model.zero_grad()
    ensemble.zero_grad()
    out = ensemble(x)
    expected = torch.stack([model(x) for model in models])
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    grads = torch.stack([model.layer.weight.grad for model in models])
    torch.testing.assert_close(ensemble.stacked.layer.weight.grad, grads)


def _change(ensemble, models, change):
    change(ensemble.template)
    for model in models:
        change(model)


CHANGES = {
    "attribute read by the traced forward": lambda m: setattr(m, "scale", 5.0),
    "setting of a batched layer": lambda m: setattr(m.act, "negative_slope", 0.5),
    "submodule without tensors replaced": lambda m: setattr(m, "act", nn.Tanh()),
    "forward hook": lambda m: m.layer.register_forward_hook(lambda mod, i, o: o * 0 + 1),
    "forward pre-hook": lambda m: m.layer.register_forward_pre_hook(lambda mod, i: (i[0] * 2,)),
}


@pytest.mark.parametrize("name", CHANGES)
def test_a_template_change_after_calls_reaches_every_member(name):
    models, ensemble, x = _pair()
    _check(ensemble, models, x)  # the plan is built and used
    _change(ensemble, models, CHANGES[name])
    _check(ensemble, models, x)
    ensemble.eval()
    for model in models:
        model.eval()
    _check(ensemble, models, x)


def test_a_removed_hook_stops_running():
    models, ensemble, x = _pair()
    handles = [m.layer.register_forward_hook(lambda mod, i, o: -o) for m in models]
    handle = ensemble.template.layer.register_forward_hook(lambda mod, i, o: -o)
    _check(ensemble, models, x)
    handle.remove()
    for h in handles:
        h.remove()
    _check(ensemble, models, x)


def test_hooks_held_by_the_members_when_the_ensemble_is_made_run():
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)) for _ in range(3)]
    for model in models:
        model[0].register_forward_hook(lambda mod, i, o: o + 1)
        model[2].register_forward_pre_hook(lambda mod, i: (i[0] * 3,))
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 3)
    torch.testing.assert_close(ensemble(x), torch.stack([model(x) for model in models]))
    for model in models:
        model.register_forward_hook(lambda mod, i, o: o.flip(-1))
    ensemble = Ensemble(*copy.deepcopy(models))  # on the model itself
    torch.testing.assert_close(ensemble(x), torch.stack([model(x) for model in models]))


def test_backward_hooks_are_refused():
    models = [nn.Sequential(nn.Linear(3, 4), nn.Tanh()) for _ in range(2)]
    for model in models:
        model[1].register_full_backward_hook(lambda mod, gi, go: (gi[0] * 2,))
    with pytest.raises(ValueError, match=r"Ensemble: the submodule '1' \(Tanh\) has backward"):
        Ensemble(*models)
    models, ensemble, x = _pair()
    ensemble.template.act.register_full_backward_hook(lambda mod, gi, go: None)
    with pytest.raises(ValueError, match=r"'act' \(LeakyReLU\) has backward hooks"):
        ensemble(x)


def test_new_parameters_in_the_template_are_a_clear_error():
    models, ensemble, x = _pair()
    ensemble(x)
    ensemble.template.extra = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"added \['extra.bias', 'extra.weight'\]"):
        ensemble(x)
    del ensemble.template.extra
    _check(ensemble, models, x)


def test_a_replaced_submodule_with_the_same_parameters_uses_the_stacked_ones():
    models, ensemble, x = _pair()
    ensemble(x)
    ensemble.template.layer = nn.Linear(3, 4)  # its own (random) tensors are not used
    _check(ensemble, models, x)


def test_train_and_eval_keep_their_plans_once_the_template_is_watched():
    _, ensemble, x = _pair()
    ensemble.template  # handed out
    ensemble(x)
    ensemble.eval()
    ensemble(x)
    plans = dict(ensemble._plans)
    for mode in (True, False, True):
        ensemble.train(mode)
        ensemble(x)
    assert all(ensemble._plans[key] is plan for key, plan in plans.items())


def test_a_copy_of_a_watched_ensemble_follows_its_own_template():
    models, ensemble, x = _pair()
    ensemble.template.scale = 3.0
    other = copy.deepcopy(ensemble)
    other.template.scale = 4.0
    for model in models:
        model.scale = 3.0
    _check(ensemble, models, x)
    for model in models:
        model.scale = 4.0
    _check(other, models, x)


def test_a_watched_ensemble_compiles_in_one_graph_and_follows_after_an_eager_call():
    models, ensemble, x = _pair()
    ensemble.template  # handed out
    compiled = torch.compile(ensemble, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), torch.stack([model(x) for model in models]))
    _change(ensemble, models, CHANGES["attribute read by the traced forward"])
    ensemble(x)  # an eager call sees the change and builds the plan again
    torch.testing.assert_close(compiled(x), torch.stack([model(x) for model in models]))


def test_a_hooked_submodule_compiles_in_one_graph_with_the_members_gradients():
    # the hooked part runs under vmap; no transformer layer there, so nothing may break
    # the graph to switch their fused path off
    models, ensemble, x = _pair()
    _change(ensemble, models, CHANGES["forward hook"])
    _change(ensemble, models, CHANGES["forward pre-hook"])
    ensemble(x)  # an eager call builds the plan for the changed template
    compiled = torch.compile(ensemble, backend="eager", fullgraph=True)
    out = compiled(x)
    expected = torch.stack([model(x) for model in models])
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    grads = torch.stack([model.layer.weight.grad for model in models])
    torch.testing.assert_close(ensemble.stacked.layer.weight.grad, grads)


def test_member_state_dicts_do_not_hand_the_template_out():
    # Reading or loading member state dicts goes through the template internally; only a
    # user's own reference to it pays the per-call comparison.
    torch.manual_seed(0)
    models = [_Scaled() for _ in range(3)]
    ens = Ensemble(*copy.deepcopy(models))
    states = ens.member_state_dicts()
    ens.load_member_state_dicts(states)
    assert "_template_seen" not in ens.__dict__
    x = torch.randn(5, 3)
    torch.testing.assert_close(ens(x), torch.stack([m(x) for m in models]))
    assert ens.template is not None  # handing it out is what turns the check on
    assert "_template_seen" in ens.__dict__
