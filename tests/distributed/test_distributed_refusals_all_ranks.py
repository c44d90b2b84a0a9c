"""Refusals of ``all_gather``, ``scatter`` and ``init_remote`` reach every rank.

Each case runs real processes (gloo on 127.0.0.1) under a deadline; a rank that refuses
keeps running (it catches its own error and goes on to a barrier), so a peer left waiting
would time out instead of raising the refusal. References are plain tensors.
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


def _caught(call) -> str:
    try:
        call()
    except Exception as error:  # the test compares the kind and the message
        return f"{type(error).__name__}: {error}"
    return "no error"


def _init_remote_refused(rank: int):
    seen = []
    if rank == 0:
        bad = TensorDict(a="text", b=torch.zeros(2), batch_size=[])
        seen.append(_caught(lambda: bad.init_remote(dst=1)))
        point = Point(x=torch.zeros(2), batch_size=[2])
        seen.append(_caught(lambda: point.init_remote(use_broadcast=True)))
    else:
        if rank == 1:
            seen.append(_caught(lambda: TensorDict.from_remote_init(src=0)))
        seen.append(_caught(lambda: TensorDict.from_remote_init(src=0, use_broadcast=True)))
    dist.barrier()  # every rank is still in step
    # the channel is clean: a good TensorDict goes through afterwards
    if rank == 0:
        TensorDict(a=torch.arange(3.0), batch_size=[3]).init_remote(dst=1)
    elif rank == 1:
        seen.append(TensorDict.from_remote_init(src=0)["a"].tolist())
    return seen


def test_a_sender_that_cannot_describe_its_tensordict_makes_the_receivers_raise():
    outcome = run_ranks(_init_remote_refused, world=3, timeout=TIMEOUT, deadline=30.0)
    assert not outcome.hung
    sender = outcome.value(0)
    assert sender[0].startswith("TypeError: TensorDict.init_remote: the entry ('a',)")
    assert sender[1].startswith("TypeError: TensorDict.init_remote: a Point")
    for rank in (1, 2):
        received = outcome.value(rank)
        refusals = received[:2] if rank == 1 else received[:1]
        for text in refusals:
            assert text.startswith("ValueError: TensorDict.from_remote_init: rank 0 refused"), text
    assert outcome.value(1)[2] == [0.0, 1.0, 2.0]


def _unallocatable(rank: int):
    # a description asking for more memory than the host has (within the element limit)
    description = (
        b'{"batch_size": [], "entries": {"a": {"shape": [1099511627775], "dtype": '
        b'"torch.float64"}}}'
    )
    if rank == 0:
        dist.send(torch.tensor([len(description)]), 1)
        dist.send(torch.frombuffer(bytearray(description), dtype=torch.uint8), 1)
        TensorDict(a=torch.ones(2), batch_size=[2]).send(dst=1)
        TensorDict(a=torch.full((2,), 7.0), batch_size=[2]).send(dst=1)
        return "sent"
    refused = _caught(lambda: TensorDict.from_remote_init(src=0)).split(":")[0]
    after = TensorDict(a=torch.zeros(2), batch_size=[2])
    after.recv(src=0)  # the next message is the next send, not the refused one's values
    return refused, after["a"].tolist()


def test_a_description_that_cannot_be_allocated_is_refused_and_its_values_consumed():
    outcome = run_ranks(_unallocatable, world=2, timeout=TIMEOUT)
    assert outcome.value(0) == "sent"
    assert outcome.value(1) == ("RuntimeError", [7.0, 7.0])


def _scatter_source_mismatch(rank: int):
    # the source's own container has another shape and dtype than the pieces
    if rank == 0:
        mine = TensorDict(a=torch.full((3, 4), -1.0, dtype=torch.float64), batch_size=[])
        pieces = [TensorDict(a=torch.full((4,), 5.0 + r), batch_size=[]) for r in range(3)]
    else:
        mine, pieces = TensorDict(a=torch.full((4,), -1.0), batch_size=[]), None
    error = _caught(lambda: mine.scatter(src=0, tensordicts=pieces))
    dist.barrier()
    return error.split(":")[0], "scatter" in error, mine["a"].unique().tolist()


def test_scatter_refuses_a_source_container_unlike_its_own_piece_on_every_rank():
    outcome = run_ranks(_scatter_source_mismatch, world=3, timeout=TIMEOUT, deadline=30.0)
    assert not outcome.hung
    assert outcome.value(0) == ("ValueError", True, [-1.0])
    for rank in (1, 2):
        kind, names, values = outcome.value(rank)
        assert kind in ("ValueError", "RuntimeError") and names and values == [-1.0]


class Labelled(TensorClass):
    x: torch.Tensor
    label: str


def _gather_non_tensor(rank: int):
    seen = []
    td = TensorDict(a=torch.full((2,), float(rank)), name=f"rank {rank}", batch_size=[])
    seen.append(_caught(lambda: td.all_gather()))
    # only rank 1 holds a non-tensor entry, nested: every rank refuses all the same
    nested = TensorDict(a=torch.zeros(2), n={"b": torch.zeros(1)}, batch_size=[])
    if rank == 1:
        nested["n", "note"] = "only here"
    seen.append(_caught(lambda: nested.all_gather()))
    labelled = Labelled(x=torch.zeros(2), label=f"rank {rank}", batch_size=[2])
    seen.append(_caught(lambda: labelled.all_gather()))
    # without them, the values of every rank arrive
    seen.append([p["a"].tolist() for p in td.exclude("name").all_gather()])
    return seen


def test_all_gather_refuses_non_tensor_entries_on_every_rank():
    outcome = run_ranks(_gather_non_tensor, world=3, timeout=TIMEOUT, deadline=30.0)
    assert not outcome.hung
    for rank in range(3):
        plain, nested, labelled, values = outcome.value(rank)
        assert plain.startswith("TypeError: TensorDict.all_gather: the entry ('name',)")
        if rank == 1:
            assert nested.startswith("TypeError: TensorDict.all_gather: the entry ('n', 'note')")
        else:
            assert nested.startswith("RuntimeError: TensorDict.all_gather: another rank")
        assert labelled.startswith("TypeError: Labelled.all_gather: the entry ('label',)")
        assert values == [[float(r)] * 2 for r in range(3)]


def _gather_batch_sizes(rank: int):
    # the same leaves, but rank 1 declares no batch dim (and another nested one)
    batch = [] if rank == 1 else [2]
    td = TensorDict(a=torch.full((2, 3), float(rank)), n={"b": torch.zeros(2)}, batch_size=batch)
    seen = [_caught(lambda: td.all_gather())]
    # the same batch sizes everywhere: gathered, each piece with them
    same = TensorDict(a=torch.full((2, 3), float(rank)), batch_size=[2])
    seen.append([(list(p.batch_size), p["a"][0, 0].item()) for p in same.all_gather()])
    return seen


def test_all_gather_refuses_batch_sizes_that_differ_between_ranks():
    outcome = run_ranks(_gather_batch_sizes, world=2, timeout=TIMEOUT, deadline=30.0)
    assert not outcome.hung
    for rank in range(2):
        refused, gathered = outcome.value(rank)
        assert refused.startswith("ValueError: TensorDict.all_gather:"), refused
        assert "batch sizes" in refused
        assert gathered == [([2], 0.0), ([2], 1.0)]
