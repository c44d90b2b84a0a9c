"""Hostile leaves across processes: expanded receivers and per-member non-tensor stacks.

A receiver whose leaf is expanded (several elements share one memory location)
cannot hold the sent values: every receive and collective refuses it with a
clear error, and the message is consumed so that nothing hangs.
``gather_members`` gathers tensors only, so a stack of non-tensor values (one per
member) is refused on every rank instead of keeping this rank's members in a
result of the gathered batch size. References are plain tensors.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from process_harness import run_ranks

from tdfunc import TensorClass, TensorDict
from tdfunc._distributed.sharded import gather_members

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed gloo backend",
)


def _expanded_ranks(rank: int):
    def refused(call) -> str:
        try:
            call()
        except RuntimeError as error:
            return str(error)
        return "no error"

    other = torch.arange(3.0)
    if rank == 1:
        TensorDict({"a": torch.arange(4.0), "b": other}, []).send(0)
        TensorDict({"a": torch.arange(4.0), "b": other}, []).send(0)
    out = {}
    if rank == 0:
        target = TensorDict({"a": torch.zeros(1).expand(4), "b": torch.zeros(3)}, [])
        out["recv"] = refused(lambda: target.recv(1))
        out["untouched"] = target["b"].tolist()
        fresh = TensorDict({"a": torch.zeros(4), "b": torch.zeros(3)}, [])
        fresh.recv(1)  # the channel still works
        out["after"] = fresh["a"].tolist()
    mine = TensorDict({"e": torch.full((1,), rank + 1.0).expand(3), "f": torch.ones(2)}, [])
    out["all_reduce"] = refused(lambda: mine.all_reduce())
    out["broadcast"] = refused(lambda: mine.broadcast(0))
    out["kept"] = mine["f"].tolist()
    return out


def test_expanded_receivers_are_refused_on_every_rank():
    outcome = run_ranks(_expanded_ranks, timeout=5.0, deadline=30.0)
    assert not outcome.hung
    zero, one = outcome.value(0), outcome.value(1)
    assert "cannot write the received values into key 'a'" in zero["recv"]
    assert "expanded" in zero["recv"]
    assert zero["untouched"] == [0.0, 0.0, 0.0]
    assert zero["after"] == torch.arange(4.0).tolist()
    for values in (zero, one):
        assert "key 'e'" in values["all_reduce"]
        assert values["kept"] == [1.0, 1.0]  # nothing reduced on any rank
    # rank 0 sends (writes nothing), rank 1 refuses: both raise, nobody waits
    assert "another rank of the group refused" in zero["broadcast"]
    assert "key 'e'" in one["broadcast"]


def _stack_ranks(rank: int):
    base = torch.arange(10.0).reshape(5, 2)
    rows = range(3) if rank == 0 else range(3, 5)
    samples = [TensorDict({"x": base[i], "tag": f"m{i}"}, []) for i in rows]
    try:
        gather_members(torch.stack(samples))
    except ValueError as error:
        refused = str(error)
    else:
        refused = "no error"
    # without the stack, the tensors gather as torch.cat would
    plain = gather_members(torch.stack(samples).exclude("tag"))
    return refused, plain["x"].equal(base), list(plain.batch_size)


def test_gather_members_refuses_non_tensor_stacks_on_every_rank():
    outcome = run_ranks(_stack_ranks, timeout=5.0, deadline=30.0)
    assert not outcome.hung
    for rank in (0, 1):
        refused, equal, batch = outcome.value(rank)
        assert "stack of non-tensor values" in refused and "'tag'" in refused
        assert equal and batch == [5]


def _named_ranks(rank: int):
    base = torch.arange(30.0).reshape(5, 3, 2)
    rows = slice(0, 3) if rank == 0 else slice(3, 5)
    n = 3 if rank == 0 else 2
    inner = TensorDict({"y": base[rows]}, [n, 3], names=["member", "step"])
    pred = TensorDict({"x": base[rows, 0], "inner": inner}, [n], names=["member"])
    full = gather_members(pred)
    return full.names, full["inner"].names, full["inner", "y"].equal(base)


def test_gather_members_keeps_dim_names():
    outcome = run_ranks(_named_ranks, timeout=5.0, deadline=30.0)
    assert not outcome.hung
    for rank in (0, 1):
        assert outcome.value(rank) == (["member"], ["member", "step"], True)


def _one_rank_refuses(rank: int):
    members = torch.arange(6.0).reshape(3, 2)
    pred = members[0, 0] if rank == 1 else members  # rank 1: no member dim
    try:
        gather_members(pred)
    except ValueError as error:
        return str(error)
    return "no error"


def test_gather_members_a_refusing_rank_makes_every_rank_raise():
    outcome = run_ranks(_one_rank_refuses, timeout=5.0, deadline=30.0)
    assert not outcome.hung
    assert "rank 1 of the group refused" in outcome.value(0)
    assert "must start with the member dim" in outcome.value(1)


class _Frozen(TensorClass["frozen"]):
    x: torch.Tensor


class _Plain(TensorClass):
    x: torch.Tensor


def _one_rank_frozen(rank: int):
    outcome = {}
    calls = {"all_reduce": lambda o: o.all_reduce(), "broadcast": lambda o: o.broadcast(0)}
    calls["reduce"] = lambda o: o.reduce(0)
    for name, call in calls.items():
        obj = _Frozen if rank == 1 else _Plain
        instance = obj(x=torch.full((3,), rank + 1.0), batch_size=[])
        try:
            call(instance)
        except (RuntimeError, AttributeError) as error:
            outcome[name] = (type(error).__name__, str(error))
        else:
            outcome[name] = ("no error", instance.x.tolist())
    return outcome


def test_a_frozen_instance_on_one_rank_makes_every_rank_raise():
    outcome = run_ranks(_one_rank_frozen, timeout=5.0, deadline=30.0)
    assert not outcome.hung
    for name in ("all_reduce", "broadcast", "reduce"):
        kind, text = outcome.value(1)[name]
        assert kind == "FrozenInstanceError" and f"_Frozen.{name}" in text
        kind, text = outcome.value(0)[name]
        assert kind == "RuntimeError" and "another rank of the group refused" in text


def _one_rank_nested(rank: int):
    rows = [torch.zeros(2), torch.ones(2)]
    leaf = torch.nested.nested_tensor(rows) if rank == 1 else torch.stack(rows)
    outcome = {}
    calls = {
        "all_reduce": lambda td: td.all_reduce(),
        "broadcast": lambda td: td.broadcast(0),
        "gather_members": gather_members,
    }
    for name, call in calls.items():
        try:
            call(TensorDict({"a": leaf}, [2]))
        except (TypeError, RuntimeError, ValueError) as error:
            outcome[name] = (type(error).__name__, str(error))
        else:
            outcome[name] = ("no error", "")
    return outcome


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_a_nested_leaf_on_one_rank_makes_every_rank_raise():
    outcome = run_ranks(_one_rank_nested, timeout=5.0, deadline=30.0)
    assert not outcome.hung
    for name in ("all_reduce", "broadcast", "gather_members"):
        kind, text = outcome.value(1)[name]
        assert kind == "TypeError" and "nested (ragged) tensors cannot be communicated" in text
        kind, text = outcome.value(0)[name]
        assert "rank" in text and ("cannot be communicated" in text or "refused" in text)
