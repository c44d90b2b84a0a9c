"""The two ways the functional optimizers read pytrees give the same results and errors.

Plain TensorDicts are read by walking their entries (``tdfunc.optim._leaves``);
every other pytree goes through ``torch.utils._pytree``. The reference for the
TensorDict path is the generic path on the same inputs (forced by making the
direct reader decline), and plain dicts of the same tensors.
"""

from __future__ import annotations

import pytest
import torch
from optimizer_table import OPTIMIZERS, cases
from torch.utils._pytree import tree_map

from tdfunc import NonTensorData, TensorDict, optim
from tdfunc.optim import _leaves

N = 3


def make_params(seed: int = 0) -> TensorDict:
    generator = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(N, *shape, generator=generator)

    # a nested level with a longer batch size than its parent's
    deep = TensorDict({"d": TensorDict({"e": leaf(1)}, [N, 1])}, [N, 1])
    return TensorDict({"a": leaf(4), "b": {"w": leaf(2, 5), "v": leaf()}, "c": deep}, [N])


def randn_like(tree, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return tree_map(lambda t: torch.randn(t.shape, generator=generator), tree)


def run(opt, params, steps: int = 3):
    state = opt.init(params)
    for index in range(steps):
        updates, state = opt.update(randn_like(params, index), state, params)
        params = optim.apply_updates(params, updates)
    return params, state


def assert_identical(ours: TensorDict, theirs: TensorDict) -> None:
    """Same class, keys in the same order, batch sizes, names, device and bits at every level."""
    assert type(ours) is type(theirs)
    keys = list(ours.keys())  # iterating a TensorDict walks its first batch dim, not its keys
    assert keys == list(theirs.keys())
    assert ours.batch_size == theirs.batch_size and ours.device == theirs.device
    assert ours._names == theirs._names
    for key in keys:
        if isinstance(ours[key], torch.Tensor):
            assert torch.equal(ours[key], theirs[key]) and ours[key].dtype == theirs[key].dtype
        else:
            assert_identical(ours[key], theirs[key])


# every case of the table, and optax's eps_root, which torch.optim does not have
PATH_CASES = [
    *cases(N),
    pytest.param("adam", {"lr": 0.01, "eps_root": 1e-16}, id="adam-eps_root"),
]


@pytest.mark.parametrize(("name", "kwargs"), PATH_CASES)
def test_tensordict_path_equals_generic_path(name, kwargs, monkeypatch):
    def make_opt():
        return OPTIMIZERS[name].functional(**kwargs)

    params = make_params()
    params.names = ["member"]
    assert _leaves.read(params, [params.clone()]) is not None  # the direct path is taken
    fast_params, fast_state = run(make_opt(), params)
    monkeypatch.setattr(_leaves, "read", lambda template, others: None)
    slow_params, slow_state = run(make_opt(), params)
    assert_identical(fast_params, slow_params)
    assert_identical(fast_state, slow_state)


def test_tensordict_path_equals_plain_dicts():
    params = make_params()
    tensordict_params, tensordict_state = run(optim.adam(lr=0.1, weight_decay=0.01), params)
    dict_params, dict_state = run(optim.adam(lr=0.1, weight_decay=0.01), params.to_dict())
    # the state of a dict counts one step for all; a TensorDict's, one per member
    assert torch.equal(tensordict_state["step"], dict_state["step"].expand(N))
    tensordict_state, dict_state = tensordict_state.exclude("step"), dict(dict_state)
    del dict_state["step"]
    for ours, theirs in ((tensordict_params, dict_params), (tensordict_state, dict_state)):
        flat = ours.flatten_keys(".")
        plain = TensorDict(theirs, batch_size=[]).flatten_keys(".")
        keys = sorted(flat.keys())
        assert keys == sorted(plain.keys())
        for key in keys:
            assert torch.equal(flat[key], plain[key])


def test_non_tensor_entries_take_the_generic_path():
    params = make_params()
    params["note"] = NonTensorData("kept", batch_size=[N])
    new_params, _ = run(optim.adam(lr=0.1), params)
    assert new_params["note"] == "kept"
    reference, _ = run(optim.adam(lr=0.1), params.exclude("note"))
    assert_identical(new_params.exclude("note"), reference)


def test_inputs_are_not_modified_and_outputs_are_new():
    params = make_params()
    grads = randn_like(params, 7)
    opt = optim.adam(lr=torch.tensor([0.1, 0.2, 0.3]))
    state = opt.init(params)
    copies = [tree.clone() for tree in (params, grads, state)]
    updates, new_state = opt.update(grads, state, params)
    new_params = optim.apply_updates(params, updates)
    for before, after in zip(copies, (params, grads, state)):
        assert_identical(before, after)
    for new in (updates, new_state["exp_avg"], new_params):
        assert new is not params and new["b"] is not params["b"]
    assert new_state is not state and new_state["exp_avg"] is not state["exp_avg"]


# ------------------------------------------------------------------ structure and shapes
@pytest.mark.parametrize("kind", ["tensordict", "dict"])
def test_moments_with_another_key_order_are_refused(kind):
    params = make_params()
    if kind == "dict":
        params = params.to_dict()
    opt = optim.adam(lr=0.1)
    state = opt.init(params)
    moment = state["exp_avg"]
    reordered = {key: moment[key] for key in reversed(list(moment.keys()))}
    state["exp_avg"] = TensorDict(reordered, batch_size=[N]) if kind == "tensordict" else reordered
    message = r"state\['exp_avg'\] and grads must have the same structure"
    with pytest.raises(ValueError, match=message):
        opt.update(params, state, params)


@pytest.mark.parametrize("kind", ["tensordict", "dict"])
def test_leaves_of_other_shapes_are_refused(kind):
    params = make_params()
    other = params.clone()
    other["a"] = torch.zeros(N, 1)  # broadcasts against [N, 4]: must not be used
    if kind == "dict":
        params, other = params.to_dict(), other.to_dict()
    opt = optim.adam(lr=0.1, weight_decay=0.1)
    with pytest.raises(ValueError, match=r"params leaf at .*'a'.* has shape \[3, 1\]"):
        opt.update(params, opt.init(params), other)
    with pytest.raises(ValueError, match=r"state\['exp_avg'\] leaf at .*'a'.* has shape \[3, 1\]"):
        opt.update(params, opt.init(other), params)
    with pytest.raises(ValueError, match=r"apply_updates: the updates leaf at .*'a'.* has shape"):
        optim.apply_updates(params, other)
