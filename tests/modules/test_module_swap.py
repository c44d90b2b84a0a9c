"""``from_module``, ``from_modules`` and ``to_module`` (tdfunc/_modules/module_swap.py).

References come from the modules themselves (``named_parameters``,
``state_dict``, identity of the ``Parameter`` objects) and from
``torch.func.functional_call`` / ``torch.func.stack_module_state`` with plain
dicts.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

import tdfunc._modules.module_swap as module_swap
from tdfunc import TensorClass, TensorDict


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


class _Tricky(nn.Module):
    """Tied weights, one submodule under two names, persistent and non-persistent buffers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(4, 4)
        self.decoder = nn.Linear(4, 4)
        self.decoder.weight = self.encoder.weight  # tied
        self.shared = nn.Linear(4, 4)
        self.alias = self.shared  # the same module under two paths
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("cache", torch.ones(4), persistent=False)

    def forward(self, x):
        h = self.decoder(self.encoder(x)) + self.alias(self.shared(x))
        return self.norm(h) * self.scale + self.cache


def _named_tensors(module: nn.Module) -> dict:
    """Every parameter and buffer slot of ``module`` (duplicates included): name -> object."""
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _nested_key(name: str):
    parts = tuple(name.split("."))
    return parts[0] if len(parts) == 1 else parts


def _replacements(module: nn.Module, seed: int = 1) -> dict:
    """A new tensor (positive values, same dtype) for every distinct tensor of ``module``,
    keyed by its first dotted name."""
    g = torch.Generator().manual_seed(seed)
    named = list(module.named_parameters()) + list(module.named_buffers())
    return {
        name: (torch.rand(value.shape, generator=g) + 0.5).to(value.dtype) for name, value in named
    }


# ---------------------------------------------------------------- from_module
def test_from_module_leaves_are_the_module_tensors_nested_by_submodule():
    model = _mlp()
    params = TensorDict.from_module(model)
    expected = dict(model.named_parameters())
    expected.update(model.named_buffers())
    got = {
        ".".join(k) if isinstance(k, tuple) else k: params.get(k) for k in params.keys(True, True)
    }
    assert got.keys() == expected.keys()
    assert all(got[name] is expected[name] for name in expected)
    assert params.batch_size == torch.Size([]) and params["0"].batch_size == torch.Size([])
    assert "1" not in params  # Tanh: a submodule without tensors has no entry


def test_from_module_keeps_tied_and_shared_tensors_once():
    model = _Tricky()
    params = TensorDict.from_module(model)
    leaves = [params.get(k) for k in params.keys(True, True)]
    expected = list(model.named_parameters()) + list(model.named_buffers())  # no duplicates
    assert len(leaves) == len(expected)
    assert all(any(leaf is value for leaf in leaves) for _, value in expected)
    assert ("decoder", "weight") not in params.keys(True) and "alias" not in params
    assert params["encoder", "weight"] is model.decoder.weight
    assert params["cache"] is model.cache  # non-persistent buffers are collected too


def test_seed_readme_example():
    layer1 = nn.Linear(3, 4)
    layer2 = nn.Linear(4, 4)
    model = nn.Sequential(layer1, layer2)
    params = TensorDict.from_module(model)
    weights1 = TensorDict(layer1.state_dict(), []).unflatten_keys(".")
    weights2 = TensorDict(layer2.state_dict(), []).unflatten_keys(".")
    assert (params == TensorDict({"0": weights1, "1": weights2}, [])).all()
    x = torch.randn(10, 3)
    with params.to_module(model):
        out = model(x)
    assert torch.allclose(out, layer2(layer1(x)))
    params_stack = torch.stack([params, params], 0)

    def func(x, params):
        with params.to_module(model):
            return model(x)

    y = vmap(func, (None, 0))(x, params_stack)
    assert y.shape == torch.Size([2, 10, 4])
    assert torch.allclose(y, torch.stack([out, out]))


def test_from_modules_matches_stack_module_state():
    models = [_mlp(seed) for seed in range(4)]
    params = TensorDict.from_modules(*models)
    reference, _ = stack_module_state(models)
    assert params.batch_size == torch.Size([4])
    assert {".".join(k) for k in params.keys(True, True)} == set(reference)
    for name, value in reference.items():
        leaf = params.get(_nested_key(name))
        assert torch.equal(leaf, value) and leaf.requires_grad and leaf.is_leaf


def test_from_modules_keeps_ties_and_checks_classes():
    params = TensorDict.from_modules(_Tricky(), _Tricky())
    assert params.batch_size == torch.Size([2])
    assert ("decoder", "weight") not in params.keys(True)
    assert not params["scale"].requires_grad
    with pytest.raises(TypeError, match=r"from_modules: .* model 1 is Linear"):
        TensorDict.from_modules(_mlp(), nn.Linear(3, 8))
    with pytest.raises(ValueError, match="from_modules: expected at least one module"):
        TensorDict.from_modules()


# ---------------------------------------------------------------- to_module as a context
def test_with_block_swaps_the_tensors_in_and_restores_the_same_objects():
    model = _mlp()
    before = _named_tensors(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    replacements = _replacements(model)
    params = TensorDict(replacements, []).unflatten_keys(".")
    x = torch.randn(5, 3)
    with params.to_module(model):
        for name, value in replacements.items():
            assert _named_tensors(model)[name] is value
        out = model(x)
    assert torch.allclose(out, functional_call(model, replacements, (x,)))
    after = _named_tensors(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in state)


def test_with_block_restores_on_exception():
    model = _mlp()
    before = _named_tensors(model)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with pytest.raises(RuntimeError, match="boom"), params.to_module(model):
        assert model[0].weight.abs().sum() == 0
        raise RuntimeError("boom")
    assert all(_named_tensors(model)[k] is before[k] for k in before)


def test_tied_shared_and_non_persistent_slots_restored_as_they_were():
    model = _Tricky()
    before = _named_tensors(model)
    state_keys = list(model.state_dict())
    replacements = _replacements(model)
    params = TensorDict(replacements, []).unflatten_keys(".")
    x = torch.randn(3, 4)
    model.eval()
    with params.to_module(model):
        slots = _named_tensors(model)
        assert model.decoder.weight is model.encoder.weight is replacements["encoder.weight"]
        assert model.alias.weight is replacements["shared.weight"]
        assert slots["cache"] is replacements["cache"]
        out = model(x)
    # functional_call re-registers aliased modules' tensors, so it runs on a copy
    reference = functional_call(copy.deepcopy(model), replacements, (x,), tie_weights=True)
    assert torch.allclose(out, reference)
    after = _named_tensors(model)
    assert all(after[k] is before[k] for k in before)
    assert model.decoder.weight is model.encoder.weight
    assert list(model.state_dict()) == state_keys and "cache" not in model.state_dict()


def test_nested_with_blocks_on_the_same_module():
    model = _mlp()
    before = _named_tensors(model)
    zeros = TensorDict.from_module(model).apply(torch.zeros_like)
    ones = TensorDict.from_module(model).apply(torch.ones_like)
    with zeros.to_module(model):
        with ones.to_module(model):
            assert model[0].weight is ones["0", "weight"]
        assert model[0].weight is zeros["0", "weight"]
    assert all(_named_tensors(model)[k] is before[k] for k in before)


def test_sub_tensordict_on_a_submodule():
    model = _mlp()
    before = _named_tensors(model)
    params = TensorDict.from_module(model).apply(lambda t: t.detach() * 0 + 1)
    with params["0"].to_module(model[0]):
        assert model[0].weight is params["0", "weight"]
        assert model[2].weight is before["2.weight"]
    assert all(_named_tensors(model)[k] is before[k] for k in before)


def test_partial_tensordict_swaps_only_its_keys():
    model = _mlp()
    weight = torch.zeros(8, 3)
    with TensorDict({"0": {"weight": weight}}, []).to_module(model):
        assert model[0].weight is weight
        assert isinstance(model[0].bias, nn.Parameter)


def test_swap_path_never_constructs_parameters(monkeypatch):
    model = _mlp()
    params = TensorDict.from_module(model).apply(lambda t: t.detach().clone())
    calls = []
    original = nn.Parameter.__new__

    def counting_new(cls, *args, **kwargs):
        calls.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(nn.Parameter, "__new__", counting_new)
    x = torch.randn(2, 3)
    for _ in range(3):  # the first call builds the plan, the others reuse it
        with params.to_module(model):
            model(x)
    stacked = torch.stack([params, params])
    vmap(lambda p: _run(p, model, x))(stacked)
    grad(lambda p: _run(p, model, x).sum())(params)
    assert calls == []
    nn.Parameter(torch.zeros(1))  # the patch itself works
    assert calls == [nn.Parameter]


def _run(params, model, x):
    with params.to_module(model):
        return model(x)


# ---------------------------------------------------------------- permanent loading
def test_without_with_loads_for_good_as_registered_parameters():
    model = _Tricky()
    names = [name for name, _ in model.named_parameters()]
    state_keys = list(model.state_dict())
    replacements = _replacements(model)
    params = TensorDict(replacements, []).unflatten_keys(".")
    params.to_module(model)
    gc.collect()
    assert [name for name, _ in model.named_parameters()] == names
    assert all(type(p) is nn.Parameter for p in model.parameters())
    for name, value in model.named_parameters():
        assert torch.equal(value, replacements[name]) and value.requires_grad
    assert model.decoder.weight is model.encoder.weight and model.alias is model.shared
    assert model.cache is replacements["cache"] and list(model.state_dict()) == state_keys
    # a normal module: an optimizer step gives what the same step gives on a reference copy
    reference = _Tricky()
    reference.load_state_dict(model.state_dict())
    reference.cache = model.cache.clone()  # not in the state_dict
    x = torch.randn(6, 4)
    for module in (model, reference):
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        module(x).pow(2).sum().backward()
        optimizer.step()
    for (name, value), (_, expected) in zip(model.named_parameters(), reference.named_parameters()):
        assert torch.allclose(value, expected, atol=1e-6), name


def test_without_with_shares_storage_with_the_tensordict():
    model = nn.Linear(3, 2)
    params = TensorDict({"weight": torch.zeros(2, 3), "bias": torch.zeros(2)}, [])
    params.to_module(model)
    with torch.no_grad():
        model.weight.add_(1)
    assert torch.equal(params["weight"], torch.ones(2, 3))


class _DetachesToPlain(torch.Tensor):
    """A tensor subclass whose ops (``detach`` included) return plain tensors, as a
    memory-mapped tensor loaded from disk does: ``nn.Parameter`` refuses it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def test_loading_a_tensor_subclass_for_good_gives_plain_parameters():
    model = nn.Linear(3, 2)
    weight = torch.ones(2, 3).as_subclass(_DetachesToPlain)
    with pytest.raises(RuntimeError):  # why the swap cannot simply wrap it
        nn.Parameter(weight)
    params = TensorDict({"weight": weight, "bias": torch.zeros(2)}, [])
    params.to_module(model)
    assert type(model.weight) is nn.Parameter and model.weight.requires_grad
    assert model.weight.data_ptr() == weight.data_ptr()
    assert torch.equal(model(torch.ones(1, 3)), torch.full((1, 2), 3.0))


def test_handle_commits_when_shown_at_a_prompt_or_on_request():
    model = nn.Linear(3, 2)
    params = TensorDict({"weight": torch.zeros(2, 3)}, [])
    handle = params.to_module(model)  # kept alive, as the REPL's `_` would
    assert type(model.weight) is torch.Tensor
    assert repr(handle).startswith("ModuleSwap(\n    fields={\n        weight:")  # a prompt
    assert type(model.weight) is nn.Parameter
    original = model.bias
    other = TensorDict({"bias": torch.ones(2)}, []).to_module(model)
    other.commit()
    assert type(model.bias) is nn.Parameter and torch.equal(model.bias, torch.ones(2))
    other.restore()  # an explicit restore still puts the original back
    assert model.bias is original and other["bias"] is original
    loaded = model.weight
    with params.to_module(model) as inside:
        assert inside["weight"] is loaded and model.weight is params["weight"]
    assert model.weight is loaded


# ---------------------------------------------------------------- plans
def test_plan_is_built_once_per_module_and_key_structure(monkeypatch):
    model = _mlp()
    builds = []
    original = module_swap.build_swap_plan
    monkeypatch.setattr(module_swap, "build_swap_plan", lambda *a: builds.append(1) or original(*a))
    full = TensorDict.from_module(model).apply(torch.zeros_like)
    part = full.select(("0", "weight"))
    for _ in range(3):
        for params in (full, part):
            with params.to_module(model):
                pass
    assert len(builds) == 2


def test_plan_notices_an_undone_tie():
    model = _Tricky()
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        assert model.decoder.weight is params["encoder", "weight"]
    model.decoder.weight = nn.Parameter(torch.ones(4, 4))  # untie
    with params.to_module(model):
        assert model.encoder.weight is params["encoder", "weight"]
        assert torch.equal(model.decoder.weight, torch.ones(4, 4))


def test_plan_notices_a_removed_parameter():
    model = nn.Linear(3, 2)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    with params.to_module(model):
        pass
    del model.bias
    with pytest.raises(KeyError, match="has no parameter or buffer 'bias'"):
        params.to_module(model)


def test_missing_keys_are_key_errors_with_close_matches():
    model = _mlp()
    before = _named_tensors(model)
    with pytest.raises(KeyError, match=r"key \('0', 'wieght'\) .*Did you mean 'weight'"):
        TensorDict({"0": {"wieght": torch.zeros(8, 3)}}, []).to_module(model)
    with pytest.raises(KeyError, match=r"has no submodule '5'"):
        TensorDict({"5": {"weight": torch.zeros(1)}}, []).to_module(model)
    with pytest.raises(KeyError, match=r"key 'weigth' but Linear .*Did you mean 'weight'"):
        TensorDict({"bias": torch.zeros(2), "weigth": torch.zeros(2, 3)}, []).to_module(
            nn.Linear(3, 2)
        )
    assert all(_named_tensors(model)[k] is before[k] for k in before)  # nothing half-done
    with pytest.raises(TypeError, match=r"to_module: expected an nn\.Module"):
        TensorDict({}, []).to_module("model")


def test_non_tensor_entries_are_ignored():
    model = nn.Linear(3, 2)
    params = TensorDict.from_module(model).apply(torch.zeros_like)
    params["note"] = "trained on cats"
    with params.to_module(model):
        assert model.weight is params["weight"]


def test_plans_do_not_keep_modules_alive():
    model = _mlp()
    with TensorDict.from_module(model).apply(torch.zeros_like).to_module(model):
        pass
    key = id(model)
    assert key in module_swap._PLANS
    del model
    gc.collect()
    assert key not in module_swap._PLANS


# ---------------------------------------------------------------- inside transforms
def test_vmapped_ensemble_forward_matches_a_loop():
    models = [_mlp(seed) for seed in range(3)]
    params = TensorDict.from_modules(*models)
    x = torch.randn(5, 3)
    template = _mlp(99)
    out = vmap(lambda p, x: _run(p, template, x), (0, None))(params, x)
    assert torch.allclose(out, torch.stack([m(x) for m in models]), atol=1e-6)


def test_grad_through_to_module_matches_functional_call():
    model = _mlp()
    params = TensorDict.from_module(model).apply(lambda t: t.detach().clone())
    x, y = torch.randn(6, 3), torch.randn(6, 2)

    def loss(p):
        return ((_run(p, model, x) - y) ** 2).mean()

    def reference_loss(d):
        return ((functional_call(model, d, (x,)) - y) ** 2).mean()

    grads = grad(loss)(params)
    expected = grad(reference_loss)({k: v.detach() for k, v in model.named_parameters()})
    for name, value in expected.items():
        assert torch.allclose(grads.get(_nested_key(name)), value, atol=1e-6), name


def test_vmap_of_grad_step_per_member_matches_functional_call():
    models = [_mlp(seed) for seed in range(3)]
    params = TensorDict.from_modules(*models)
    x, y = torch.randn(4, 3), torch.randn(3, 4, 2)
    template = _mlp(7)

    def step(p, x, y):
        g = grad(lambda q: ((_run(q, template, x) - y) ** 2).mean())(p)
        return p - 0.1 * g

    new = vmap(step, (0, None, 0))(params, x, y)
    for member, model in enumerate(models):
        params_dict = {k: v.detach() for k, v in model.named_parameters()}
        target = y[member]

        def reference_loss(d, model=model, target=target):
            return ((functional_call(model, d, (x,)) - target) ** 2).mean()

        g = grad(reference_loss)(params_dict)
        for name, value in params_dict.items():
            expected = value - 0.1 * g[name]
            assert torch.allclose(new.get(_nested_key(name))[member], expected, atol=1e-6)


# ---------------------------------------------------------------- TensorClass
class _LinearParams(TensorClass["frozen"]):
    weight: torch.Tensor
    bias: torch.Tensor


def test_frozen_tensorclass_as_a_parameter_set():
    layer = nn.Linear(3, 2)
    before = _named_tensors(layer)
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(2, 3, generator=g) for _ in range(4)]
    biases = [torch.randn(2, generator=g) for _ in range(4)]
    params = _LinearParams(weight=torch.stack(weights), bias=torch.stack(biases), batch_size=[4])
    x = torch.randn(5, 3)
    with params[1].to_module(layer):
        assert layer.weight is params[1].weight or torch.equal(layer.weight, weights[1])
        single = layer(x)
    assert torch.allclose(single, x @ weights[1].T + biases[1])
    out = vmap(lambda p, x: _run(p, layer, x), (0, None))(params, x)
    expected = torch.stack([x @ w.T + b for w, b in zip(weights, biases)])
    assert torch.allclose(out, expected, atol=1e-6)
    assert all(_named_tensors(layer)[k] is before[k] for k in before)
    grads = grad(lambda p: _run(p, layer, x).sum())(params[0])
    assert type(grads) is _LinearParams
    assert torch.allclose(grads.weight, torch.ones(2, 5) @ x)
