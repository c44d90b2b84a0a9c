"""``load_member_state_dicts`` against a loop of ``module.load_state_dict`` over N modules."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble

N = 3


def models(make, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [make() for _ in range(N)]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def normed() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def states_of(make, seed: int) -> list[dict]:
    return [dict(m.state_dict()) for m in models(make, seed)]


def assert_like_loop(ensemble: Ensemble, loop: list[nn.Module]) -> None:
    for name, value in ensemble.params.flatten_keys(".").items():
        expected = torch.stack([dict(m.state_dict(keep_vars=True))[name] for m in loop])
        assert torch.equal(value, expected), name


def both(make=mlp):
    loop = models(make)
    return Ensemble(*copy.deepcopy(loop)), loop


@pytest.mark.parametrize("hole", [0, 1, 2])
def test_a_key_missing_from_one_state_dict_is_skipped_for_that_member_only(hole):
    ensemble, loop = both()
    states = states_of(mlp, seed=1)
    del states[hole]["2.bias"]
    for module, state in zip(loop, states):
        module.load_state_dict(state, strict=False)
    ensemble.load_member_state_dicts(states, strict=False)
    assert_like_loop(ensemble, loop)
    x = torch.randn(5, 3)
    torch.testing.assert_close(ensemble(x), torch.stack([m(x) for m in loop]))


def test_strict_refusal_names_the_state_dict_and_changes_nothing():
    ensemble, loop = both()
    states = states_of(mlp, seed=1)
    del states[2]["0.weight"]
    with pytest.raises(RuntimeError, match="Missing key"):
        loop[2].load_state_dict(states[2])  # the reference refuses too
    before = ensemble.params.clone()
    with pytest.raises(KeyError, match=r"state dict 2 does not match.*missing \['0\.weight'\]"):
        ensemble.load_member_state_dicts(states)
    assert (ensemble.params == before).all()


@pytest.mark.parametrize("value", ["a string", None, 3, 2.5, [1.0, 2.0], {"a": 1}])
def test_a_value_that_is_not_a_tensor_is_refused_by_name(value):
    ensemble, loop = both()
    states = states_of(mlp, seed=1)
    states[1]["2.bias"] = value
    with pytest.raises(RuntimeError, match=r"expected torch\.Tensor"):
        loop[1].load_state_dict(states[1])
    before = ensemble.params.clone()
    with pytest.raises(TypeError) as info:
        ensemble.load_member_state_dicts(states)
    message = str(info.value)
    assert message.startswith("Ensemble.load_member_state_dicts: state dict 1")
    assert "'2.bias'" in message and type(value).__name__ in message and "tensor" in message
    assert (ensemble.params == before).all()


def test_a_wrong_shape_is_refused_before_anything_is_written():
    ensemble, _ = both()
    states = states_of(mlp, seed=1)
    states[2]["0.weight"] = torch.zeros(4, 4)
    before = ensemble.params.clone()
    with pytest.raises(ValueError, match=r"state dict 2 holds '0\.weight' with shape \[4, 4\], "
                       r"expected \[4, 3\]"):  # fmt: skip
        ensemble.load_member_state_dicts(states)
    assert (ensemble.params == before).all()


def test_loads_cast_dtypes_and_accept_what_module_loads_accept():
    ensemble, loop = both(normed)
    states = states_of(normed, seed=2)
    for state in states:
        state["0.weight"] = state["0.weight"].double()  # cast on copy, as module loads do
        del state["1.num_batches_tracked"]  # a batch norm fills it in from itself
    for module, state in zip(loop, states):
        module.load_state_dict(state)
    ensemble.load_member_state_dicts(states)
    assert_like_loop(ensemble, loop)
    assert ensemble.stacked[0].weight.dtype == torch.float32


def test_a_one_element_vector_loads_into_a_scalar_as_module_loads_allow():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.randn(()))
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x) * self.scale

    ensemble, loop = both(Scaled)
    states = states_of(Scaled, seed=3)
    states[0]["scale"] = states[0]["scale"].reshape(1)
    for module, state in zip(loop, states):
        module.load_state_dict(state)
    ensemble.load_member_state_dicts(states)
    assert_like_loop(ensemble, loop)


def test_unexpected_keys_are_ignored_without_strict_like_the_loop():
    ensemble, loop = both()
    states = states_of(mlp, seed=4)
    states[0]["extra"] = "not even a tensor"
    for module, state in zip(loop, states):
        module.load_state_dict(state, strict=False)
    ensemble.load_member_state_dicts(states, strict=False)
    assert_like_loop(ensemble, loop)
    with pytest.raises(KeyError, match=r"unexpected \['extra'\]"):
        ensemble.load_member_state_dicts(states)


def test_a_shared_tensor_loads_from_the_state_dicts_that_hold_it():
    class Bounded(nn.Module):
        def __init__(self, bound):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.bound = bound

        def forward(self, x):
            return self.lin(x).clamp(max=self.bound.abs())

    bound = nn.Parameter(torch.ones(2))
    torch.manual_seed(5)
    ensemble = Ensemble(*[Bounded(bound) for _ in range(N)], shared=["bound"])
    states = ensemble.member_state_dicts()
    states = [{k: v.clone() + 1 for k, v in s.items()} for s in states]
    del states[0]["bound"]  # the others agree: they give the value
    ensemble.load_member_state_dicts(states, strict=False)
    torch.testing.assert_close(ensemble.stacked.bound, states[1]["bound"])
    states[2]["bound"] = states[2]["bound"] + 1
    with pytest.raises(ValueError, match=r"'bound' is shared.*state dict 2.*state dict 1"):
        ensemble.load_member_state_dicts(states, strict=False)
