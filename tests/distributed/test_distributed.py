"""TensorDict over torch.distributed, on real processes (gloo on 127.0.0.1).

Each ``launch`` starts fresh ``spawn`` processes (a torch import costs a few
seconds each), so many checks share one process group. Every rank compares
its results with values computed without tdfunc (plain tensors seeded per
rank, Python loops, ``torch.func`` over plain dicts). Process-group timeout,
joins and waits are bounded, so a bug fails instead of hanging.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
import torch
import torch.distributed as dist
from process_harness import launch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from tdfunc import (
    DistributedWork,
    TensorClass,
    TensorDict,
    gather_members,
    shard_ensemble,
    shard_range,
)
from tdfunc import _distributed as tdist

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed gloo backend",
)


# ---------------------------------------------------------------- data (no tdfunc)
class Pair(TensorClass):
    x: torch.Tensor
    y: torch.Tensor


def _plain(seed: int) -> dict:
    """Reference values keyed by nested-key tuples, for batch size [3]."""
    g = torch.Generator().manual_seed(seed)
    return {
        ("a",): torch.randn(3, 4, generator=g),
        ("nested", "b"): torch.randint(-50, 50, (3, 2), generator=g),
        ("nested", "deep", "c"): torch.rand(3, generator=g) > 0.5,
        ("z",): torch.randn(3, 2, generator=g, dtype=torch.complex64),
        ("h",): torch.randn(3, generator=g).half(),
        ("e",): torch.empty(3, 0),
        ("w",): torch.randn(3, 5, generator=g),
        ("pair", "x"): torch.randn(3, 2, generator=g, dtype=torch.float64),
        ("pair", "y"): torch.randint(0, 9, (3,), generator=g),
    }


def _sender_td(seed: int) -> TensorDict:
    values = _plain(seed)
    td = TensorDict({}, [3])
    for key, value in values.items():
        if key[0] != "pair":
            td.set(key, value.clone())
    td.set(
        "pair", Pair(x=values["pair", "x"].clone(), y=values["pair", "y"].clone(), batch_size=[3])
    )
    td.set("note", "sender")
    return td


def _receiver_td() -> TensorDict:
    """Same structure, other insertion order, a non-contiguous leaf and a Parameter."""
    template = _plain(0)
    td = TensorDict({}, [3])
    td.set(
        "pair",
        Pair(
            x=torch.zeros(3, 2, dtype=torch.float64),
            y=torch.zeros(3, dtype=torch.long),
            batch_size=[3],
        ),
    )
    for key in reversed(list(template)):
        if key[0] == "pair":
            continue
        if key == ("a",):
            td.set(key, torch.zeros(4, 3).t())  # non-contiguous target
        elif key == ("w",):
            td.set(key, nn.Parameter(torch.zeros(3, 5)))  # a leaf that requires grad
        else:
            td.set(key, torch.zeros_like(template[key]))
    td.set("note", "receiver")
    return td


def _check_received(td: TensorDict, seed: int) -> None:
    for key, expected in _plain(seed).items():
        got = td.get(key)
        assert got.dtype == expected.dtype, key
        assert torch.equal(got.detach(), expected), key
    assert td.get("note") == "receiver"  # non-tensor leaves are not sent


# ---------------------------------------------------------------- point to point
def _p2p_worker(rank: int, world_size: int) -> None:
    # the documented example: every worker holds the same structure; 1 sends, 0 receives
    data = TensorDict({"a": torch.zeros(()), ("b", "c"): torch.ones(())}, [])
    if rank == 1:
        data["a"] = torch.tensor(3.5)
        data["b", "c"] = torch.tensor(-2.0)
        data.isend(dst=0, return_early=True)  # handle dropped: the send still completes
    else:
        work = data.irecv(src=1, return_premature=True)
        assert isinstance(work, DistributedWork)
        work.wait()
        assert work.is_completed() and work.source_rank() == 1
        assert data["a"].item() == 3.5 and data["b", "c"].item() == -2.0

    # the documentation's lines verbatim: isend and irecv wait for the data, as in tensordict
    data = TensorDict({"a": torch.zeros(()), ("b", "c"): torch.ones(())}, [])
    if rank == 1:
        data["a"] = torch.tensor(1.25)
        assert data.isend(dst=0) is None
        TensorDict({"after": torch.ones(())}, []).send(0)
    else:
        assert data.irecv(src=1) == 1
        assert data["a"].item() == 1.25  # in place when irecv returns
        after = TensorDict({"after": torch.zeros(())}, [])
        after.recv(1)
        assert after["after"].item() == 1.0

    # premature handles dropped: a later receive is queued behind them, both complete
    data = TensorDict({"a": torch.zeros(())}, [])
    if rank == 1:
        TensorDict({"a": torch.tensor(2.5)}, []).isend(dst=0, return_early=True)
        TensorDict({"after": torch.ones(())}, []).send(0)
    else:
        data.irecv(src=1, return_premature=True)
        after = TensorDict({"after": torch.zeros(())}, [])
        after.recv(1)  # queued behind the dropped irecv: both are done when it returns
        assert data["a"].item() == 2.5 and after["after"].item() == 1.0

    # nested, mixed dtypes, TensorClass inside, other insertion order, non-contiguous target
    if rank == 1:
        _sender_td(11).send(0)
        _sender_td(12).isend(0, return_early=True).wait()
    else:
        target = _receiver_td()
        pointer = target["a"].data_ptr()
        assert target.recv(1) == 1
        _check_received(target, 11)
        assert target["a"].data_ptr() == pointer and target["w"].requires_grad  # in place
        target.irecv(1, return_premature=True).wait()
        _check_received(target, 12)

    # several outstanding receives complete in posting order, whatever the wait order
    if rank == 1:
        works = [
            TensorDict({"v": torch.full((4,), float(i))}, [4]).isend(0, return_early=True)
            for i in range(4)
        ]
        for work in works:
            work.wait()
    else:
        tds = [TensorDict({"v": torch.zeros(4)}, [4]) for _ in range(4)]
        works = [td.irecv(1, return_premature=True) for td in tds[:3]]
        tds[3].recv(1)  # a blocking receive queued behind three pending ones
        for work in reversed(works):
            work.wait()
        assert [td["v"][0].item() for td in tds] == [0.0, 1.0, 2.0, 3.0]

    # tags, any-source receive, a process group, a single (non-)contiguous leaf, no leaf
    group = dist.new_group([0, 1])
    if rank == 1:
        TensorDict({"t": torch.full((2,), 3.0)}, [2]).send(0, tag=3)
        TensorDict({"t": torch.full((2,), 5.0)}, [2]).send(0, tag=5)
        TensorDict({"g": torch.arange(6.0).reshape(2, 3)}, [2]).send(0, group=group)
        TensorDict({"single": torch.arange(6.0).reshape(2, 3)}, [2]).send(0)
        TensorDict({}, [2]).send(0)
    else:
        five, three = TensorDict({"t": torch.zeros(2)}, [2]), TensorDict({"t": torch.zeros(2)}, [2])
        work = five.irecv(1, tag=5, return_premature=True)
        assert three.recv(None, tag=3) == 1
        work.wait()
        assert three["t"].tolist() == [3.0, 3.0] and five["t"].tolist() == [5.0, 5.0]
        grouped = TensorDict({"g": torch.zeros(2, 3)}, [2])
        grouped.recv(1, group=group)
        assert torch.equal(grouped["g"], torch.arange(6.0).reshape(2, 3))
        single = TensorDict({"single": torch.zeros(3, 2).t()}, [2])
        single.recv(1)
        assert torch.equal(single["single"], torch.arange(6.0).reshape(2, 3))
        assert TensorDict({}, [2]).recv(1) == 1

    # large payloads: small leaves packed (over the inline size), big leaves alone
    if rank == 1:
        _large_td(21, contiguous=True).send(0)
        _large_td(22, contiguous=True).isend(0, return_early=True).wait()
    else:
        for seed in (21, 22):
            target = _large_td(0, contiguous=False)
            pointer = target["big"].data_ptr()
            target.recv(1)
            _assert_same(target, _large_td(seed, contiguous=True))
            assert target["big"].data_ptr() == pointer

    # a TensorClass on its own
    pair = Pair(x=torch.full((2, 2), float(rank)), y=torch.full((2,), rank), batch_size=[2])
    if rank == 1:
        _send(pair, 0)
    else:
        _recv(pair, 1)
        assert torch.equal(pair.x, torch.ones(2, 2)) and torch.equal(pair.y, torch.ones(2).long())

    # structure mismatch: a clear error on the receiver, the sender does not hang
    if rank == 1:
        started = time.monotonic()
        TensorDict({"a": torch.ones(3), "b": torch.ones(3)}, [3]).send(0)
        TensorDict({"a": torch.ones(3), "b": torch.ones(3, 2)}, [3]).isend(0, init_tag=4)
        _large_td(23, contiguous=True).send(0)  # header, then several payload messages
        assert time.monotonic() - started < 20  # drained by the receiver, not timed out
        TensorDict({"a": torch.full((3,), 7.0)}, [3]).send(0)
    else:
        wrong_keys = TensorDict({"a": torch.zeros(3), "c": torch.zeros(3)}, [3])
        with pytest.raises(ValueError, match=r"TensorDict.recv: .*rank 1.*the keys differ"):
            wrong_keys.recv(1)
        wrong_shape = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3)}, [3])
        with pytest.raises(ValueError, match="same keys, but some shapes or dtypes differ"):
            wrong_shape.irecv(1, init_tag=4, return_premature=True).wait()
        assert wrong_shape["b"].tolist() == [0.0, 0.0, 0.0]  # nothing written
        smaller = _large_td(0, contiguous=True).exclude("big")
        with pytest.raises(ValueError, match=r"the keys differ\. Sender: 22 tensor leaves"):
            smaller.recv(1)
        after = TensorDict({"a": torch.zeros(3)}, [3])
        after.recv(1)  # the channel is still usable
        assert after["a"].tolist() == [7.0, 7.0, 7.0]

    # a send nobody receives yet: wait(timeout) is bounded, the send completes later
    if rank == 1:
        work = TensorDict({"late": torch.ones(2)}, [2]).isend(0, tag=9, return_early=True)
        with pytest.raises(TimeoutError, match="isend"):
            work.wait(timeout=0.5)
        assert not work.is_completed()
        TensorDict({"go": torch.ones(())}, []).send(0)
        work.wait()
    else:
        TensorDict({"go": torch.zeros(())}, []).recv(1)
        late = TensorDict({"late": torch.zeros(2)}, [2])
        late.recv(1, tag=9)
        assert late["late"].tolist() == [1.0, 1.0]


def _large_td(seed: int, contiguous: bool) -> TensorDict:
    """Leaves over and under the sizes where tdfunc changes its message plan."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({}, [4])
    for i in range(20):
        td.set(("small", str(i)), torch.randn(4, 4096, generator=g))  # 64 KiB each: packed
    td.set("big", torch.randn(4, 80000, generator=g))  # 1.2 MiB, travels alone
    bigger = torch.randint(0, 100, (4, 30000), generator=g, dtype=torch.int32)  # alone too
    td.set("big_t", bigger if contiguous else bigger.t().contiguous().t())
    return td


def _assert_same(actual: TensorDict, expected: TensorDict) -> None:
    keys = sorted(expected.keys(True, True), key=str)
    assert sorted(actual.keys(True, True), key=str) == keys
    for key in keys:
        assert torch.equal(actual.get(key), expected.get(key)), key


def _send(collection, dst: int) -> None:
    if hasattr(collection, "send"):
        collection.send(dst)
    else:  # TensorClass without forwarding methods: the functions accept any container
        tdist.send(collection, dst)


def _recv(collection, src: int) -> None:
    if hasattr(collection, "recv"):
        collection.recv(src)
    else:
        tdist.recv(collection, src)


# ---------------------------------------------------------------- collectives
def _rank_values(rank: int) -> dict:
    g = torch.Generator().manual_seed(100 + rank)
    return {
        ("f",): torch.randn(2, 3, generator=g),
        ("i",): torch.randint(-20, 20, (2,), generator=g),
        ("n", "d"): torch.randn(2, 2, generator=g, dtype=torch.float64),
        ("n", "g"): torch.randn(2, 4, generator=g),
    }


def _rank_td(rank: int) -> TensorDict:
    td = TensorDict({}, [2])
    for key, value in reversed(list(_rank_values(rank).items())):
        td.set(key, value.clone())
    return td


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # not torch.testing.assert_close: with a process group up, it imports DTensor and
    # sympy (about 4 s per process)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-6), (actual, expected)


def _assert_values(td: TensorDict, expected: dict) -> None:
    for key, value in expected.items():
        _assert_close(td.get(key), value)


def _collectives_worker(rank: int, world_size: int) -> None:
    every = [_rank_values(r) for r in range(world_size)]
    keys = list(every[0])

    td = _rank_td(rank)
    assert td.broadcast(src=2) is td
    _assert_values(td, every[2])

    large = _large_td(rank, contiguous=rank != 0)
    large.broadcast(src=1)
    _assert_same(large, _large_td(1, contiguous=True))

    td = _rank_td(rank)
    td.all_reduce()
    _assert_values(td, {k: sum(values[k] for values in every) for k in keys})

    large = _large_td(rank, contiguous=rank != 0)
    large.all_reduce()
    every_large = [_large_td(r, contiguous=True) for r in range(world_size)]
    for key in large.keys(True, True):
        _assert_close(large.get(key), sum(other.get(key) for other in every_large))

    td = _rank_td(rank)
    td.all_reduce(dist.ReduceOp.MAX)
    _assert_values(td, {k: torch.stack([v[k] for v in every]).amax(0) for k in keys})

    floats = _rank_td(rank).exclude("i")
    work = floats.all_reduce(dist.ReduceOp.AVG, async_op=True)
    assert isinstance(work, DistributedWork)
    work.wait()
    _assert_values(floats, {k: sum(v[k] for v in every) / world_size for k in keys if k != ("i",)})
    with pytest.raises(TypeError, match=r"AVG needs floating-point leaves.*'i'"):
        _rank_td(rank).all_reduce(dist.ReduceOp.AVG)

    td = _rank_td(rank)
    td.reduce(dst=1)
    if rank == 1:
        _assert_values(td, {k: sum(values[k] for values in every) for k in keys})
    else:
        _assert_values(td, every[rank])  # untouched

    # a mismatch raises the same error on every rank, and the group stays usable
    odd = _rank_td(rank)
    if rank == 1:
        odd.set("extra", torch.zeros(2))
    with pytest.raises(ValueError, match=r"do not have the same structure \(the keys differ"):
        odd.all_reduce()
    shaped = TensorDict({"s": torch.zeros(2, 1 + (rank == 0))}, [2])
    with pytest.raises(ValueError, match="some shapes or dtypes differ"):
        shaped.broadcast(src=0)
    counter = TensorDict({"c": torch.ones(())}, [])
    counter.all_reduce()
    assert counter["c"].item() == world_size

    # a subgroup of ranks 0 and 2 (global ranks in every call, as in torch.distributed)
    group = dist.new_group([0, 2])
    if rank in (0, 2):
        td = _rank_td(rank)
        td.all_reduce(group=group)
        _assert_values(td, {k: every[0][k] + every[2][k] for k in keys})
        probe = TensorDict({"p": torch.full((2,), float(rank))}, [2])
        if rank == 2:
            probe.send(0, group=group)
        else:
            probe.recv(2, group=group)
            assert probe["p"].tolist() == [2.0, 2.0]

    _ensemble_checks(rank, world_size, group)


# ---------------------------------------------------------------- sharded ensemble
def _models(n: int) -> list:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)) for _ in range(n)]


def _run_member(base: nn.Module):
    def run(params, x):
        with params.to_module(base):
            return base(x)

    return run


def _run_td(run, params, x):
    out = run(params, x)
    return TensorDict({"out": out, ("stats", "norm"): out.norm(dim=-1)}, [x.shape[0]])


def _ensemble_checks(rank: int, world_size: int, pair_group) -> None:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(5))
    for n in (5, 2):  # 5 over 3 ranks: 2, 2, 1 members; 2 over 3 ranks: 1, 1, 0
        models = _models(n)
        with torch.no_grad():
            loop = torch.stack([m(x) for m in models])  # reference: a Python loop
            plain, _ = stack_module_state(models)
            base = _models(1)[0]
            by_vmap = vmap(partial(functional_call, base), (0, None))(plain, (x,))
            _assert_close(by_vmap, loop)

            params = TensorDict.from_modules(*models).detach()
            local = shard_ensemble(params)
            members = shard_range(n, rank, world_size)
            assert local.batch_size == torch.Size([len(members)])
            run = _run_member(base)
            pred = vmap(run, (0, None))(local, x)
            full = gather_members(pred)
            _assert_close(full, loop)
            on_root = gather_members(pred, dst=0)
            if rank == 0:
                _assert_close(on_root, loop)
            else:
                assert on_root is None

            gathered = gather_members(vmap(partial(_run_td, run), (0, None))(local, x))
            assert gathered.batch_size == torch.Size([n, 4])
            _assert_close(gathered["out"], loop)
            _assert_close(gathered["stats", "norm"], loop.norm(dim=-1))

            if rank in (0, 2):  # the ensemble over the subgroup of ranks 0 and 2: 3 + 2
                local = shard_ensemble(params, group=pair_group)
                assert local.batch_size[0] == len(shard_range(n, rank // 2, 2))
                pred = vmap(run, (0, None))(local, x)
                _assert_close(gather_members(pred, group=pair_group), loop)

    wrong = torch.zeros(1, 2 + (rank == 1))
    with pytest.raises(ValueError, match="gather_members: the ranks' outputs differ"):
        gather_members(wrong)


@pytest.mark.slow
def test_point_to_point_on_two_processes():
    launch(_p2p_worker, 2)


@pytest.mark.slow
def test_collectives_and_sharded_ensemble_on_three_processes():
    launch(_collectives_worker, 3)


# ---------------------------------------------------------------- in one process
def test_shard_range_matches_tensor_split():
    for members in range(0, 9):
        for world in range(1, 5):
            expected = [c.tolist() for c in torch.tensor_split(torch.arange(members), world)]
            assert [list(shard_range(members, r, world)) for r in range(world)] == expected


def test_shard_ensemble_slices_members_without_copy():
    params = TensorDict({"w": torch.randn(5, 3), "n": {"b": torch.randn(5)}}, [5])
    pieces = [shard_ensemble(params, rank=r, world_size=2) for r in range(2)]
    assert [p.batch_size[0] for p in pieces] == [3, 2]
    assert torch.equal(torch.cat([p["w"] for p in pieces]), params["w"])
    assert pieces[1]["w"].data_ptr() == params["w"][3].data_ptr()


def test_errors_without_a_process_group():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    assert not dist.is_initialized(), "an earlier test left a process group initialised"
    for call in (lambda: td.send(0), lambda: td.irecv(0), lambda: td.all_reduce()):
        with pytest.raises(RuntimeError, match=r"torch\.distributed is not initialised"):
            call()
    # torch.distributed's own calls raise ValueError here: code catching that catches ours
    with pytest.raises(ValueError) as torchs:
        dist.send(torch.zeros(1), 1)
    for name in ("send", "recv", "isend", "irecv", "broadcast", "reduce"):
        with pytest.raises(type(torchs.value), match="not initialised"):
            getattr(td, name)(0)
    with pytest.raises(type(torchs.value), match="not initialised"):
        td.all_reduce()
    with pytest.raises(RuntimeError, match="shard_ensemble: pass rank= and world_size="):
        shard_ensemble(td)
    with pytest.raises(ValueError, match="leading member dim"):
        shard_ensemble(TensorDict({"a": torch.zeros(2)}, []), rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"tag must be an int in \[0, 2\*\*30\)"):
        td.send(0, tag=-1)
    with pytest.raises(ValueError, match=r"shard_range: .*rank=2, world_size=2"):
        shard_range(4, 2, 2)
