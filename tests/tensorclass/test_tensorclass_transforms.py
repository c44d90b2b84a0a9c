"""TensorClass as a pytree node: vmap, grad, to_module ensembles and torch.compile."""

from __future__ import annotations

import dataclasses

import optree
import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F
import torch.utils._pytree as torch_pytree
from torch import nn

from tdfunc import TensorClass, TensorDict


class LinearParams(TensorClass["frozen"]):
    weight: torch.Tensor
    bias: torch.Tensor


class Batch(TensorClass["frozen"]):
    obs: torch.Tensor
    reward: torch.Tensor
    phase: str = "train"


def make_params(n: int, seed: int = 0) -> list[LinearParams]:
    generator = torch.Generator().manual_seed(seed)
    return [
        LinearParams(torch.randn(4, 3, generator=generator), torch.randn(4, generator=generator))
        for _ in range(n)
    ]


# ---------------------------------------------------------------------- pytree
def test_pytree_flatten_unflatten_roundtrip():
    batch = Batch(torch.randn(5, 2), torch.randn(5), batch_size=[5])
    leaves, spec = torch_pytree.tree_flatten(batch)
    assert len(leaves) == 2 and all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    rebuilt = torch_pytree.tree_unflatten([leaf * 2 for leaf in leaves], spec)
    assert type(rebuilt) is Batch and rebuilt.phase == "train"
    assert torch.equal(rebuilt.obs, batch.obs * 2) and rebuilt.batch_size == torch.Size([5])
    mapped = torch_pytree.tree_map(lambda t: t.sum(-1) if t.dim() == 2 else t, batch)
    assert type(mapped) is Batch and mapped.obs.shape == torch.Size([5])
    opt_leaves, opt_spec = optree.tree_flatten(batch, namespace="tdfunc")
    assert len(opt_leaves) == 2
    assert type(optree.tree_unflatten(opt_spec, opt_leaves)) is Batch


def test_pytree_skips_none_fields():
    class Maybe(TensorClass):
        x: torch.Tensor
        y: torch.Tensor | None = None

    leaves, spec = torch_pytree.tree_flatten(Maybe(torch.ones(2), batch_size=[2]))
    assert len(leaves) == 1
    assert torch_pytree.tree_unflatten(leaves, spec).y is None


# ---------------------------------------------------------------------- vmap / grad
def test_vmap_ensemble_of_frozen_params_matches_loop():
    params = make_params(6)
    stacked = torch.stack(params)
    assert type(stacked) is LinearParams and stacked.batch_size == torch.Size([6])
    x = torch.randn(7, 3)

    def forward(p: LinearParams, inputs: torch.Tensor) -> torch.Tensor:
        assert type(p) is LinearParams and p.batch_size == torch.Size([])
        return F.linear(inputs, p.weight, p.bias)

    out = torch.vmap(forward, (0, None))(stacked, x)
    expected = torch.stack([F.linear(x, p.weight, p.bias) for p in params])
    torch.testing.assert_close(out, expected)


def test_vmap_over_batch_and_out_dims_returning_instances():
    batch = Batch(torch.randn(4, 3), torch.randn(4), batch_size=[4])

    def normalise(b: Batch) -> Batch:
        return b.apply(lambda t: t - t.mean())

    out = torch.vmap(normalise)(batch)
    assert type(out) is Batch and out.batch_size == torch.Size([4])
    expected_obs = torch.stack([row - row.mean() for row in batch.obs])
    torch.testing.assert_close(out.obs, expected_obs)
    torch.testing.assert_close(out.reward, torch.zeros(4))
    swapped = torch.vmap(normalise, out_dims=0)(batch.reshape(2, 2))
    assert swapped.batch_size == torch.Size([2, 2])


def test_vmap_with_to_module_matches_loop():
    params = make_params(5, seed=1)
    stacked = torch.stack(params)
    linear = nn.Linear(3, 4)
    original = linear.weight
    x = torch.randn(2, 3)

    def forward(p: LinearParams, inputs: torch.Tensor) -> torch.Tensor:
        with p.to_module(linear):
            return linear(inputs)

    out = torch.vmap(forward, (0, None))(stacked, x)
    expected = torch.stack([F.linear(x, p.weight, p.bias) for p in params])
    torch.testing.assert_close(out, expected)
    assert linear.weight is original


def test_to_module_on_a_frozen_instance():
    linear = nn.Linear(3, 2)
    original_weight = linear.weight
    p = LinearParams(torch.zeros(2, 3), torch.arange(2.0))
    x = torch.randn(4, 3)
    with p.to_module(linear):
        torch.testing.assert_close(linear(x), torch.arange(2.0).expand(4, 2))
    assert linear.weight is original_weight
    from_module = LinearParams.from_module(linear)
    assert type(from_module) is LinearParams and from_module.weight is linear.weight
    with pytest.raises(dataclasses.FrozenInstanceError):
        from_module.weight = torch.zeros(2, 3)


def test_from_modules_ensemble_forward():
    modules = [nn.Linear(3, 4) for _ in range(3)]
    stacked = LinearParams.from_modules(*modules)
    assert type(stacked) is LinearParams and stacked.batch_size == torch.Size([3])
    x = torch.randn(5, 3)
    out = torch.vmap(lambda p: F.linear(x, p.weight, p.bias))(stacked)
    expected = torch.stack([m(x) for m in modules]).detach()
    torch.testing.assert_close(out.detach(), expected)


def test_grad_wrt_a_tensorclass_matches_autograd():
    p = make_params(1, seed=2)[0]
    x = torch.randn(6, 3)

    def loss(params: LinearParams) -> torch.Tensor:
        return F.linear(x, params.weight, params.bias).pow(2).mean()

    grads = torch.func.grad(loss)(p)
    assert type(grads) is LinearParams
    weight = p.weight.clone().requires_grad_()
    bias = p.bias.clone().requires_grad_()
    F.linear(x, weight, bias).pow(2).mean().backward()
    torch.testing.assert_close(grads.weight, weight.grad)
    torch.testing.assert_close(grads.bias, bias.grad)
    stepped = p - 0.1 * grads
    assert type(stepped) is LinearParams
    torch.testing.assert_close(stepped.weight, p.weight - 0.1 * weight.grad)


def test_vmapped_grad_per_member():
    params = make_params(3, seed=4)
    stacked = torch.stack(params)
    x = torch.randn(5, 3)

    def loss(p: LinearParams) -> torch.Tensor:
        return F.linear(x, p.weight, p.bias).sum()

    grads = torch.vmap(torch.func.grad(loss))(stacked)
    for i, p in enumerate(params):
        expected = torch.func.grad(lambda w, b=p.bias: F.linear(x, w, b).sum())(p.weight)
        torch.testing.assert_close(grads.weight[i], expected)


def test_nested_tensorclass_in_tensordict_through_vmap():
    batch = Batch(torch.randn(3, 2), torch.randn(3), batch_size=[3])
    td = TensorDict({"batch": batch, "scale": torch.arange(3.0)}, [3])
    out = torch.vmap(lambda t: t["batch"].obs * t["scale"])(td)
    torch.testing.assert_close(out, batch.obs * torch.arange(3.0)[:, None])


# ---------------------------------------------------------------------- compile
def test_compile_frozen_batch_one_graph_no_recompile():
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def step(batch: Batch, weight: torch.Tensor) -> torch.Tensor:
        head = batch[:2]
        return (batch.obs @ weight).sum() + batch.reward.mean() + head.obs.sum()

    weight = torch.randn(3, 1)
    for seed in range(5):
        generator = torch.Generator().manual_seed(seed)
        batch = Batch(
            torch.randn(8, 3, generator=generator),
            torch.randn(8, generator=generator),
            batch_size=[8],
        )
        expected = (batch.obs @ weight).sum() + batch.reward.mean() + batch.obs[:2].sum()
        torch.testing.assert_close(step(batch, weight), expected)
    assert counter.frame_count == 1


def test_compile_returns_instances_of_the_class():
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def double(batch: Batch) -> Batch:
        return batch.apply(lambda t: t * 2)

    for _ in range(3):
        batch = Batch(torch.randn(4, 2), torch.randn(4), batch_size=[4])
        out = double(batch)
        assert type(out) is Batch and out.phase == "train"
        torch.testing.assert_close(out.obs, batch.obs * 2)
    assert counter.frame_count == 1
