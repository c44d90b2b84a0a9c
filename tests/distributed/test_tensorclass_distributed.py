"""TensorClass instances over torch.distributed, on real processes (gloo on 127.0.0.1).

The methods (``send``, ``recv``, ``isend``, ``irecv``, ``broadcast``,
``all_reduce``, ``reduce``) forward to :mod:`tdfunc._distributed.collectives`; these tests
check them through the instance's own methods, against values computed from
plain tensors seeded per rank, and check that a frozen instance refuses every
method that writes in place, on every rank, without leaving a peer waiting.
The harness (``launch``: fresh ``spawn`` processes, bounded timeouts) is the one
of ``test_distributed.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
from process_harness import launch

from tdfunc import DistributedWork, TensorClass, TensorDict

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed gloo backend",
)


class Sample(TensorClass):
    obs: torch.Tensor
    action: torch.Tensor
    extras: TensorDict
    note: str


class FrozenSample(TensorClass["frozen"]):
    obs: torch.Tensor
    action: torch.Tensor


def _values(seed: int) -> dict[str, torch.Tensor]:
    """Reference values (plain tensors, no tdfunc) for batch size [3]."""
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(3, 4, generator=g),
        "action": torch.randint(0, 5, (3,), generator=g),
        "reward": torch.randn(3, 1, generator=g, dtype=torch.float64),
    }


def _sample(seed: int, note: str) -> Sample:
    v = _values(seed)
    extras = TensorDict({"reward": v["reward"].clone()}, [3])
    return Sample(
        obs=v["obs"].clone(), action=v["action"].clone(), extras=extras, note=note, batch_size=[3]
    )


def _empty_sample(note: str) -> Sample:
    extras = TensorDict({"reward": torch.zeros(3, 1, dtype=torch.float64)}, [3])
    return Sample(
        obs=torch.zeros(3, 4),
        action=torch.zeros(3, dtype=torch.int64),
        extras=extras,
        note=note,
        batch_size=[3],
    )


def _check(sample: Sample, expected: dict[str, torch.Tensor], note: str) -> None:
    assert type(sample) is Sample and sample.note == note  # non-tensor fields are not sent
    assert torch.equal(sample.obs, expected["obs"])
    assert torch.equal(sample.action, expected["action"])
    assert torch.equal(sample.extras["reward"], expected["reward"])


def _frozen(seed: int) -> FrozenSample:
    v = _values(seed)
    return FrozenSample(obs=v["obs"], action=v["action"], batch_size=[3])


# ---------------------------------------------------------------- point to point
def _p2p_worker(rank: int, world_size: int) -> None:
    # send / recv through the instance's methods, into the receiver's own tensors
    if rank == 1:
        assert _sample(1, "sender").send(0) is None
        assert _sample(2, "sender").isend(0) is None  # waits, as in tensordict
    else:
        target = _empty_sample("receiver")
        pointer = target.obs.data_ptr()
        assert target.recv(1) == 1
        _check(target, _values(1), "receiver")
        assert target.obs.data_ptr() == pointer  # in place
        work = target.irecv(src=1, return_premature=True)
        assert isinstance(work, DistributedWork)
        work.wait()
        _check(target, _values(2), "receiver")

    # a frozen instance sends, but refuses to receive: the refused message is consumed
    # (so the sender never hangs) and nothing is written; the channel stays usable, and
    # the hint's path (a TensorDict, then from_tensordict) works
    if rank == 1:
        for _ in range(3):
            _frozen(3).send(0)
    else:
        frozen = FrozenSample(obs=torch.zeros(3, 4), action=torch.zeros(3).long(), batch_size=[3])
        with pytest.raises(dataclasses.FrozenInstanceError, match=r"FrozenSample\.recv: .*frozen"):
            frozen.recv(1)
        with pytest.raises(dataclasses.FrozenInstanceError, match=r"FrozenSample\.irecv"):
            frozen.irecv(1)
        assert not frozen.obs.any() and not frozen.action.any()  # nothing written
        td = frozen.to_tensordict()
        assert td.recv(1) == 1
        received = FrozenSample.from_tensordict(td)
        assert torch.equal(received.obs, _values(3)["obs"])
        assert torch.equal(received.action, _values(3)["action"])


# ---------------------------------------------------------------- collectives
def _collectives_worker(rank: int, world_size: int) -> None:
    ranks = range(world_size)
    total = {k: sum(_values(10 + r)[k] for r in ranks) for k in ("obs", "action", "reward")}

    sample = _sample(10 + rank, f"rank{rank}")
    assert sample.all_reduce() is sample
    _check(sample, total, f"rank{rank}")

    sample = _sample(10 + rank, f"rank{rank}")
    sample.reduce(dst=0, async_op=True).wait()
    _check(sample, total if rank == 0 else _values(10 + rank), f"rank{rank}")

    sample = _sample(10 + rank, f"rank{rank}")
    assert sample.broadcast(src=1) is sample
    _check(sample, _values(11), f"rank{rank}")

    # frozen: every rank refuses (after one small message that tells the others)
    for call in (
        lambda f: f.all_reduce(),
        lambda f: f.reduce(0),
        lambda f: f.broadcast(0),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError, match="frozen"):
            call(_frozen(rank))
    sample = _sample(10 + rank, "after")
    sample.all_reduce()  # the group is still usable
    _check(sample, total, "after")


@pytest.mark.slow
def test_tensorclass_send_recv_and_frozen_refusal_on_two_processes():
    launch(_p2p_worker, 2)


@pytest.mark.slow
def test_tensorclass_collectives_on_two_processes():
    launch(_collectives_worker, 2)


# ---------------------------------------------------------------- in one process
def test_frozen_collectives_refuse_before_the_process_group_check():
    assert not dist.is_initialized()
    frozen = _frozen(0)
    for name in ("broadcast", "all_reduce", "reduce"):
        with pytest.raises(dataclasses.FrozenInstanceError, match="to_tensordict"):
            getattr(frozen, name)(0)
    # a refused receive consumes the message first (so no sender hangs): that needs a group
    for name in ("recv", "irecv"):
        with pytest.raises(RuntimeError, match="not initialised"):
            getattr(frozen, name)(0)
    with pytest.raises(RuntimeError, match="not initialised"):
        frozen.send(0)  # sending is allowed: it only fails for want of a process group
