"""A plan follows the train/eval flags it was built for, however they change.

A custom ``forward`` is traced once per mode, and a branch on ``self.training``
(its own or a submodule's) is decided by the trace. The flags may change through
``ensemble.train()``/``eval()``, through ``ensemble.apply(fn)``, or directly on the
template's modules (``ensemble.template.block.eval()``): each time the ensemble
must run the branch a loop over the member modules runs.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tdfunc import Ensemble


class _Branchy(nn.Module):
    """Doubles the hidden layer while ``inner`` trains, adds 1 while the model trains."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = self.inner(x)
        if self.inner.training:
            h = h * 2
        if self.training:
            h = h + 1
        return self.head(h)


def _pair():
    torch.manual_seed(0)
    models = [_Branchy() for _ in range(3)]
    ensemble = Ensemble(*copy.deepcopy(models))
    assert "traced" in str(ensemble.explain())
    return ensemble, models


def _check(ensemble, models, x):
    expected = torch.stack([model(x) for model in models])
    torch.testing.assert_close(ensemble(x), expected)


def test_a_submodule_switched_on_the_template_is_seen():
    ensemble, models = _pair()
    x = torch.randn(5, 3)
    _check(ensemble, models, x)
    ensemble.template.inner.eval()
    for model in models:
        model.inner.eval()
    _check(ensemble, models, x)
    ensemble.template.inner.train()
    for model in models:
        model.inner.train()
    _check(ensemble, models, x)


def test_the_template_flag_set_directly_is_seen():
    ensemble, models = _pair()
    x = torch.randn(5, 3)
    ensemble(x)
    ensemble.template.training = False
    for model in models:
        model.training = False
    _check(ensemble, models, x)


def test_every_way_into_the_forward_sees_the_switch():
    ensemble, models = _pair()
    x = torch.randn(5, 3)
    ensemble(x)
    ensemble.template.inner.eval()
    for model in models:
        model.inner.eval()
    expected = torch.stack([model(x) for model in models])
    torch.testing.assert_close(ensemble.forward(x), expected)
    torch.testing.assert_close(ensemble.functional_call(ensemble.params, x), expected)
    torch.testing.assert_close(ensemble[[0, 2]](x), expected[[0, 2]])
    per_member = x.expand(3, *x.shape)
    torch.testing.assert_close(ensemble(per_member, in_dims=0), expected)


def test_apply_that_switches_a_submodule_is_seen():
    ensemble, models = _pair()
    x = torch.randn(5, 3)
    ensemble(x)

    def freeze_inner(module):
        if isinstance(module, _Branchy):
            module.inner.eval()

    ensemble.apply(freeze_inner)
    for model in models:
        model.apply(freeze_inner)
    _check(ensemble, models, x)


def test_a_copy_keeps_following_its_own_template():
    ensemble, models = _pair()
    x = torch.randn(5, 3)
    ensemble(x)
    twin = copy.deepcopy(ensemble)
    twin.template.inner.eval()
    _check(ensemble, models, x)  # the original's template is untouched
    for model in models:
        model.inner.eval()
    _check(twin, models, x)


def test_a_compiled_ensemble_follows_a_switched_submodule():
    ensemble, models = _pair()
    x = torch.randn(5, 3)
    compiled = torch.compile(ensemble, backend="eager")
    _check(compiled, models, x)
    ensemble.template.inner.eval()
    for model in models:
        model.inner.eval()
    _check(compiled, models, x)
