"""``empty(batch_size=, device=, names=)``, ``clear_device_`` and ``auto_device_``,
compared with tensordict 0.15.3 run in its own process (``tensordict_peer``)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict

PROBE = """
import json, torch
from {lib} import TensorDict

def show(td):
    return [list(td.batch_size), str(td.device), td.names if any(td.names) else None,
            sorted(map(str, td.keys(True)))]

def run(thunk):
    try:
        return thunk()
    except Exception as error:
        return type(error).__name__

out = {{}}
td = TensorDict({{"a": torch.zeros(3), "b": {{"c": torch.ones(3, 2)}}}}, [3], device="cpu")
out["empty"] = run(lambda: show(td.empty()))
out["empty batch"] = run(lambda: show(td.empty(batch_size=[])))
out["empty recurse batch"] = run(lambda: show(td.empty(recurse=True, batch_size=[])))
out["empty recurse nested"] = run(lambda: show(td.empty(recurse=True)["b"]))
out["empty device"] = run(lambda: show(td.empty(device=None)))
out["empty recurse device"] = run(lambda: show(td.empty(recurse=True, device=None)["b"]))
out["empty names"] = run(lambda: show(td.empty(names=["n"])))
locked = td.clone().lock_()
out["clear locked"] = run(lambda: show(locked.clear_device_()) + [locked.is_locked])
out["clear nested"] = run(lambda: str(td.clone().clear_device_()["b"].device))
out["clear then write"] = run(
    lambda: str(td.clone().clear_device_().set("m", torch.zeros(3, device="meta"))["m"].device)
)
out["auto"] = run(lambda: str(TensorDict(a=torch.zeros(3), batch_size=[3]).auto_device_().device))
out["auto nested"] = run(
    lambda: str(TensorDict(b={{"c": torch.zeros(3)}}, batch_size=[3]).auto_device_()["b"].device)
)
mixed = TensorDict(a=torch.zeros(3), batch_size=[3])
mixed["m"] = torch.zeros(3, device="meta")
out["auto mixed"] = run(lambda: str(mixed.auto_device_().device))
out["auto none"] = run(lambda: str(TensorDict(batch_size=[3]).auto_device_().device))
print(json.dumps(out))
"""


@pytest.mark.slow  # a tensordict process
def test_empty_and_device_resets_behave_as_in_tensordict():
    done = tensordict_peer.run(PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    assert namespace["out"] == expected


class Point(TensorClass):
    x: torch.Tensor


class FrozenPoint(TensorClass["frozen"]):
    x: torch.Tensor


def test_a_batch_size_that_the_nested_containers_do_not_start_with_is_refused():
    td = TensorDict({"a": torch.zeros(3), "b": {"c": torch.ones(3, 2)}}, [3])
    with pytest.raises(ValueError, match=r"cannot set batch size \[4\].*'b'"):
        td.empty(recurse=True, batch_size=[4])


def test_a_tensorclass_gets_the_same_methods():
    p = Point(x=torch.zeros(3, 2), batch_size=[3], device="cpu")
    assert p.clear_device_() is p and p.device is None
    assert p.auto_device_().device == torch.device("cpu")
    empty = p.empty(batch_size=[])
    assert type(empty) is Point and empty.batch_size == torch.Size([])


def test_a_frozen_tensorclass_refuses_device_resets():
    p = FrozenPoint(x=torch.zeros(3), batch_size=[3], device="cpu")
    for method in ("clear_device_", "auto_device_"):
        with pytest.raises(dataclasses.FrozenInstanceError, match=method):
            getattr(p, method)()
    assert p.device == torch.device("cpu")
