"""A tensor an ensemble keeps shared stays known as shared when it is replaced or copied.

Optimizers refuse a per-member hyperparameter for a shared tensor; they learn which
tensors are shared from the ensemble. A shared ``[3, 3]`` weight in a 3-member
ensemble has a size that passes for stacked, so if the ensemble forgot it after
``load_state_dict(assign=True)``, a copy or an attribute set, the per-member learning
rates would be applied along its first dim, silently.
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, optim

PER_MEMBER = torch.tensor([0.1, 0.2, 0.3])


def _ensemble() -> Ensemble:
    torch.manual_seed(0)
    return Ensemble(
        nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)), num_members=3, shared=["0.weight"]
    )


def _assigned(ensemble: Ensemble) -> Ensemble:
    state = {key: value.clone() + 1 for key, value in ensemble.state_dict().items()}
    ensemble.load_state_dict(state, assign=True)
    assert torch.equal(ensemble.stacked[0].weight, state["stacked.0.weight"])
    return ensemble


def _saved_and_loaded(ensemble: Ensemble) -> Ensemble:
    buffer = io.BytesIO()
    torch.save(ensemble, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def _attribute_set(ensemble: Ensemble) -> Ensemble:
    ensemble.stacked[0].weight = nn.Parameter(torch.zeros(3, 3))
    return ensemble


ROUTES = {
    "load_state_dict(assign=True)": _assigned,
    "deepcopy": copy.deepcopy,
    "torch.save/torch.load": _saved_and_loaded,
    "attribute set": _attribute_set,
}


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_per_member_value_is_still_refused_for_the_shared_tensor(route):
    ensemble = ROUTES[route](_ensemble())
    shared = ensemble.stacked[0].weight
    assert shared.shape == (3, 3)  # a size that would pass for [N, ...] with N = 3
    with pytest.raises(ValueError, match=r"keeps shared .*no member dim"):
        optim.Adam(list(ensemble.parameters()), lr=PER_MEMBER)
    with pytest.raises(ValueError, match="keeps shared"):
        optim.SGD([{"params": list(ensemble.parameters()), "lr": PER_MEMBER}], lr=0.1)
    stacked = [p for p in ensemble.parameters() if p is not shared]
    optim.Adam(stacked, lr=PER_MEMBER)  # the stacked tensors take one value per member


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_the_stacked_tensors_stay_per_member(route):
    ensemble = ROUTES[route](_ensemble())
    shared = ensemble.stacked[0].weight
    for parameter in ensemble.parameters():
        if parameter is not shared:
            # a one-parameter group: the per-member value is accepted for each of them
            optim.SGD([parameter], lr=PER_MEMBER)


def test_after_assign_one_step_equals_the_float_learning_rates_per_member():
    """With the shared tensor in a group of its own, the per-member step of the stacked
    tensors equals three SGD runs, one per learning rate (torch.optim as the reference)."""
    ensemble = _assigned(_ensemble())
    shared = ensemble.stacked[0].weight
    stacked = [p for p in ensemble.parameters() if p is not shared]
    opt = optim.SGD(
        [{"params": stacked, "lr": PER_MEMBER}, {"params": [shared], "member_dim": False}],
        lr=0.05,
    )
    before = [p.detach().clone() for p in stacked]
    x = torch.randn(4, 3)
    ensemble(x).pow(2).sum().backward()
    grads = [p.grad.clone() for p in stacked]
    shared_before, shared_grad = shared.detach().clone(), shared.grad.clone()
    opt.step()
    for member, lr in enumerate(PER_MEMBER.tolist()):
        for old, grad, new in zip(before, grads, stacked):
            reference = old[member].clone().requires_grad_()
            torch_opt = torch.optim.SGD([reference], lr=lr)
            reference.grad = grad[member]
            torch_opt.step()
            torch.testing.assert_close(new[member].detach(), reference.detach())
    reference = shared_before.clone().requires_grad_()
    reference.grad = shared_grad
    torch.optim.SGD([reference], lr=0.05).step()
    torch.testing.assert_close(shared.detach(), reference.detach())
