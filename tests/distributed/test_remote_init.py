"""``init_remote`` / ``from_remote_init`` on real processes (gloo on 127.0.0.1).

The receiver knows nothing of the structure; what it builds is compared with the sender's
values as plain tensors. A TensorClass or a non-tensor entry is refused with the way
through a TensorDict, and a description from a rank that sent something else is refused
before anything is allocated.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from process_harness import run_ranks

from tdfunc import TensorClass, TensorDict

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed gloo backend",
)
TIMEOUT = 4.0


class Point(TensorClass):
    x: torch.Tensor


def sent() -> TensorDict:
    generator = torch.Generator().manual_seed(0)
    return TensorDict(
        obs=torch.randn(2, 84, generator=generator),
        reward=torch.arange(2, dtype=torch.int32).unsqueeze(-1),
        nested={"mask": torch.tensor([[True, False, True]] * 2)},
        batch_size=[2],
    )


def _point_to_point(rank: int):
    if rank == 0:
        td = sent()
        td.init_remote(dst=1)
        td["obs"] += 1
        td.send(dst=1)  # the next batch goes into what the receiver built
        return None
    td = TensorDict.from_remote_init(src=0)
    # plain values: tensors would go back through shared memory of a process that exits
    first = {k: (v.tolist(), str(v.dtype)) for k, v in td.items(True, True)}
    td.recv(src=0)
    return first, td["obs"].tolist(), list(td.batch_size), list(td["nested"].batch_size)


def test_the_receiver_builds_the_senders_tensordict_then_receives_into_it():
    outcome = run_ranks(_point_to_point, world=2, timeout=TIMEOUT)
    first, second, batch, nested_batch = outcome.value(1)
    reference = sent()
    assert first == {k: (v.tolist(), str(v.dtype)) for k, v in reference.items(True, True)}
    assert second == (reference["obs"] + 1).tolist()
    assert batch == [2] and nested_batch == [2]


def _broadcast(rank: int):
    if rank == 1:
        sent().init_remote(use_broadcast=True)
        return None
    td = TensorDict.from_remote_init(src=1, use_broadcast=True)
    return td["obs"].sum().item(), td["nested", "mask"].tolist()


def test_with_broadcast_every_rank_receives():
    outcome = run_ranks(_broadcast, world=3, timeout=TIMEOUT)
    reference = sent()
    for rank in (0, 2):
        total, mask = outcome.value(rank)
        assert total == pytest.approx(reference["obs"].sum().item())
        assert mask == reference["nested", "mask"].tolist()


def _refusals(rank: int):
    seen = []
    if rank == 0:
        for bad in (Point(x=torch.zeros(2), batch_size=[2]), TensorDict(a="text", batch_size=[])):
            try:
                bad.init_remote(dst=1)
            except TypeError as error:
                seen.append("from_tensordict" in str(error) or "not sent" in str(error))
        dist.send(torch.tensor([1 << 40]), 1)  # not a description: an absurd length
    else:
        try:
            Point.from_remote_init(src=0)
        except TypeError as error:
            seen.append("TensorDict.from_remote_init" in str(error))
        for _ in range(2):  # the sender's two refusals arrive as refusals
            try:
                TensorDict.from_remote_init(src=0)
            except ValueError as error:
                seen.append("rank 0 refused" in str(error))
        try:
            TensorDict.from_remote_init(src=0)
        except ValueError as error:
            seen.append("announced a description of" in str(error))
    return seen


def test_what_cannot_travel_or_be_read_is_refused():
    outcome = run_ranks(_refusals, world=2, timeout=TIMEOUT)
    assert outcome.value(0) == [True, True]
    assert outcome.value(1) == [True, True, True, True]


@pytest.mark.parametrize(
    ("description", "message"),
    [
        ({"batch_size": [2], "entries": {"a": {"shape": [2, -1], "dtype": "torch.float32"}}},
         "non-negative ints"),
        ({"batch_size": [2], "entries": {"a": {"shape": [2], "dtype": "torch.Tensor"}}},
         "unknown dtype"),
        ({"batch_size": [2], "entries": {"a": {"shape": [2], "dtype": "os.system"}}},
         "unknown dtype"),
        ({"batch_size": [2], "entries": {"a": {"shape": [1 << 30] * 2, "dtype": "torch.uint8"}}},
         "too large"),
        ({"batch_size": "2", "entries": {}}, "non-negative ints"),
        ({"entries": []}, "not a TensorDict's"),
        ({"batch_size": [], "entries": {"a": 3}}, "bad entry"),
    ],
)  # fmt: skip
def test_a_damaged_description_is_refused_before_anything_is_allocated(description, message):
    from tdfunc._distributed.remote import _build

    with pytest.raises(ValueError, match=message):
        _build(TensorDict, description, None)


def _damaged(rank: int):
    description = b'{"batch_size": [2], "entries": {"a": {"shape": [2], "dtype": "os.system"}}}'
    if rank == 0:
        dist.send(torch.tensor([len(description)]), 1)
        dist.send(torch.frombuffer(bytearray(description), dtype=torch.uint8), 1)
        TensorDict(a=torch.ones(2), batch_size=[2]).send(dst=1)  # completes: nothing hangs
        return "sent"
    try:
        TensorDict.from_remote_init(src=0)
    except ValueError as error:
        return str(error)
    return "accepted"


def test_a_damaged_description_from_a_rank_is_refused_and_the_sender_completes():
    outcome = run_ranks(_damaged, world=2, timeout=TIMEOUT)
    assert outcome.value(0) == "sent"
    assert "unknown dtype 'os.system'" in outcome.value(1)
