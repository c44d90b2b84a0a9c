"""Member selections, per-call ``in_dims``, shared tensors and ``stacked`` indexing.

References are loops over the ordinary member modules.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, TensorDict


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def members(count: int = 5, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [mlp() for _ in range(count)]


def loop(models, x, per_member: bool = False) -> torch.Tensor:
    return torch.stack([m(x[k] if per_member else x) for k, m in enumerate(models)])


@pytest.mark.parametrize(
    "index",
    [[3, 1], torch.tensor([4, 0, 2]), slice(1, 4), slice(None, None, 2), [2],
     torch.tensor([True, False, True, True, False]), [-1, 0], list(range(5))],
)  # fmt: skip
def test_selection_matches_a_loop_over_the_selected_members(index):
    models = members()
    ensemble = Ensemble(*copy.deepcopy(models))
    chosen = list(range(5))[index] if isinstance(index, slice) else index
    if isinstance(chosen, torch.Tensor):
        chosen = (chosen.nonzero().flatten() if chosen.dtype == torch.bool else chosen).tolist()
    picked = [models[k] for k in chosen]
    x = torch.randn(3, 4)
    selection = ensemble.select_members(index)
    assert selection.indices == [k % 5 for k in chosen] and len(selection) == len(chosen)
    torch.testing.assert_close(selection(x), loop(picked, x))
    xs = torch.randn(len(chosen), 3, 4)
    torch.testing.assert_close(selection(xs, in_dims=0), loop(picked, xs, per_member=True))
    torch.testing.assert_close(
        ensemble.functional_call(selection.params, xs, in_dims=0), loop(picked, xs, True)
    )


@pytest.mark.filterwarnings("ignore::tdfunc.EnsembleFallbackWarning")  # the fallback is the point
def test_selection_sees_optimizer_steps_and_vmapped_templates():
    class Custom(nn.Module):  # an unregistered layer: the whole forward runs under vmap
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 2))

        def forward(self, x):
            return torch.einsum("bi,ij->bj", x, self.w).sin()

    torch.manual_seed(0)
    models = [Custom() for _ in range(4)]
    ensemble = Ensemble(*copy.deepcopy(models))
    selection = ensemble[[1, 3]]
    x = torch.randn(5, 4)
    torch.testing.assert_close(selection(x), loop([models[1], models[3]], x))
    with torch.no_grad():
        ensemble.stacked.w.mul_(2)
        for m in models:
            m.w.mul_(2)
    torch.testing.assert_close(selection(x), loop([models[1], models[3]], x))


def test_selection_errors():
    ensemble = Ensemble(*members())
    with pytest.raises(IndexError, match="out of range"):
        ensemble[5]
    with pytest.raises(IndexError, match="out of range"):
        ensemble[[0, 7]]
    with pytest.raises(IndexError, match="boolean mask must have shape \\[5\\]"):
        ensemble[torch.tensor([True, False])]
    with pytest.raises(TypeError, match="expected an int, a slice"):
        ensemble["a"]
    with pytest.raises(IndexError, match="selects no member"):
        ensemble[3:3]


def test_per_call_in_dims_and_clear_errors():
    models = members(3)
    ensemble = Ensemble(*copy.deepcopy(models))
    xs = torch.randn(3, 6, 4)
    torch.testing.assert_close(ensemble(xs, in_dims=0), loop(models, xs, per_member=True))
    torch.testing.assert_close(
        ensemble(xs.transpose(0, 1), in_dims=1), loop(models, xs, per_member=True)
    )
    torch.testing.assert_close(ensemble(xs, in_dims=(0,)), loop(models, xs, per_member=True))
    assert ensemble.in_dims is None
    with pytest.raises(ValueError, match=r"input 0 has size 6 in its member dim 0.*expected 3"):
        ensemble(torch.randn(6, 3, 4), in_dims=0)
    with pytest.raises(ValueError, match="in_dims has 2 entries but the forward got 1"):
        ensemble(xs, in_dims=(0, None))
    with pytest.raises(TypeError, match="in_dims must be None"):
        ensemble(xs, in_dims="0")
    per_member = Ensemble(*copy.deepcopy(models), in_dims=0)
    torch.testing.assert_close(per_member(xs), loop(models, xs, per_member=True))
    shared_x = torch.randn(6, 4)
    torch.testing.assert_close(per_member(shared_x, in_dims=None), loop(models, shared_x))


def test_functional_call_with_k_members_checks_the_member_dim():
    models = members(4)
    ensemble = Ensemble(*copy.deepcopy(models))
    params = ensemble.params[1:3]
    x = torch.randn(2, 4)
    torch.testing.assert_close(ensemble.functional_call(params, x), loop(models[1:3], x))
    mixed = params.detach().to_dict()
    mixed["2"]["weight"] = ensemble.params["2", "weight"].detach()  # 4 members, not 2
    with pytest.raises(ValueError, match="share one leading member dim; got sizes \\[2, 4\\]"):
        ensemble.functional_call(TensorDict(mixed, batch_size=[]), x)


class Bounded(nn.Module):
    def __init__(self, bound: nn.Parameter):
        super().__init__()
        self.body = nn.Linear(3, 3)
        self.bound = bound
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return torch.minimum(self.body(x) * self.scale, self.bound)


def test_shared_parameters_and_buffers_match_modules_sharing_one_tensor():
    torch.manual_seed(0)
    bound = nn.Parameter(torch.full((3,), 0.3))
    models = [Bounded(bound) for _ in range(4)]
    ensemble = Ensemble(*copy.deepcopy(models), shared=["bound", "scale"])
    assert ensemble.stacked.bound.shape == (3,) and ensemble.stacked.scale.shape == ()
    assert ensemble.params["bound"].shape == (4, 3)
    x = torch.randn(5, 3)
    out = ensemble(x)
    expected = loop(models, x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(ensemble.stacked.bound.grad, bound.grad)
    torch.testing.assert_close(
        ensemble.stacked.body.weight.grad, torch.stack([m.body.weight.grad for m in models])
    )
    torch.testing.assert_close(ensemble[[2, 0]](x), loop([models[2], models[0]], x))
    norms = ensemble.clip_grad_norm_(1.0)  # the shared tensor belongs to no member
    assert norms.shape == (4,)
    assert ensemble.state_dict()["stacked.bound"].shape == (3,)
    states = ensemble.member_state_dicts()
    states[1] = {**states[1], "bound": torch.zeros(3)}
    with pytest.raises(ValueError, match="'bound' is shared"):
        ensemble.load_member_state_dicts(states)


def test_shared_errors():
    models = members(2)
    with pytest.raises(KeyError, match=r"no parameter or buffer '0\.weigth'.*close"):
        Ensemble(*models, shared=["0.weigth"])
    with pytest.raises(ValueError, match="member 1 holds a different value"):
        Ensemble(*models, shared=["0.weight"])
    with pytest.raises(TypeError, match="list of names"):
        Ensemble(*models, shared="0.weight")


def test_stacked_is_indexable_like_the_template():
    ensemble = Ensemble(*members(3))
    assert ensemble.stacked[0] is ensemble.stacked._modules["0"]
    assert ensemble.stacked[-1].weight.shape == (3, 2, 8)
    with pytest.raises(KeyError, match="no parameters or buffers"):
        ensemble.stacked[1]  # the Tanh
    with pytest.raises(IndexError, match="out of range"):
        ensemble.stacked[3]

    class Heads(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
            self.heads = nn.ModuleDict({"pi": nn.Linear(2, 1), "v": nn.Linear(2, 1)})

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.heads["pi"](x) + self.heads["v"](x)

    ensemble = Ensemble(Heads(), num_members=2)
    assert ensemble.stacked.layers[1].weight.shape == (2, 2, 2)
    assert ensemble.stacked.heads["v"].bias.shape == (2, 1)
