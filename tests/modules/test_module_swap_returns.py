"""What ``to_module`` returns: the module's previous values, as a TensorDict and a
context manager (tensordict's behaviour), and loads without ``with`` inside transforms.

References are the module's own objects read through ``named_parameters`` /
``named_buffers`` before the call, and ``torch.func.functional_call`` with dicts.
"""

from __future__ import annotations

import gc
import pickle

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from tdfunc import TensorDict


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _slots(module: nn.Module) -> dict:
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _fresh(module: nn.Module, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(v.shape, generator=g) for name, v in _slots(module).items()}


def test_old_values_come_back_as_a_tensordict_that_restores_them():
    model = _mlp()
    before = _slots(model)
    values = _fresh(model)
    new = TensorDict(values, []).unflatten_keys(".")
    old = new.to_module(model)
    # the module holds the new values (as Parameters once the load is for good)
    for name, value in _slots(model).items():
        assert torch.equal(value, values[name]), name
    # the returned TensorDict holds exactly the objects the module held before
    assert isinstance(old, TensorDict) and old.batch_size == torch.Size([])
    assert sorted(old.keys(True, True)) == sorted(new.keys(True, True))
    for name, value in before.items():
        assert old[tuple(name.split("."))] is value, name
    assert (old == TensorDict(before, []).unflatten_keys(".")).all()
    # ... and putting it back restores the very same objects
    old.to_module(model)
    gc.collect()
    assert all(value is before[name] for name, value in _slots(model).items())
    x = torch.randn(5, 3)
    assert torch.equal(model(x), functional_call(model, before, (x,)))


def test_old_values_are_plain_tensordicts_once_derived_and_pickle_as_such():
    model = _mlp()
    old = TensorDict(_fresh(model), []).unflatten_keys(".").to_module(model)
    derived = old.apply(lambda t: t * 2)
    assert type(derived) is TensorDict and type(old["0"]) is TensorDict
    assert type(old[None]) is TensorDict and type(old.clone()) is TensorDict
    back = pickle.loads(pickle.dumps(old))
    assert type(back) is TensorDict
    assert torch.equal(back["2", "bias"], old["2", "bias"])


def test_with_block_returns_the_previous_values():
    model = _mlp()
    before = _slots(model)
    new = TensorDict(_fresh(model), []).unflatten_keys(".")
    with new.to_module(model) as old:
        assert old["0", "weight"] is before["0.weight"]
        assert model[0].weight is new["0", "weight"]
    assert model[0].weight is before["0.weight"]


def test_tied_weights_appear_once_per_key_of_the_loaded_tensordict():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight
    before = _slots(model)
    new = TensorDict.from_module(model).apply(torch.zeros_like)
    old = new.to_module(model)
    assert model[1].weight is model[0].weight
    assert old["0", "weight"] is before["0.weight"]
    old.to_module(model)
    assert model[1].weight is model[0].weight is before["0.weight"]


def test_from_modules_is_locked_like_tensordict():
    params = TensorDict.from_modules(_mlp(0), _mlp(1))
    assert params.is_locked
    with pytest.raises(RuntimeError):
        params["extra"] = torch.zeros(2)
    assert not TensorDict.from_modules(_mlp(0), _mlp(1), lock=False).is_locked


# ---------------------------------------------------------------- inside transforms
def _stacked(model: nn.Module, members: int = 3) -> TensorDict:
    return torch.stack(
        [TensorDict(_fresh(model, seed), []).unflatten_keys(".") for seed in range(members)]
    )


def _assert_untouched(model: nn.Module, before: dict) -> None:
    for name, value in _slots(model).items():
        assert value is before[name], name
        assert type(value) is nn.Parameter


def test_load_without_with_inside_vmap_raises_and_leaves_the_module_clean():
    model = _mlp()
    before = _slots(model)
    x = torch.randn(5, 3)

    def member(p, x):
        p.to_module(model)  # a load for good cannot outlive the transform
        return model(x)

    with pytest.raises(RuntimeError, match=r"without `with`.*Use `with params\.to_module"):
        vmap(member, (0, None))(_stacked(model), x)
    _assert_untouched(model, before)
    assert torch.equal(model(x), functional_call(model, before, (x,)))  # the trap is gone


def test_load_without_with_inside_grad_raises_and_leaves_the_module_clean():
    model = _mlp()
    before = _slots(model)
    x = torch.randn(5, 3)

    def loss(p):
        p.to_module(model)
        return model(x).sum()

    params = TensorDict(_fresh(model), []).unflatten_keys(".")
    with pytest.raises(RuntimeError, match="without `with`"):
        grad(loss)(params)
    _assert_untouched(model, before)


def test_kept_handle_inside_vmap_gives_the_right_result_and_no_leftovers():
    model = _mlp()
    before = _slots(model)
    x = torch.randn(5, 3)
    stacked = _stacked(model)

    def member(p, x):
        old = p.to_module(model)
        out = model(x)
        old.to_module(model)  # put back by hand: a `with` written out
        return out

    out = vmap(member, (0, None))(stacked, x)
    for index in range(3):
        member_values = {".".join(key): value[index] for key, value in stacked.items(True, True)}
        assert torch.allclose(out[index], functional_call(model, member_values, (x,)))
    _assert_untouched(model, before)
    model(x)  # no pending error: the module was put back inside the transform


def test_plain_tensors_loaded_inside_vmap_stay_for_good():
    # values that do not depend on the transform can be loaded for good
    model = _mlp()
    zeros = TensorDict.from_module(model).apply(lambda t: torch.zeros_like(t).detach())
    x = torch.randn(4, 3)

    def f(x):
        zeros.to_module(model)
        return model(x)

    out = vmap(f)(x)
    assert torch.equal(out, torch.zeros(4, 2))
    assert all(type(p) is nn.Parameter for p in model.parameters())
    assert all(p.abs().sum() == 0 for p in model.parameters())


def test_kept_handle_never_put_back_inside_vmap_is_undone_and_reported():
    # `old = p.to_module(m)` kept to the end of the function: the forward inside
    # sees the member's values; when `old` goes, the swap is undone (it cannot
    # outlive the transform) and the module's next forward says why.
    model = _mlp()
    before = _slots(model)
    x = torch.randn(5, 3)
    stacked = _stacked(model)

    def member(p, x):
        old = p.to_module(model)
        return model(x) + 0 * old["2", "bias"].sum()

    out = vmap(member, (0, None))(stacked, x)
    first = {".".join(key): value[0] for key, value in stacked.items(True, True)}
    assert torch.allclose(out[0], functional_call(_mlp(), first, (x,)))
    _assert_untouched(model, before)
    with pytest.raises(RuntimeError, match="without `with`"):
        model(x)
    model(x)  # reported once


# ---------------------------------------------------------------- messages
def test_keys_with_dots_are_named_whole_in_errors():
    from tdfunc import dims_like

    with pytest.raises(KeyError) as info:
        TensorDict({"wieght.x": torch.zeros(2, 3)}, []).to_module(nn.Linear(3, 2))
    assert info.value.args[0] == (
        "to_module: the TensorDict has key 'wieght.x' but Linear has no submodule "
        "'wieght'. Did you mean 'weight'?"
    )
    with pytest.raises(KeyError) as info:
        TensorDict({"weight.x": torch.zeros(2, 3)}, []).to_module(nn.Linear(3, 2))
    assert info.value.args[0] == (
        "to_module: the TensorDict has key 'weight.x' but Linear has no submodule "
        "'weight'. 'weight' is a parameter or buffer there, not a submodule."
    )
    model = nn.Sequential(nn.Linear(3, 2))
    with pytest.raises(KeyError) as info:
        TensorDict({"0.wieght": torch.zeros(2, 3)}, []).to_module(model)
    assert info.value.args[0] == (
        "to_module: the TensorDict has key '0.wieght' but Linear has no parameter or "
        "buffer 'wieght'. Did you mean 'weight'?"
    )
    td = TensorDict({"a.b": torch.zeros(2), "n": {"c.d": torch.zeros(2)}}, [2])
    with pytest.raises(KeyError) as info:
        dims_like(td, 0, {"a.c": None})
    assert info.value.args[0] == (
        "dims_like: the overrides name key 'a.c', which is not in the TensorDict. "
        "Did you mean 'a.b'?"
    )
    with pytest.raises(KeyError, match=r"key \('n', 'c\.e'\).*Did you mean 'c\.d'\?"):
        dims_like(td, 0, {("n", "c.e"): None})


def test_old_values_behave_as_a_tensordict_in_transforms_and_checkpoints(tmp_path):
    from torch.utils import _pytree

    from tdfunc import ModuleSwap

    model = _mlp()
    before = _slots(model)
    old = TensorDict(_fresh(model), []).unflatten_keys(".").to_module(model)
    assert isinstance(old, ModuleSwap)
    leaves, spec = _pytree.tree_flatten(old)
    assert len(leaves) == 4 and type(_pytree.tree_unflatten(leaves, spec)) is TensorDict
    doubled = vmap(lambda t: t * 2)(torch.stack([old, old]))
    assert torch.equal(doubled["0", "weight"][1], before["0.weight"] * 2)
    old.memmap(tmp_path / "old")
    back = TensorDict.load_memmap(tmp_path / "old")
    assert type(back) is TensorDict
    assert torch.equal(back["2", "bias"], before["2.bias"])
