"""Point-to-point under faults, on real processes (gloo on 127.0.0.1, real ``kill -9``).

Nothing hangs: a receiver that refuses the message still consumes it (the
sender completes), and a sender that dies or stops mid-message makes the
receiver raise within the process group's timeout. Every rank runs under a
deadline (``process_harness.run_ranks``). Expected values are plain tensors.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
from process_harness import run_ranks

from tdfunc import TensorClass, TensorDict
from tdfunc._distributed import collectives as tdist
from tdfunc._distributed.layout import _Layout

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="this torch build has no torch.distributed gloo backend",
)
TIMEOUT = 4.0  # the process group's timeout in these tests, seconds


class Frozen(TensorClass["frozen"]):
    x: torch.Tensor


def _big() -> dict:
    # over the inline size: a header, then several payload messages
    return {"a": torch.arange(300_000.0), "b": torch.arange(300_000.0) * 2, "c": torch.ones(3)}


# ---------------------------------------------------------------- refusals
def _refusal_ranks(rank: int):
    if rank == 1:
        started = time.monotonic()
        payloads = [
            TensorDict({"x": torch.ones(4)}, []),  # into a sparse receiver
            TensorDict({"n": {"x": torch.ones(4)}, "y": torch.ones(2)}, []),  # frozen child
            TensorDict(_big(), []),  # frozen child, payload in several messages
            TensorDict({"x": torch.ones(4)}, []),  # frozen root (module function)
            TensorDict({"n": {"x": torch.ones(4)}, "y": torch.ones(2)}, []),  # irecv default
            TensorDict({"n": {"x": torch.ones(4)}, "y": torch.ones(2)}, []),  # premature
            TensorDict({"y": torch.full((2,), 5.0)}, []),  # the channel still works
        ]
        for payload in payloads:
            payload.send(0)
        return time.monotonic() - started
    errors = []

    def refused(call) -> None:
        try:
            call()
        except Exception as error:
            errors.append((type(error).__name__, str(error), list(getattr(error, "__notes__", []))))
        else:
            errors.append(None)

    sparse = TensorDict({"x": torch.zeros(4).to_sparse()}, [])
    refused(lambda: sparse.recv(1))
    parent = TensorDict({"n": Frozen(x=torch.zeros(4)), "y": torch.zeros(2)}, [])
    refused(lambda: parent.recv(1))
    big = {k: torch.zeros_like(v) for k, v in _big().items()}
    big_parent = TensorDict({"a": big["a"], "b": Frozen(x=big["b"]), "c": big["c"]}, [])
    refused(lambda: big_parent.recv(1))
    refused(lambda: tdist.recv(Frozen(x=torch.zeros(4)), 1))
    refused(lambda: parent.irecv(1))
    refused(lambda: parent.irecv(1, return_premature=True).wait())
    after = TensorDict({"y": torch.zeros(2)}, [])
    after.recv(1)
    untouched = [
        parent["n"].x.abs().sum().item(),
        parent["y"].abs().sum().item(),
        sum(t.abs().sum().item() for t in big.values()),
    ]
    return errors, untouched, after["y"].tolist()


def test_refused_messages_are_consumed_so_the_sender_completes():
    outcome = run_ranks(_refusal_ranks, timeout=TIMEOUT)
    assert not outcome.hung
    assert outcome.value(1) < TIMEOUT  # drained by the receiver, not ended by a timeout
    errors, untouched, after = outcome.value(0)
    assert all(error is not None for error in errors), errors
    kinds = [error[0] for error in errors]
    assert (
        kinds
        == ["TypeError", "RuntimeError", "RuntimeError", "FrozenInstanceError"]
        + ["RuntimeError"] * 2
    )
    assert "only dense (strided) tensors" in errors[0][1]
    assert "key 'n'" in errors[1][1] and "frozen Frozen" in errors[1][1]
    assert "key 'b'" in errors[2][1]
    assert errors[3][1].startswith("Frozen.recv: cannot receive into a frozen Frozen")
    assert errors[4][1].startswith("TensorDict.irecv: cannot write")
    for error in errors:
        assert error[2] == ["The TensorDict sent by rank 1 (tag 0) was received and discarded."]
    assert untouched == [0.0, 0.0, 0.0]  # nothing written into any receiver
    assert after == [5.0, 5.0]


# ---------------------------------------------------------------- dead or stopped peers
def _dies_mid_message(stage: str, how: str, receive: str):
    def ranks(rank: int):
        if rank == 1:
            layout = _Layout(TensorDict(_big(), []), "send")
            segments = layout.segments(split=True)
            dist.send(layout.header(len(segments), False), 0, tag=0)
            if stage == "payload":  # one of the payload messages, then nothing
                dist.send(layout.pack(segments[0]), 0, tag=1 << 30)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        target = TensorDict({k: torch.zeros_like(v) for k, v in _big().items()}, [])
        started = time.monotonic()
        try:
            if receive == "recv":
                target.recv(1)
            elif receive == "irecv":
                target.irecv(1)
            else:
                target.irecv(1, return_premature=True).wait()
        except Exception as error:
            return type(error).__name__, str(error), time.monotonic() - started
        return "returned", "", time.monotonic() - started

    return ranks


@pytest.mark.parametrize(
    ("stage", "how", "receive"),
    [
        ("header", "kill", "recv"),
        ("payload", "kill", "recv"),
        ("payload", "kill", "irecv"),
        ("header", "kill", "premature"),
        ("payload", "stop", "recv"),
    ],
)
def test_a_peer_that_dies_mid_message_makes_the_receiver_raise(stage, how, receive):
    outcome = run_ranks(_dies_mid_message(stage, how, receive), timeout=TIMEOUT, wait_for=(0,))
    kind, text, seconds = outcome.value(0)
    assert kind == "RuntimeError", (kind, text)
    assert seconds < TIMEOUT + 2.0
    if how == "kill":
        assert outcome.exitcodes[1] == -signal.SIGKILL
        assert "Connection closed by peer" in text or "Timed out" in text
    else:
        assert "Timed out" in text and seconds >= TIMEOUT - 0.5


# ---------------------------------------------------------------- tensordict's keywords
def _keyword_ranks(rank: int):
    data = TensorDict({"a": torch.full((3,), float(rank))}, [3])
    if rank == 1:
        assert data.isend(dst=0, init_tag=7, pseudo_rand=True) is None  # waits, like tensordict
        work = data.isend(dst=0, tag=8, return_early=True)
        work.wait()
        data.consolidate().send(dst=0, tag=9, consolidated=True)
        return None
    got = [data.irecv(src=1, init_tag=7, pseudo_rand=True), data["a"].tolist()]
    other = TensorDict({"a": torch.zeros(3)}, [3])
    work = other.irecv(src=1, tag=8, return_premature=True)
    work.wait()
    third = TensorDict({"a": torch.zeros(3)}, [3])  # any matching receiver, consolidated or not
    assert third.recv(src=1, tag=9, consolidated=True) == 1
    return got + [work.source_rank(), other["a"].tolist(), third["a"].tolist()]


def test_tensordict_keywords_of_isend_and_irecv():
    outcome = run_ranks(_keyword_ranks, timeout=TIMEOUT)
    assert outcome.value(1) is None
    assert outcome.value(0) == [1, [1.0, 1.0, 1.0], 1, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]


def test_tag_and_init_tag_must_agree():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    with pytest.raises(ValueError, match="tag=3 and init_tag=4"):
        td.irecv(1, tag=3, init_tag=4)
    with pytest.raises(TypeError, match="pseudo_rand must be a bool"):
        td.isend(1, pseudo_rand="yes")
    with pytest.raises(TypeError, match="consolidated must be a bool"):
        td.send(1, consolidated="yes")


# ---------------------------------------------------------------- collectives
def _collective_refusal_ranks(rank: int):
    def parent(value: float) -> TensorDict:
        return TensorDict({"n": Frozen(x=torch.full((3,), value)), "y": torch.full((2,), value)})

    def plain() -> TensorDict:
        return TensorDict({"n": {"x": torch.zeros(3)}, "y": torch.zeros(2)})

    outcomes = []
    for call in (
        lambda td: td.broadcast(src=0),  # rank 1 would write into its frozen child
        lambda td: td.all_reduce(),
    ):
        td = parent(float(rank)) if rank == 1 else plain()
        try:
            call(td)
            outcomes.append(("ok", ""))
        except Exception as error:
            outcomes.append((type(error).__name__, str(error)))
        outcomes.append(td["n"]["x"].tolist() + td["y"].tolist())  # unchanged
    # the source of a broadcast writes nothing: its frozen child is no obstacle
    src = parent(5.0) if rank == 0 else plain()
    src.broadcast(src=0)
    outcomes.append(src["n"]["x"].tolist())
    return outcomes


def test_collectives_refuse_on_every_rank_when_one_holds_a_frozen_child():
    outcome = run_ranks(_collective_refusal_ranks, timeout=TIMEOUT)
    assert not outcome.hung
    zero, one = outcome.value(0), outcome.value(1)
    for kind, text in (zero[0], zero[2]):
        assert kind == "RuntimeError" and "another rank of the group refused" in text
    for kind, text in (one[0], one[2]):
        assert kind == "RuntimeError" and "key 'n'" in text and "frozen Frozen" in text
    assert zero[1] == zero[3] == [0.0] * 5 and one[1] == one[3] == [1.0] * 5  # untouched
    assert zero[4] == one[4] == [5.0, 5.0, 5.0]
