"""``from_dataclass`` against tensordict 0.15.3 (run in its own process).

Lists given to the generated constructor with a batch size (strings become a
non-tensor stack, tensors a stacked tensor), and ``tensor_only`` classes built from a
dataclass or an instance: a mapping field becomes a TensorDict, and a TensorDict given
as a field is kept as it is (the same object, still locked).
"""

from __future__ import annotations

import json

import tensordict_peer

PROBE = """
import dataclasses, json, torch
from collections import UserDict
import {lib} as lib
from_dataclass = getattr(lib, "from_dataclass", None)
if from_dataclass is None:
    from {lib}.tensorclass import from_dataclass
TensorDict = lib.TensorDict

@dataclasses.dataclass
class Row:
    a: int
    b: torch.Tensor
    c: str

out = {{}}
Rows = from_dataclass(Row)
torch.manual_seed(0)
rows = Rows(a=["a string", "another string"], b=[torch.randn(3), torch.zeros(3)], c="shared",
            batch_size=2)
out["lists"] = [list(rows.shape), rows[0].a, rows[1].a, rows[1].c, rows.b.tolist(),
                type(rows.b).__name__]
for from_type in (True, False):
    @dataclasses.dataclass
    class Holder:
        data: TensorDict
    value = UserDict({{"tensor": torch.ones(())}})
    if from_type:
        tc = from_dataclass(Holder, tensor_only=True)(data=value)
    else:
        tc = from_dataclass(Holder(data=value), tensor_only=True)
    out["mapping " + str(from_type)] = [type(tc.data).__name__, tc.data["tensor"].item()]
for nested in (False, True):
    @dataclasses.dataclass
    class Holder:
        data: TensorDict
    value = TensorDict({{"tensor": torch.ones(())}}).lock_()
    tc = from_dataclass(Holder(data=UserDict({{"nested": value}}) if nested else value),
                        tensor_only=True)
    result = tc.data["nested"] if nested else tc.data
    out["kept " + str(nested)] = [result is value, result.is_locked]
print(json.dumps(out))
"""


def test_from_dataclass_as_tensordict():
    done = tensordict_peer.run(PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    assert namespace["out"] == expected
    assert expected["kept True"] == [True, True]  # the behaviour itself, not only agreement
