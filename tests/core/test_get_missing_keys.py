"""``get`` / ``get_at`` of a key that holds nothing, against tensordict 0.15.3.

As in tensordict, both give ``None`` (or the default given) for a TensorDict and for a
TensorClass; indexing (``td["nope"]``) and attribute access stay errors. (tensordict
refuses every string index on a tensorclass, ``instance["x"]`` included; tdfunc reads
the field, so a missing one is a ``KeyError`` there.)
"""

from __future__ import annotations

import json

import pytest
import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict, tensorclass

PROBE = """
import json, torch
from {lib} import TensorDict, tensorclass

@tensorclass
class Data:
    td: TensorDict
    a: torch.Tensor
    unset: torch.Tensor = None

def show(thunk):
    try:
        value = thunk()
    except Exception as error:
        return "error " + ("KeyError" if isinstance(error, KeyError) else type(error).__name__)
    if isinstance(value, torch.Tensor):
        return "tensor " + str(list(value.shape))
    return repr(value)

td = TensorDict(a=torch.zeros(4, 2), nested=TensorDict(b=torch.ones(4), batch_size=[4]),
                batch_size=[4])
data = Data(td=TensorDict(b=torch.ones(4), batch_size=[4]), a=torch.zeros(4, 2), batch_size=[4])
out = {{}}
for name, obj in (("td", td), ("tc", data)):
    for key in ("a", "nope", ("nested", "nope"), ("td", "nope"), ("nope", "deeper"),
                "unset"):
        label = name + " " + repr(key)
        out[label + " get"] = show(lambda: obj.get(key))
        out[label + " get default"] = show(lambda: obj.get(key, "else"))
        out[label + " get_at"] = show(lambda: obj.get_at(key, 0))
        out[label + " get_at default"] = show(lambda: obj.get_at(key, 0, "else"))
out["td getitem"] = show(lambda: td["nope"])
out["tc attribute"] = show(lambda: data.nope)
print(json.dumps(out))
"""


def test_missing_keys_read_as_tensordict_reads_them():
    done = tensordict_peer.run(PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    got = namespace["out"]
    assert got.keys() == expected.keys()
    assert {k: v for k, v in got.items() if v != expected[k]} == {}


class Pair(TensorClass):
    x: torch.Tensor
    label: str = None


def test_a_tensorclass_get_of_a_missing_name_is_none_or_the_default():
    pair = Pair(x=torch.arange(3.0), batch_size=[3])
    assert pair.get("nope") is None
    assert pair.get("nope", 3) == 3
    assert pair.get("label") is None  # an unset field reads None, as the attribute
    assert pair.get_at("nope", 0) is None
    assert pair.get_at("nope", 0, "else") == "else"
    assert pair.get_at("x", 1).item() == 1.0
    with pytest.raises(AttributeError):
        pair.nope
    with pytest.raises(KeyError, match="nope"):
        pair["nope"]


def test_a_decorated_class_and_a_tensordict_agree():
    @tensorclass
    class Holder:
        inner: TensorDict

    holder = Holder(inner=TensorDict(a=torch.zeros(2), batch_size=[2]), batch_size=[2])
    plain = TensorDict(inner=TensorDict(a=torch.zeros(2), batch_size=[2]), batch_size=[2])
    for key in ("nope", ("inner", "nope"), ("nope", "x")):
        assert holder.get(key) is None and plain.get(key) is None
        assert holder.get_at(key, 0) is None and plain.get_at(key, 0) is None
