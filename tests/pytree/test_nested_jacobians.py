"""Jacobians and hessians of nested TensorDicts, against ``torch.func`` with plain dicts.

``jacfwd`` unflattens its results with specs recorded inside its own ``vmap``
(batch size = the number of input elements), so nested levels come back with
leaves of unrelated shapes: the batch-size inference must fall back at every
level, not only the top one. Every reference runs the same function through
``torch.func`` on the plain nested dicts the TensorDicts are built from.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.func import hessian, jacfwd, jacrev

from tdfunc import TensorDict

TRANSFORMS = {
    "jacfwd": jacfwd,
    "jacrev": jacrev,
    "hessian": hessian,
    "jacfwd(jacrev)": lambda f: jacfwd(jacrev(f)),
    "jacfwd(jacfwd)": lambda f: jacfwd(jacfwd(f)),
    "jacrev(jacrev)": lambda f: jacrev(jacrev(f)),
    "jacrev(jacfwd)": lambda f: jacrev(jacfwd(f)),
}


def _flat(tree) -> dict:
    return {
        tuple(entry.key for entry in path): leaf
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]
    }


def _assert_close(result, reference, atol: float = 1e-5) -> None:
    got, want = _flat(result), _flat(reference)
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape, key
        assert torch.allclose(got[key], want[key], atol=atol), key


def _mlp_params(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "0": {"weight": torch.randn(4, 3, generator=g), "bias": torch.randn(4, generator=g)},
        "2": {"weight": torch.randn(2, 4, generator=g), "bias": torch.randn(2, generator=g)},
    }


X = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))


def _mlp_loss(tree) -> torch.Tensor:
    """The same arithmetic on a nested dict or a nested TensorDict (no tdfunc involved)."""
    hidden = torch.tanh(X @ tree["0"]["weight"].T + tree["0"]["bias"])
    return (hidden @ tree["2"]["weight"].T + tree["2"]["bias"]).pow(2).sum()


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_second_order_of_a_nested_parameter_tensordict(name):
    raw = _mlp_params()
    td = TensorDict(raw, [])
    transform = TRANSFORMS[name]
    out, reference = transform(_mlp_loss)(td), transform(_mlp_loss)(raw)
    _assert_close(out, reference)
    assert isinstance(out, TensorDict)
    if name not in ("jacfwd", "jacrev"):
        # one block per (input leaf, input leaf): weight x bias of the first layer
        assert out["0", "weight", "0", "bias"].shape == (4, 3, 4)


def test_hessian_of_a_module_loss_through_to_module():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    params = TensorDict.from_module(mlp).apply(lambda t: t.detach())
    raw = {name: t.detach() for name, t in mlp.named_parameters()}

    def loss(p):
        with p.to_module(mlp):
            return mlp(X).pow(2).sum()

    def reference_loss(p):
        return torch.func.functional_call(mlp, p, (X,)).pow(2).sum()

    out = hessian(loss)(params)
    reference = hessian(reference_loss)(raw)
    flat = _flat(out)
    for row, blocks in reference.items():
        for column, block in blocks.items():
            key = tuple(row.split(".")) + tuple(column.split("."))
            assert torch.allclose(flat[key], block, atol=1e-5), key
    assert len(flat) == 16


def _nested_output(x: torch.Tensor) -> dict:
    return {
        "a": x.sin() * 2,
        "n": {"b": x.sum(), "c": x[:2].exp(), "m": {"d": torch.outer(x, x)}},
    }


def _nested_output_td(x: torch.Tensor) -> TensorDict:
    out = _nested_output(x)
    return TensorDict(
        {
            "a": out["a"],
            "n": TensorDict({"b": out["n"]["b"], "c": out["n"]["c"], "m": out["n"]["m"]}, []),
        },
        [],
    )


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_nested_output_with_leaves_of_different_shapes(name):
    x = torch.randn(3, generator=torch.Generator().manual_seed(2))
    transform = TRANSFORMS[name]
    out = transform(_nested_output_td)(x)
    reference = transform(_nested_output)(x)
    _assert_close(out, reference)


def _mixed(tree) -> dict:
    """Nested input (batch [2]) to a nested output whose leaves have unrelated shapes."""
    a, b = tree["a"], tree["n"]["b"]
    return {"s": (a.sin() * b.unsqueeze(-1)).sum(), "n": {"t": a.cos(), "u": b.exp()[:1]}}


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_nested_input_to_nested_output(name):
    g = torch.Generator().manual_seed(3)
    raw = {"a": torch.randn(2, 3, generator=g), "n": {"b": torch.randn(2, generator=g)}}
    td = TensorDict(raw, [2])

    def mixed_td(t):
        out = _mixed(t)
        return TensorDict({"s": out["s"], "n": TensorDict(out["n"], [])}, [])

    out = TRANSFORMS[name](mixed_td)(td)
    reference = TRANSFORMS[name](_mixed)(raw)
    _assert_close(out, reference)
