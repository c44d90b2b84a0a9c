"""Ensembles as RL and uncertainty users write them, against references without tdfunc.

Each workflow runs twice: with ``tdfunc.Ensemble`` and with a Python loop over
ordinary ``nn.Module`` members (their own parameters, ``torch.optim`` over
them). Outputs, gradients and the parameters after optimizer steps must match.

- PETS (mbrl-lib): Gaussian members with learned log-variance bounds shared by
  all members, per-member bootstrap batches, the Gaussian NLL, elite members.
- SAC / REDQ critics: Polyak-averaged targets (``lerp_`` / ``copy_`` under
  ``no_grad``), the target's min over a random subset of members.
- stable-baselines3: a twin critic saved as ``qf0.*`` / ``qf1.*`` loaded member by
  member.
- A deep ensemble with per-member early stopping (best snapshot per member).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tdfunc import Ensemble, TensorDict

ATOL = dict(rtol=1e-5, atol=1e-6)


def close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected, **ATOL)


# ---------------------------------------------------------------------- PETS
class GaussianMember(nn.Module):
    """One member of mbrl-lib's probabilistic ensemble: mean and bounded log-variance."""

    def __init__(self, min_logvar: nn.Parameter, max_logvar: nn.Parameter) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(5, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 6)
        )
        self.min_logvar = min_logvar  # the same Parameter in every member
        self.max_logvar = max_logvar

    def forward(self, x):
        mean, logvar = self.net(x).chunk(2, dim=-1)
        logvar = self.max_logvar - F.softplus(self.max_logvar - logvar)
        logvar = self.min_logvar + F.softplus(logvar - self.min_logvar)
        return mean, logvar


def gaussian_nll(mean, logvar, target):
    return (((mean - target) ** 2) * torch.exp(-logvar) + logvar).mean()


def pets_members(count: int) -> list[nn.Module]:
    min_logvar = nn.Parameter(-10 * torch.ones(1, 3))
    max_logvar = nn.Parameter(0.5 * torch.ones(1, 3))
    return [GaussianMember(min_logvar, max_logvar) for _ in range(count)]


def test_pets_bootstrap_training_with_shared_logvar_bounds():
    torch.manual_seed(0)
    count, batch = 5, 16
    loop_members = pets_members(count)
    ensemble = Ensemble(*copy.deepcopy(loop_members), shared=["min_logvar", "max_logvar"])
    assert ensemble.stacked.max_logvar.shape == (1, 3)  # kept once, not stacked
    bounds = loop_members[0].min_logvar, loop_members[0].max_logvar
    loop_params = list({id(p): p for m in loop_members for p in m.parameters()}.values())
    loop_opt = torch.optim.Adam(loop_params, lr=1e-2)
    ens_opt = torch.optim.Adam(ensemble.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randn(count, batch, 5)  # one bootstrap batch per member
        y = torch.randn(count, batch, 3)
        loop_loss = sum(gaussian_nll(*m(x[k]), y[k]) for k, m in enumerate(loop_members))
        loop_loss = loop_loss + 0.01 * (bounds[1].sum() - bounds[0].sum())
        mean, logvar = ensemble(x, in_dims=0)
        assert mean.shape == (count, batch, 3)
        nll = torch.stack([gaussian_nll(mean[k], logvar[k], y[k]) for k in range(count)])
        stacked = ensemble.stacked
        ens_loss = nll.sum() + 0.01 * (stacked.max_logvar.sum() - stacked.min_logvar.sum())
        close(ens_loss, loop_loss)
        loop_opt.zero_grad()
        ens_opt.zero_grad()
        loop_loss.backward()
        ens_loss.backward()
        # the shared bounds get the sum of the members' gradients, as one shared Parameter
        close(stacked.max_logvar.grad, bounds[1].grad)
        close(stacked.min_logvar.grad, bounds[0].grad)
        close(stacked.net[0].weight.grad, torch.stack([m.net[0].weight.grad for m in loop_members]))
        loop_opt.step()
        ens_opt.step()
    close(ensemble.stacked.max_logvar.detach(), bounds[1].detach())
    for k, member in enumerate(loop_members):
        close(ensemble.stacked.net[-1].weight[k].detach(), member.net[-1].weight.detach())
    # elite members evaluated on one shared batch (trajectory sampling reads them)
    elite = [3, 0, 4]
    x = torch.randn(batch, 5)
    mean, logvar = ensemble.select_members(elite)(x)
    with torch.no_grad():
        for row, k in enumerate(elite):
            expected_mean, expected_logvar = loop_members[k](x)
            close(mean[row].detach(), expected_mean)
            close(logvar[row].detach(), expected_logvar)
    # per-member inputs for the elites carry one slice per elite member
    xs = torch.randn(len(elite), batch, 5)
    mean, _ = ensemble[elite](xs, in_dims=0)
    close(mean[1].detach(), loop_members[0](xs[1])[0].detach())
    with pytest.raises(ValueError, match="expected 3: one slice per member"):
        ensemble[elite](torch.randn(count, batch, 5), in_dims=0)


def test_pets_fresh_copies_keep_the_shared_bounds():
    model = pets_members(1)[0]
    ensemble = Ensemble(model, num_members=4, shared=["min_logvar", "max_logvar"])
    assert torch.equal(ensemble.stacked.max_logvar, model.max_logvar)
    assert not torch.equal(ensemble.stacked.net[0].weight[0], ensemble.stacked.net[0].weight[1])
    states = ensemble.member_state_dicts()
    assert all(torch.equal(s["max_logvar"], model.max_logvar) for s in states)


# ---------------------------------------------------------------------- SAC / REDQ
def critic() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def test_redq_critics_polyak_targets_and_min_over_a_random_subset():
    torch.manual_seed(1)
    count, batch, tau, gamma = 10, 8, 0.05, 0.99
    loop_q = [critic() for _ in range(count)]
    loop_target = copy.deepcopy(loop_q)
    q = Ensemble(*copy.deepcopy(loop_q))
    target = Ensemble(*copy.deepcopy(loop_q))
    loop_opt = torch.optim.Adam([p for m in loop_q for p in m.parameters()], lr=3e-3)
    opt = torch.optim.Adam(q.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(7)
    for _ in range(3):
        obs_act, next_obs_act = torch.randn(batch, 6), torch.randn(batch, 6)
        reward = torch.randn(batch, 1)
        subset = torch.randperm(count, generator=generator)[:2]
        with torch.no_grad():
            expected_next = torch.stack([loop_target[k](next_obs_act) for k in subset.tolist()])
            next_q = target.select_members(subset)(next_obs_act)
            close(next_q, expected_next)
            # the same through functional_call with K = 2 members' parameters
            close(target.functional_call(target.params[subset], next_obs_act), expected_next)
            y = reward + gamma * next_q.min(dim=0).values
        loop_loss = sum(F.mse_loss(m(obs_act), y) for m in loop_q)
        loss = F.mse_loss(q(obs_act), y.expand(count, *y.shape), reduction="none")
        loss = loss.mean(dim=(1, 2)).sum()
        close(loss, loop_loss)
        loop_opt.zero_grad()
        opt.zero_grad()
        loop_loss.backward()
        loss.backward()
        loop_opt.step()
        opt.step()
        with torch.no_grad():  # Polyak averaging, as torchrl's SoftUpdate
            for m, t in zip(loop_q, loop_target):
                for p, tp in zip(m.parameters(), t.parameters()):
                    tp.lerp_(p, tau)
            target.params.lerp_(q.params, tau)
    for k in range(count):
        close(q.stacked[0].weight[k].detach(), loop_q[k][0].weight.detach())
        close(target.stacked[-1].bias[k].detach(), loop_target[k][-1].bias.detach())
    # a hard update keeps the target's registered parameters
    weight = target.stacked[0].weight
    with torch.no_grad():
        target.params.copy_(q.params)
    assert target.stacked[0].weight is weight
    assert torch.equal(weight, q.stacked[0].weight)


def test_selection_gradients_reach_only_the_selected_members():
    torch.manual_seed(2)
    models = [critic() for _ in range(6)]
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(5, 6)
    ensemble[[4, 1]](x).min(dim=0).values.sum().backward()
    torch.stack([models[4](x), models[1](x)]).min(dim=0).values.sum().backward()
    grad = ensemble.stacked[0].weight.grad
    for k in range(6):
        expected = models[k][0].weight.grad
        close(grad[k], torch.zeros_like(grad[k]) if expected is None else expected)
    # an int selects one member: no member dim; a slice gives views
    close(ensemble[2](x), models[2](x))
    assert ensemble[1:3].params["0", "weight"]._base is ensemble.stacked[0].weight


def test_sac_twin_critic_per_member_inputs_and_chunks():
    torch.manual_seed(3)
    models = [critic() for _ in range(2)]
    ensemble = Ensemble(*copy.deepcopy(models), chunk_size=1)
    xs = torch.randn(2, 4, 6)
    close(ensemble(xs, in_dims=0), torch.stack([m(xs[k]) for k, m in enumerate(models)]))
    assert ensemble.in_dims is None  # the per-call in_dims leaves the default alone
    close(ensemble(xs[0]), torch.stack([m(xs[0]) for m in models]))


# ---------------------------------------------------------------------- stable-baselines3
class TwinCritic(nn.Module):
    """stable-baselines3's ContinuousCritic layout: submodules ``qf0``, ``qf1``."""

    def __init__(self) -> None:
        super().__init__()
        for k in range(2):
            self.add_module(f"qf{k}", critic())


def test_stable_baselines3_checkpoint_loaded_member_by_member(tmp_path):
    torch.manual_seed(4)
    saved = TwinCritic()
    torch.save(saved.state_dict(), tmp_path / "critic.pt")
    checkpoint = torch.load(tmp_path / "critic.pt")
    per_member = [
        {key[len(prefix) :]: value for key, value in checkpoint.items() if key.startswith(prefix)}
        for prefix in ("qf0.", "qf1.")
    ]
    ensemble = Ensemble(critic(), num_members=2)
    weight = ensemble.stacked[0].weight
    ensemble.load_member_state_dicts(per_member)
    assert ensemble.stacked[0].weight is weight  # loaded in place
    x = torch.randn(3, 6)
    close(ensemble(x).detach(), torch.stack([saved.qf0(x), saved.qf1(x)]).detach())
    # and back: keys as the model's own
    states = ensemble.member_state_dicts()
    assert list(states[1]) == list(saved.qf1.state_dict())
    close(states[1]["2.bias"], saved.qf1.state_dict()["2.bias"])
    with pytest.raises(KeyError, match=r"prefix \('qf0\.'"):
        ensemble.load_member_state_dicts(
            [{k: v for k, v in checkpoint.items() if k.startswith("qf0.")}] * 2
        )
    with pytest.raises(ValueError, match="expected 2 state dicts"):
        ensemble.load_member_state_dicts(per_member[:1])
    bad = [dict(per_member[0]), per_member[1]]
    bad[0]["0.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"holds .0\.weight. with shape \[3, 3\]"):
        ensemble.load_member_state_dicts(bad)
    close(ensemble(x).detach(), torch.stack([saved.qf0(x), saved.qf1(x)]).detach())


def test_ensemble_checkpoint_through_state_dict_and_memmap(tmp_path):
    torch.manual_seed(5)
    ensemble = Ensemble(critic(), num_members=3)
    restored = Ensemble(critic(), num_members=3)
    restored.load_state_dict(ensemble.state_dict())
    x = torch.randn(4, 6)
    close(restored(x), ensemble(x))
    ensemble.params.detach().memmap(tmp_path / "ens")
    again = Ensemble(critic(), num_members=3)
    with torch.no_grad():
        again.params.copy_(TensorDict.load_memmap(tmp_path / "ens"))
    close(again(x), ensemble(x))


# ---------------------------------------------------------------------- deep ensemble
def regressor() -> nn.Module:
    return nn.Sequential(
        nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1)
    )


def test_deep_ensemble_with_per_member_early_stopping():
    torch.manual_seed(6)
    count, patience = 5, 2
    loop_models = [regressor() for _ in range(count)]
    ensemble = Ensemble(*copy.deepcopy(loop_models))
    loop_opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in loop_models]
    opt = torch.optim.SGD(ensemble.parameters(), lr=0.05)
    loop_best = [(float("inf"), None, 0) for _ in range(count)]  # (loss, state, bad epochs)
    best_loss = torch.full((count,), float("inf"))
    best_params = ensemble.params.detach().clone()
    bad_epochs = torch.zeros(count, dtype=torch.long)
    x_val, y_val = torch.randn(32, 3), torch.randn(32, 1)
    for _ in range(8):
        x, y = torch.randn(count, 16, 3), torch.randn(count, 16, 1)
        active = bad_epochs < patience
        for k, m in enumerate(loop_models):
            if loop_best[k][2] < patience:  # a stopped member is not trained further
                loop_opts[k].zero_grad()
                F.mse_loss(m(x[k]), y[k]).backward()
                loop_opts[k].step()
        opt.zero_grad()
        per_member = ((ensemble(x, in_dims=0) - y) ** 2).mean(dim=(1, 2))
        (per_member * active).sum().backward()  # stopped members get zero gradients
        opt.step()
        with torch.no_grad():
            val = ((ensemble(x_val) - y_val) ** 2).mean(dim=(1, 2))
            improved = val < best_loss
            best_loss = torch.where(improved, val, best_loss)
            best_params[improved] = ensemble.params[improved]
            bad_epochs = torch.where(improved, 0, bad_epochs + 1)
            for k, m in enumerate(loop_models):
                loss = F.mse_loss(m(x_val), y_val).item()
                if loop_best[k][2] >= patience:
                    continue
                if loss < loop_best[k][0]:
                    loop_best[k] = (loss, copy.deepcopy(m.state_dict()), 0)
                else:
                    loop_best[k] = (loop_best[k][0], loop_best[k][1], loop_best[k][2] + 1)
    for k, m in enumerate(loop_models):
        close(ensemble.stacked[0].weight[k].detach(), m[0].weight.detach())
        m.load_state_dict(loop_best[k][1])
    with torch.no_grad():
        ensemble.params.copy_(best_params)
    close(ensemble(x_val).detach(), torch.stack([m(x_val) for m in loop_models]).detach())
