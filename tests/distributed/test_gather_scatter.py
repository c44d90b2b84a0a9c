"""``all_gather`` and ``scatter`` on three real processes (gloo on 127.0.0.1).

References are torch.distributed's own ``all_gather`` and ``scatter`` of the same values as
plain tensors, run in the same ranks. Refusals (another structure on one rank, a bad list
on the source, a frozen container) are raised by every rank, and nothing hangs.
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
WORLD = 3


class Pair(TensorClass):
    x: torch.Tensor
    y: torch.Tensor


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor


def values(rank: int) -> dict:
    return {"a": torch.arange(4.0) + 10 * rank, "n": {"b": torch.full((2, 3), float(rank))}}


def _all_gather(rank: int):
    pieces = TensorDict(values(rank), batch_size=[]).all_gather()
    reference = [torch.empty(4) for _ in range(WORLD)]
    dist.all_gather(reference, values(rank)["a"])
    pair = Pair(x=torch.full((2,), float(rank)), y=torch.zeros(2, 5), batch_size=[2])
    pairs = pair.all_gather()
    return (
        [piece["a"].tolist() for piece in pieces],
        [t.tolist() for t in reference],
        [piece["n", "b"].unique().item() for piece in pieces],
        [type(p).__name__ for p in pairs],
        [p.x.tolist() for p in pairs],
    )


def test_all_gather_gives_every_rank_every_ranks_container_in_rank_order():
    outcome = run_ranks(_all_gather, world=WORLD, timeout=TIMEOUT)
    for rank in range(WORLD):
        gathered, reference, nested, kinds, pairs = outcome.value(rank)
        assert gathered == reference
        assert nested == list(range(WORLD))
        assert kinds == ["Pair"] * WORLD
        assert pairs == [[float(r)] * 2 for r in range(WORLD)]


def _scatter(rank: int):
    src = 1
    pieces = [TensorDict(values(r), batch_size=[]) for r in range(WORLD)] if rank == src else None
    mine = TensorDict({"a": torch.zeros(4), "n": {"b": torch.zeros(2, 3)}}, batch_size=[])
    same = mine.scatter(src=src, tensordicts=pieces)
    reference = torch.empty(4)
    dist.scatter(
        reference, [values(r)["a"] for r in range(WORLD)] if rank == src else None, src=src
    )
    return same is mine, mine["a"].tolist(), reference.tolist(), mine["n", "b"].unique().item()


def test_scatter_writes_each_ranks_piece_into_its_container():
    outcome = run_ranks(_scatter, world=WORLD, timeout=TIMEOUT)
    for rank in range(WORLD):
        same, received, reference, nested = outcome.value(rank)
        assert same and received == reference and nested == rank


def _refusals(rank: int):
    seen = []
    # another structure on rank 2: every rank refuses, naming all_gather
    shape = (5,) if rank == 2 else (4,)
    try:
        TensorDict(a=torch.zeros(shape), batch_size=[]).all_gather()
    except ValueError as error:
        seen.append(("all_gather", "all_gather" in str(error)))
    # a list of the wrong length on the source: every rank raises, nothing is written
    mine = TensorDict(a=torch.full((4,), -1.0), batch_size=[])
    pieces = [TensorDict(a=torch.ones(4), batch_size=[])] * 2 if rank == 0 else None
    try:
        mine.scatter(src=0, tensordicts=pieces)
    except (ValueError, RuntimeError) as error:
        seen.append(("length", "one container per rank" in str(error) or rank != 0))
    seen.append(("untouched", mine["a"].tolist() == [-1.0] * 4))
    # a frozen container on rank 1: every rank raises before anything is written
    target = (
        Frozen(x=torch.zeros(4), batch_size=[])
        if rank == 1
        else TensorDict(x=torch.full((4,), -1.0), batch_size=[])
    )
    pieces = [TensorDict(x=torch.ones(4), batch_size=[])] * WORLD if rank == 0 else None
    try:
        target.scatter(src=0, tensordicts=pieces)
    except (ValueError, RuntimeError, AttributeError) as error:
        seen.append(("frozen", "frozen" in str(error) or "refused" in str(error)))
    seen.append(("untouched", target["x"].tolist() in ([-1.0] * 4, [0.0] * 4)))
    dist.barrier()  # every rank is still in step: nothing hung
    return seen


def test_refusals_are_raised_by_every_rank_and_nothing_hangs():
    outcome = run_ranks(_refusals, world=WORLD, timeout=TIMEOUT, deadline=30.0)
    assert not outcome.hung
    for rank in range(WORLD):
        assert outcome.value(rank) == [
            ("all_gather", True),
            ("length", True),
            ("untouched", True),
            ("frozen", True),
            ("untouched", True),
        ], rank


def _subgroup(rank: int):
    # ranks 1 and 2 only: ranks are global (src=2), the order is the group's
    group = dist.new_group([1, 2])
    result = None
    if rank != 0:
        frozen = Frozen(x=torch.full((3,), float(rank)), batch_size=[3])
        gathered = frozen.all_gather(group=group)
        pieces = [TensorDict(a=torch.full((2,), 10.0 * r), batch_size=[]) for r in (1, 2)]
        mine = TensorDict(a=torch.zeros(2), batch_size=[])
        mine.scatter(src=2, tensordicts=pieces if rank == 2 else None, group=group)
        kinds = [type(g).__name__ for g in gathered]
        result = kinds, [g.x[0].item() for g in gathered], mine["a"][0].item()
    dist.barrier()  # rank 0 holds the store: it stays until the group is done
    return result


def test_a_subgroup_uses_global_ranks_and_a_frozen_class_gathers_into_new_instances():
    outcome = run_ranks(_subgroup, world=WORLD, timeout=TIMEOUT)
    assert outcome.value(0) is None
    for rank in (1, 2):
        kinds, xs, received = outcome.value(rank)
        assert kinds == ["Frozen", "Frozen"] and xs == [1.0, 2.0]
        assert received == 10.0 * rank  # the piece at its group rank


def test_without_a_process_group_they_say_so():
    td = TensorDict(a=torch.zeros(2), batch_size=[2])
    with pytest.raises(ValueError, match=r"all_gather: torch\.distributed is not initialised"):
        td.all_gather()
    with pytest.raises(ValueError, match=r"scatter: torch\.distributed is not initialised"):
        td.scatter(src=0, tensordicts=[td])
