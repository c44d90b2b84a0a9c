"""``tdfunc.functional_call`` against ``torch.func.functional_call`` with plain dicts.

Every reference is ``torch.func.functional_call`` given the dotted-name dict
the TensorDict stands for, run through the same transform.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.func import grad, jacrev, vmap

import tdfunc
from tdfunc import TensorClass, TensorDict

reference_call = torch.func.functional_call


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def _slots(module: nn.Module) -> dict:
    out = dict(module.named_parameters(remove_duplicate=False))
    out.update(module.named_buffers(remove_duplicate=False))
    return out


def _values(module: nn.Module, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(v.shape, generator=g) for name, v in _slots(module).items()}


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)
        self.b.weight = self.a.weight
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x, scale=1.0):
        return self.norm(self.b(torch.tanh(self.a(x)))) * scale


X = torch.randn(5, 3, generator=torch.Generator().manual_seed(7))


class _Linear(TensorClass):
    weight: torch.Tensor
    bias: torch.Tensor


@pytest.mark.parametrize("form", ["nested", "dotted", "mixed", "dict", "nested dict", "tuple"])
def test_every_form_of_parameters_matches_torch(form):
    model = _mlp()
    before = _slots(model)
    values = _values(model)
    nested = TensorDict(values, []).unflatten_keys(".")
    params = {
        "nested": nested,
        "dotted": TensorDict(values, []),
        "mixed": TensorDict({"0": nested["0"], "2.weight": values["2.weight"]}, []),
        "dict": values,
        "nested dict": {"0": {"weight": values["0.weight"], "bias": values["0.bias"]}},
        "tuple": ({"0.weight": values["0.weight"]}, TensorDict({"2": nested["2"]}, [])),
    }[form]
    reference = {
        "mixed": {k: v for k, v in values.items() if k != "2.bias"},
        "nested dict": {"0.weight": values["0.weight"], "0.bias": values["0.bias"]},
        "tuple": {k: v for k, v in values.items() if k != "0.bias"},
    }.get(form, values)
    out = tdfunc.functional_call(model, params, (X,))
    assert torch.equal(out, reference_call(model, reference, (X,)))
    assert all(_slots(model)[k] is v for k, v in before.items())  # left as it was


def test_tensorclass_parameters_and_single_argument_and_kwargs():
    layer = nn.Linear(3, 2)
    g = torch.Generator().manual_seed(2)
    p = _Linear(weight=torch.randn(2, 3, generator=g), bias=torch.randn(2, generator=g))
    ref = {"weight": p.weight, "bias": p.bias}
    assert torch.equal(tdfunc.functional_call(layer, p, X), reference_call(layer, ref, X))
    model = _Tied()
    values = _values(model)
    del values["b.weight"]  # tied to a.weight
    out = tdfunc.functional_call(model, values, (X,), {"scale": 3.0})
    assert torch.equal(out, reference_call(model, values, (X,), {"scale": 3.0}))


@pytest.mark.parametrize("tie_weights", [True, False])
def test_tied_weights_match_torch(tie_weights):
    model = _Tied()
    before = _slots(model)
    one = {"b.weight": torch.randn(3, 3)}  # names only one side of the tie
    out = tdfunc.functional_call(model, one, (X,), tie_weights=tie_weights)
    assert torch.equal(out, reference_call(model, one, (X,), tie_weights=tie_weights))
    both = {"a.weight": torch.randn(3, 3), "b.weight": torch.randn(3, 3)}
    if tie_weights:
        with pytest.raises(ValueError):
            reference_call(model, both, (X,))
        with pytest.raises(ValueError, match="tied slot"):
            tdfunc.functional_call(model, both, (X,))
        same = {"a.weight": both["a.weight"], "b.weight": both["a.weight"]}
        out = tdfunc.functional_call(model, same, (X,))
        assert torch.equal(out, reference_call(model, same, (X,)))
    else:
        out = tdfunc.functional_call(model, both, (X,), tie_weights=False)
        assert torch.equal(out, reference_call(model, both, (X,), tie_weights=False))
    assert all(_slots(model)[k] is v for k, v in before.items())
    assert model.b.weight is model.a.weight


def test_strict_names_the_missing_keys_and_unknown_keys_are_key_errors():
    model = _Tied()
    before = _slots(model)
    partial = {"a.weight": torch.randn(3, 3)}
    with pytest.raises(RuntimeError, match="Missing key"):
        reference_call(model, partial, (X,), strict=True)
    with pytest.raises(RuntimeError, match=r"strict=True .*'a\.bias', 'b\.bias'"):
        tdfunc.functional_call(model, partial, (X,), strict=True)
    full = TensorDict.from_module(model).apply(lambda t: t.detach() + 1)
    out = tdfunc.functional_call(model, full, (X,), strict=True)
    reference = {".".join(k): v for k, v in full.items(True, True)}
    assert torch.equal(out, reference_call(model, reference, (X,), strict=True))
    with pytest.raises(KeyError, match=r"has key 'a\.wieght' .*Did you mean 'weight'"):
        tdfunc.functional_call(model, {"a.wieght": torch.zeros(3, 3)}, (X,))
    with pytest.raises(TypeError, match="functional_call: expected the parameters"):
        tdfunc.functional_call(model, [torch.zeros(1)][0], (X,))
    with pytest.raises(ValueError, match="more than one"):
        tdfunc.functional_call(model, ({"a.bias": X[0]}, {"a.bias": X[1]}), (X,))
    assert all(_slots(model)[k] is v for k, v in before.items())


def test_module_restored_when_the_forward_raises():
    model = _mlp()
    before = _slots(model)
    with pytest.raises(RuntimeError):
        tdfunc.functional_call(model, TensorDict.from_module(model), (torch.zeros(2, 5),))
    assert all(_slots(model)[k] is v for k, v in before.items())


# ---------------------------------------------------------------- transforms
def _stacked(model: nn.Module, members: int = 3) -> tuple[TensorDict, dict]:
    dicts = [_values(model, seed) for seed in range(members)]
    stacked = {k: torch.stack([d[k] for d in dicts]) for k in dicts[0]}
    return TensorDict(stacked, [members]).unflatten_keys("."), stacked


def test_vmap_over_stacked_members_matches_torch():
    model = _mlp()
    params, plain = _stacked(model)
    out = vmap(tdfunc.functional_call, (None, 0, None))(model, params, X)
    reference = vmap(reference_call, (None, 0, None))(model, plain, X)
    assert torch.allclose(out, reference, atol=1e-6)


def test_grad_and_jacrev_match_torch():
    model = _mlp()
    values = _values(model)
    params = TensorDict(values, []).unflatten_keys(".")

    def loss(p):
        return tdfunc.functional_call(model, p, (X,)).pow(2).sum()

    def reference_loss(p):
        return reference_call(model, p, (X,)).pow(2).sum()

    grads = grad(loss)(params)
    expected = grad(reference_loss)(values)
    for name, value in expected.items():
        assert torch.allclose(grads.get(tuple(name.split("."))), value, atol=1e-5), name
    jac = jacrev(lambda p: tdfunc.functional_call(model, p, (X,)))(params)
    expected = jacrev(lambda p: reference_call(model, p, (X,)))(values)
    for name, value in expected.items():
        assert torch.allclose(jac.get(tuple(name.split("."))), value, atol=1e-5), name


def test_vmap_of_grad_per_member_matches_torch():
    model = _mlp()
    params, plain = _stacked(model)

    def loss(p, x, call):
        return call(model, p, (x,)).pow(2).mean()

    out = vmap(grad(loss), (0, None, None))(params, X, tdfunc.functional_call)
    expected = vmap(grad(loss), (0, None, None))(plain, X, reference_call)
    for name, value in expected.items():
        assert torch.allclose(out.get(tuple(name.split("."))), value, atol=1e-5), name


def test_compiled_vmapped_call_is_one_graph_across_fresh_parameters():
    model = _mlp(100)
    before = _slots(model)
    counter = CompileCounter()
    forward = torch.compile(
        vmap(lambda p, x: tdfunc.functional_call(model, p, (x,)), (0, None)),
        backend=counter,
        fullgraph=True,
    )
    for seed in (0, 1):
        params, plain = _stacked(_mlp(seed))
        params = params + seed
        plain = {k: v + seed for k, v in plain.items()}
        out = forward(params, X)
        assert torch.allclose(out, vmap(reference_call, (None, 0, None))(model, plain, X))
    assert counter.frame_count == 1
    assert all(_slots(model)[k] is v for k, v in before.items())
