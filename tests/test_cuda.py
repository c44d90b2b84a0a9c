"""The same answers on a CUDA device as on the CPU, across the packages.

Skipped where no CUDA device is present (CI has none): these run on a GPU machine.
Each case compares against a reference computed without tdfunc: a loop of ordinary
modules, ``torch.optim`` per member, or the plain tensors.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tdfunc import Ensemble, MemoryMappedTensor, TensorDict, functional_call, optim

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda", 0)


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def test_container_moves_and_infers_device():
    cpu = TensorDict({"a": torch.randn(4, 3), "n": {"b": torch.arange(4)}}, batch_size=[4])
    gpu = cpu.to("cuda")
    assert gpu.device == CUDA
    assert gpu["n", "b"].device == CUDA
    assert torch.equal(gpu.cpu()["a"], cpu["a"])
    pinned = cpu.pin_memory()
    assert pinned["a"].is_pinned()
    moved = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(moved["n", "b"].cpu(), cpu["n", "b"])
    made = TensorDict({"a": torch.zeros(2)}, batch_size=[2], device="cuda")
    assert made["a"].device == CUDA


def test_ensemble_matches_loop_forward_and_gradients():
    torch.manual_seed(0)
    models = [mlp().to(CUDA) for _ in range(5)]
    x = torch.randn(7, 6, device=CUDA)
    loop = copy.deepcopy(models)
    expected = torch.stack([m(x) for m in loop])
    expected.square().sum().backward()
    ensemble = Ensemble(*models)
    out = ensemble(x)
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    stacked = ensemble.params
    for i, member in enumerate(loop):
        for name, p in member.named_parameters():
            torch.testing.assert_close(stacked[tuple(name.split("."))].grad[i], p.grad)


def test_optim_adam_matches_torch_optim_per_member():
    torch.manual_seed(0)
    members = [mlp().to(CUDA) for _ in range(4)]
    lrs = torch.tensor([1e-3, 1e-2, 3e-2, 1e-1], device=CUDA)
    ensemble = Ensemble(*copy.deepcopy(members))
    opt = optim.Adam(ensemble.parameters(), lr=lrs)
    reference = [torch.optim.Adam(m.parameters(), lr=lr) for m, lr in zip(members, lrs.tolist())]
    for _ in range(3):
        for p in ensemble.parameters():
            p.grad = torch.randn_like(p)
        for i, m in enumerate(members):
            for p, q in zip(m.parameters(), ensemble.parameters()):
                p.grad = q.grad[i].clone()
        opt.step()
        for o in reference:
            o.step()
    for i, m in enumerate(members):
        for p, q in zip(m.parameters(), ensemble.parameters()):
            torch.testing.assert_close(q[i], p)


def test_to_module_and_functional_call_on_cuda():
    torch.manual_seed(0)
    module = mlp().to(CUDA)
    x = torch.randn(2, 6, device=CUDA)
    params = TensorDict.from_module(module).apply(lambda t: t.detach() * 2)
    expected = torch.func.functional_call(
        module, {k: v for k, v in params.flatten_keys(".").items()}, (x,)
    )
    with params.to_module(module):
        torch.testing.assert_close(module(x), expected)
    torch.testing.assert_close(functional_call(module, params, (x,)), expected)
    stacked = TensorDict.from_modules(*[mlp().to(CUDA) for _ in range(3)])

    def run(p):
        with p.to_module(module):
            return module(x)

    out = torch.vmap(run)(stacked)
    for i in range(3):
        torch.testing.assert_close(out[i], functional_call(module, stacked[i], (x,)))


def test_memmap_and_consolidate_round_trip(tmp_path):
    td = TensorDict(
        {"a": torch.randn(3, 4, device=CUDA), "n": {"b": torch.arange(3, device=CUDA)}},
        batch_size=[3],
    )
    saved = td.memmap(tmp_path / "ckpt")
    assert isinstance(saved["a"], MemoryMappedTensor)
    loaded = TensorDict.load_memmap(tmp_path / "ckpt").to(CUDA)
    assert torch.equal(loaded["a"], td["a"])
    assert torch.equal(loaded["n", "b"], td["n", "b"])
    packed = td.consolidate()
    assert packed["a"].device == CUDA
    assert torch.equal(packed.to("cpu")["n", "b"], td["n", "b"].cpu())
