"""``values()`` and ``items()`` can be read twice where tensordict's can.

The top level is a view of the container's dict, as ``dict.values()`` / ``dict.items()``
(a ``len``, iterated again, live); a sorted walk and the nested leaves' items are
sequences; the other nested walks are generators. Compared with tensordict, run in its
own process, and with a plain dict.
"""

from __future__ import annotations

import json

import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict

CALLS = [
    "values()",
    "items()",
    "values(True)",
    "values(True, True)",
    "values(False, True)",
    "values(sort=True)",
    "items(True)",
    "items(True, True)",
    "items(False, True)",
    "items(sort=True)",
    "values(is_leaf=lambda cls: True)",
    "items(is_leaf=lambda cls: True)",
]
PROBE = """
import json, torch
from {lib} import TensorDict
td = TensorDict({{"a": torch.zeros(2), "n": {{"b": torch.zeros(2)}}, "s": "x"}}, [2])
out = []
for call in {calls!r}:
    result = eval("td." + call)
    first, second = len(list(result)), len(list(result))
    out.append([call, type(result).__name__, first, second])
print(json.dumps(out))
"""


def test_the_kinds_and_counts_are_tensordicts():
    done = tensordict_peer.run(PROBE.format(lib="tensordict", calls=CALLS))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc", calls=CALLS).replace("print(json.dumps(out))", ""), namespace)
    assert namespace["out"] == expected


def test_the_top_level_reads_as_a_dict_does():
    plain = {"a": torch.zeros(2), "b": torch.ones(2)}
    td = TensorDict(plain, [2])
    values, items = td.values(), td.items()
    assert len(values) == len(plain.values()) and len(items) == len(plain.items())
    for _ in range(2):  # read twice: the same entries, in the same order
        assert [v.sum().item() for v in values] == [v.sum().item() for v in plain.values()]
        assert [k for k, _ in items] == list(plain)
    td["c"] = torch.full((2,), 2.0)  # a live view, as a dict's
    assert len(values) == 3 and [k for k, _ in items][-1] == "c"
    assert td.values(sort=True)[0] is td["a"]


def test_a_tensorclass_and_a_locked_container_give_the_same_views():
    class Pair(TensorClass):
        x: torch.Tensor
        label: str

    pair = Pair(x=torch.zeros(2), label="cat", batch_size=[2])
    assert len(pair.values()) == 2 and len(pair.items()) == 2
    assert [k for k, _ in pair.items()] == [k for k, _ in pair.items()] == list(pair.keys())
    locked = TensorDict(a=torch.zeros(2), batch_size=[2]).lock_()
    assert len(locked.values()) == 1 and list(locked.values()) == list(locked.values())
