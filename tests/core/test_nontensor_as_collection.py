"""Non-tensor leaves count as tensor collections without entries, as in tensordict.

Code written for tensordict walks a container level by level: it steps into every
value for which ``is_tensor_collection`` holds and takes the others for tensors. A
non-tensor leaf must therefore be a collection there (with no keys), or the walk
calls tensor methods on it. Compared with tensordict 0.15.3 in its own process.
"""

from __future__ import annotations

import json

import tensordict_peer
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorDict, is_tensor_collection, tensorclass

PROBE = """
import json, torch
from {lib} import NonTensorData, NonTensorStack, TensorDict, is_tensor_collection, tensorclass

@tensorclass
class Labelled:
    x: torch.Tensor
    label: str

def walk(td):
    for value in td.values():
        if is_tensor_collection(value):
            yield from walk(value)
        else:
            yield value

def build():
    torch.manual_seed(0)
    td = TensorDict(a=torch.randn(3, 2), b=torch.randn(3), batch_size=[3])
    td["text"] = "some text"
    td["stack"] = NonTensorStack("x", "y", "z")
    td["tc"] = Labelled(x=torch.randn(3, 4), label="z", batch_size=[3])
    return td

out = {{}}
leaves = {{"data": NonTensorData("a", batch_size=[2]), "stack": NonTensorStack("a", "b")}}
for name, obj in leaves.items():
    out[name] = [is_tensor_collection(obj), is_tensor_collection(type(obj)),
                 list(obj.keys()), list(obj.values()), list(obj.items())]
td = build()
out["walk"] = [[type(v).__name__, list(v.shape)] for v in walk(td)]
out["keys"] = sorted(map(str, td.keys(True, True)))
target = torch.stack([build(), build()], 0).clone().zero_()
before = {{v.data_ptr() for v in walk(target)}}
stacked = torch.stack([build(), build()], 0, out=target)
out["same storage"] = before == {{v.data_ptr() for v in walk(target)}}
out["written"] = [bool((stacked[k] == target[k]).all()) for k in ("a", "b")]
print(json.dumps(out))
"""


def test_walking_a_container_with_non_tensor_leaves_as_tensordict():
    done = tensordict_peer.run(PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    assert namespace["out"] == expected


def test_a_non_tensor_leaf_is_a_collection_without_entries():
    for leaf in (NonTensorData("a", batch_size=[2]), NonTensorStack("a", "b")):
        assert is_tensor_collection(leaf) and is_tensor_collection(type(leaf))
        assert list(leaf.keys(True, True)) == list(leaf.values()) == list(leaf.items()) == []
    assert not is_tensor_collection(torch.zeros(2)) and not is_tensor_collection("a")


def test_the_container_still_holds_them_as_leaves():
    @tensorclass
    class Labelled:
        x: torch.Tensor
        label: str

    td = TensorDict(a=torch.zeros(2), text="t", batch_size=[2])
    td["tc"] = Labelled(x=torch.ones(2), label="l", batch_size=[2])
    # the leaves of a walk are those of items(include_nested, leaves_only, is_leaf=...)
    assert sorted(map(str, td.keys(True, True))) == ["('tc', 'x')", "a"]
    assert td["text"] == "t" and td["tc"].label == "l"
    assert torch.equal(td.apply(lambda x: x + 1)["a"], torch.ones(2))
    assert td.apply(lambda x: x + 1)["text"] == "t"


def test_non_tensor_leaves_carry_the_container_dim_names():
    """As tensordict's do: a walk that reads ``names`` of every collection finds the
    container's names on the leaves too (constructor, setter on a locked container, a
    new entry, a clone)."""
    td = TensorDict(
        a=torch.zeros(2, 3), s="x", st=[["p"] * 3, ["q"] * 3], batch_size=[2, 3], names=["n", "m"]
    )
    assert td.get("s").names == td.get("st").names == ["n", "m"]
    td["u"] = "z"
    assert td.get("u").names == ["n", "m"]
    assert td.clone().get("st").names == ["n", "m"]
    td.lock_()
    td.names = ["0", "-1"]
    for value in td.values(True):
        if is_tensor_collection(value):
            assert value.names == ["0", "-1"]
    assert td["s"] == "x" and td["st"] == [["p"] * 3, ["q"] * 3]


def test_renaming_replaces_the_leaf_and_leaves_a_shared_one_alone():
    leaf = NonTensorData("x", batch_size=[2])
    first = TensorDict(s=leaf, batch_size=[2])
    second = TensorDict(s=leaf, batch_size=[2])
    first.names = ["n"]
    assert first.get("s").names == ["n"]
    assert second.get("s").names == [None] and leaf.names == [None]
