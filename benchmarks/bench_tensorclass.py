"""TensorClass construction, field reads and derived results, side by side.

Three implementations per group: tdfunc's ``TensorClass``, a plain ``@dataclass``
of tensors (the floor: no validation, no batch machinery) and, when installed,
``tensordict.TensorClass``. Read ratios of medians from one run::

    .venv-bench/bin/python -m pytest benchmarks/bench_tensorclass.py --benchmark-enable -q
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tdfunc import TensorClass

BATCH = 4


class Transition(TensorClass):
    obs: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor


class FrozenTransition(TensorClass["frozen"]):
    obs: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor


@dataclasses.dataclass
class PlainTransition:
    obs: torch.Tensor
    reward: torch.Tensor
    done: torch.Tensor


def _tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(BATCH, 3, generator=generator),
        torch.randn(BATCH, generator=generator),
        torch.zeros(BATCH, dtype=torch.bool),
    )


def _anchor_class(tensordict, frozen: bool = False):
    base = tensordict.TensorClass["frozen"] if frozen else tensordict.TensorClass

    class AnchorTransition(base):  # type: ignore[valid-type, misc]
        obs: torch.Tensor
        reward: torch.Tensor
        done: torch.Tensor

    return AnchorTransition


# ---------------------------------------------------------------------- construction
@pytest.mark.benchmark(group="tensorclass-construct")
def test_construct_tdfunc(benchmark):
    obs, reward, done = _tensors()
    out = benchmark(Transition, obs, reward, done, batch_size=[BATCH])
    assert out.batch_size == torch.Size([BATCH]) and out.obs is obs


@pytest.mark.benchmark(group="tensorclass-construct")
def test_construct_tdfunc_frozen(benchmark):
    obs, reward, done = _tensors()
    out = benchmark(FrozenTransition, obs, reward, done, batch_size=[BATCH])
    assert out.reward is reward


@pytest.mark.benchmark(group="tensorclass-construct")
def test_construct_dataclass(benchmark):
    obs, reward, done = _tensors()
    out = benchmark(PlainTransition, obs, reward, done)
    assert out.obs is obs


@pytest.mark.benchmark(group="tensorclass-construct")
def test_construct_tensordict(benchmark, tensordict_lib):
    anchor = _anchor_class(tensordict_lib)
    obs, reward, done = _tensors()
    out = benchmark(anchor, obs, reward, done, batch_size=[BATCH])
    assert out.batch_size == torch.Size([BATCH])


# ---------------------------------------------------------------------- field read
def _read(instance):
    return instance.obs, instance.reward, instance.done


@pytest.mark.benchmark(group="tensorclass-read")
def test_read_tdfunc(benchmark):
    obs, reward, done = _tensors()
    instance = Transition(obs, reward, done, batch_size=[BATCH])
    assert benchmark(_read, instance) == (obs, reward, done)


@pytest.mark.benchmark(group="tensorclass-read")
def test_read_dataclass(benchmark):
    obs, reward, done = _tensors()
    instance = PlainTransition(obs, reward, done)
    assert benchmark(_read, instance) == (obs, reward, done)


@pytest.mark.benchmark(group="tensorclass-read")
def test_read_tensordict(benchmark, tensordict_lib):
    anchor = _anchor_class(tensordict_lib)
    obs, reward, done = _tensors()
    instance = anchor(obs, reward, done, batch_size=[BATCH])
    got = benchmark(_read, instance)
    assert got[0] is obs and got[1] is reward and got[2] is done


# ---------------------------------------------------------------------- construct + read
def _construct_and_read(cls, obs, reward, done, **kwargs):
    instance = cls(obs, reward, done, **kwargs)
    return instance.obs, instance.reward, instance.done


@pytest.mark.benchmark(group="tensorclass-construct-read")
def test_construct_read_tdfunc(benchmark):
    obs, reward, done = _tensors()
    got = benchmark(_construct_and_read, FrozenTransition, obs, reward, done, batch_size=[BATCH])
    assert got[0] is obs


@pytest.mark.benchmark(group="tensorclass-construct-read")
def test_construct_read_dataclass(benchmark):
    obs, reward, done = _tensors()
    got = benchmark(_construct_and_read, PlainTransition, obs, reward, done)
    assert got[0] is obs


@pytest.mark.benchmark(group="tensorclass-construct-read")
def test_construct_read_tensordict(benchmark, tensordict_lib):
    anchor = _anchor_class(tensordict_lib, frozen=True)
    obs, reward, done = _tensors()
    got = benchmark(_construct_and_read, anchor, obs, reward, done, batch_size=[BATCH])
    assert got[0] is obs


# ---------------------------------------------------------------------- derived result
@pytest.mark.benchmark(group="tensorclass-index")
def test_index_tdfunc(benchmark):
    instance = Transition(*_tensors(), batch_size=[BATCH])
    out = benchmark(instance.__getitem__, slice(1, 3))
    assert type(out) is Transition and torch.equal(out.obs, instance.obs[1:3])


@pytest.mark.benchmark(group="tensorclass-index")
def test_index_dataclass(benchmark):
    instance = PlainTransition(*_tensors())

    def index(item):
        return PlainTransition(item.obs[1:3], item.reward[1:3], item.done[1:3])

    out = benchmark(index, instance)
    assert torch.equal(out.obs, instance.obs[1:3])


@pytest.mark.benchmark(group="tensorclass-index")
def test_index_tensordict(benchmark, tensordict_lib):
    anchor = _anchor_class(tensordict_lib)
    instance = anchor(*_tensors(), batch_size=[BATCH])
    out = benchmark(instance.__getitem__, slice(1, 3))
    assert torch.equal(out.obs, instance.obs[1:3])
