"""A list (or tuple, or nested list) of tensors of one shape is stored as their stack.

tensordict stacks such a list when it is written (constructor, ``set``, ``td[key] =``,
a TensorClass field): a batch of tensors given one per element is a tensor, not a
``NonTensorStack`` of tensors that no tensor operation reaches. Lists of other things
keep their rules. Compared with tensordict 0.15.3 in its own process, and with
``torch.stack``.
"""

from __future__ import annotations

import json

import pytest
import tensordict_peer
import torch

from tdfunc import TensorClass, TensorDict

PROBE = """
import json, torch
from {lib} import TensorDict

def show(thunk):
    try:
        v = thunk()
    except Exception as error:
        return "error"
    out = [type(v).__name__]
    if isinstance(v, torch.Tensor):
        out += [list(v.shape), str(v.dtype), v.requires_grad, v.flatten().tolist()]
    return out

t = lambda *s, **k: torch.arange(float(torch.Size(s).numel()), **k).view(*s)
cases = {{
    "tensors": ([t(3), t(3) + 1], [2]),
    "tuple": ((t(3), t(3) * 2), [2]),
    "nested": ([[t(3), t(3)], [t(3) + 1, t(3) - 1]], [2, 2]),
    "nested, one batch dim": ([[t(3), t(3)], [t(3), t(3)]], [2]),
    "dtypes promoted": ([t(3), torch.ones(3, dtype=torch.int64)], [2]),
    "no batch dims": ([t(3), t(3)], []),
    "0-d tensors": ([torch.tensor(1.0), torch.tensor(2.0)], [2]),
    "requires grad": ([t(3).requires_grad_(), t(3)], [2]),
    "batch mismatch": ([t(3), t(3)], [3]),
    "uneven shapes": ([t(3), t(2)], [2]),
    "strings": (["a", "b"], [2]),
    "0-d tensor and float": ([torch.tensor(1.0), 2.0], [2]),
    "float and 0-d tensor": ([2.0, torch.tensor(1.0)], [2]),
    "0-d tensor and int": ([torch.tensor(1), 2], [2]),
    "nested, tensors and floats": ([[torch.tensor(1.0), 2.0], [3.0, torch.tensor(4.0)]], [2, 2]),
    "tensor and string": ([torch.tensor(1.0), "a"], [2]),
    "numbers": ([1, 2], [2]),
}}
out = {{}}
for name, (value, batch) in cases.items():
    out[name + " init"] = show(lambda: TensorDict(b=value, batch_size=batch).get("b"))
    def setitem():
        td = TensorDict(batch_size=batch)
        td["b"] = value
        return td.get("b")
    out[name + " setitem"] = show(setitem)
print(json.dumps(out))
"""


def test_lists_are_stored_as_tensordict_stores_them():
    done = tensordict_peer.run(PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    got = namespace["out"]
    assert got.keys() == expected.keys()
    assert {k: v for k, v in got.items() if v != expected[k]} == {}


@pytest.mark.parametrize("write", ["init", "set", "setitem", "tensorclass"])
def test_the_stack_equals_torch_stack_and_keeps_the_graph(write):
    x = torch.randn(3, requires_grad=True)
    parts = [x * 2, torch.zeros(3)]
    if write == "tensorclass":

        class Row(TensorClass):
            b: torch.Tensor

        stored = Row(b=parts, batch_size=[2]).b
    else:
        td = TensorDict(b=parts, batch_size=[2]) if write == "init" else TensorDict(batch_size=[2])
        if write == "set":
            td.set("b", parts)
        elif write == "setitem":
            td["b"] = parts
        stored = td["b"]
    assert type(stored) is torch.Tensor
    torch.testing.assert_close(stored, torch.stack(parts))
    stored.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_a_list_of_nested_tensors_stays_a_list_of_values():
    """torch cannot stack nested tensors along a new dim (tensordict raises torch's
    error): the list keeps the rule it had, one value per element."""
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.ones(3)], layout=torch.jagged)
    td = TensorDict(b=[nested, nested], batch_size=[2])
    assert type(td.get("b")).__name__ == "NonTensorStack"
    assert td["b"][1] is nested


def test_tensors_mixed_with_numbers_are_one_value_per_element():
    # torch.as_tensor would turn [tensor(1.), 2.0] into one tensor; tensordict keeps the values
    td = TensorDict(b=[torch.tensor(1.0), 2.0], batch_size=[2])
    assert type(td.get("b")).__name__ == "NonTensorStack"
    assert td["b"].tolist() == [torch.tensor(1.0), 2.0]
    td["c"] = [[torch.tensor(1.0), 2.0], [3.0, 4.0]]
    assert td.get("c").batch_size == torch.Size([2]) and td["c"][1] == [3.0, 4.0]
    assert type(TensorDict(b=[1.0, 2.0], batch_size=[2])["b"]) is torch.Tensor  # numbers alone


def test_the_list_read_from_a_stack_gives_plain_lists():
    td = TensorDict(batch_size=[2, 2])
    td["names"] = [["a", "b"], ["c", "d"]]
    values = td["names"]
    values[0][0] = "z"
    plain = values.tolist()
    assert plain == [["z", "b"], ["c", "d"]] and type(plain) is list
    assert all(type(row) is list for row in plain)
    plain[1][1] = "y"  # a copy: the stack keeps its value
    assert td["names"][1][1] == "d"


def test_the_mixed_rule_is_for_lists():
    # a tuple of a 0-d tensor and a number is still one tensor (tensordict makes one too)
    td = TensorDict(b=(torch.tensor(1.0), 2.0), batch_size=[2])
    assert type(td["b"]) is torch.Tensor and td["b"].tolist() == [1.0, 2.0]


def test_a_list_that_holds_itself_is_kept_as_one_value():
    # the check for tensors inside a list walks it with its own stack and must not
    # loop on a list that contains itself
    value: list = [1.0]
    value.append(value)
    td = TensorDict({"v": value})
    assert td.get("v").data is value
