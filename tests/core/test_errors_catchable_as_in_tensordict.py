"""Errors of shape ops, in-place writes and joins raise what tensordict's users catch.

tensordict raises torch's ``RuntimeError`` for a view, reshape, expand, split, cat or
stack the batch cannot take, for some dims out of range, for an in-place write of a
value that does not fit its entry or a TensorClass field value that does not start with
the batch size, and for joining containers or modules of different structures. tdfunc's
errors there are ``ValueError``s (a bad argument; ``KeyError`` / ``TypeError`` for a
structure) that are also that ``RuntimeError``, so an ``except`` written for either
library catches them. Checked against the same call on a plain tensor (torch's class)
and against tensordict itself, run in its own process.
"""

from __future__ import annotations

import json

import pytest
import tensordict_peer
import torch

# (call on a container ``td`` of batch [3, 4] or ``flat`` of batch [12], the same call on
# a tensor ``t`` of shape [3, 4] or ``u`` of shape [12])
CASES = [
    ("flat.view(5, 2)", "u.view(5, 2)"),
    ("td.reshape(5, -1)", "t.reshape(5, -1)"),
    ("td.expand(2, 4)", "t.expand(2, 4)"),
    ("td.expand(-1, 3, 4)", "t.expand(-1, 3, 4)"),
    ("td.split([1, 1], 0)", None),  # a tensor's split ignores the last sizes' sum only at dim 0
    ("torch.cat([td, td[:2]], dim=1)", "torch.cat([t, t[:2]], dim=1)"),
    ("torch.stack([td, td[:2]], 0)", "torch.stack([t, t[:2]], 0)"),
    ("td.unsqueeze(3)", None),
    ("td.unsqueeze(-4)", None),
    ("torch.cat([td, td], dim=2)", None),
    ("td.gather(dim=2, index=torch.zeros(3, 4, dtype=torch.long))", None),
    ("flat.view(torch.int32)", None),
    ("td.view(-1, -1)", "t.view(-1, -1)"),
    ("td.reshape(-2, -6)", "t.reshape(-2, -6)"),
    # a mask that is not a leading part of the batch size
    (
        "td.masked_fill(torch.ones(3, 3, dtype=torch.bool), 1.0)",
        "t.masked_fill(torch.ones(3, 3, dtype=torch.bool), 1.0)",
    ),
    (
        "td.masked_fill_(torch.ones(3, 3, dtype=torch.bool), 1.0)",
        "t.masked_fill_(torch.ones(3, 3, dtype=torch.bool), 1.0)",
    ),
    (
        "td.where(torch.ones(3, 3, dtype=torch.bool), 0.0)",
        "t.where(torch.ones(3, 3, dtype=torch.bool), 0.0)",
    ),
    (
        "td.masked_select(torch.ones(3, 3, dtype=torch.bool))",
        "t[torch.ones(3, 3, dtype=torch.bool)]",
    ),
    # in-place writes of a value that does not fit the entry (``w``: batch [5], an
    # entry [5, 2, 2]; ``x``: that entry as a tensor)
    ("w.__setitem__(0, TensorDict(images=torch.ones(3, 2)))", "x.__setitem__(0, torch.ones(3, 2))"),
    (
        "w.__setitem__(slice(0, 2), TensorDict(images=torch.ones(2, 3, 2), batch_size=[2]))",
        "x.__setitem__(slice(0, 2), torch.ones(2, 3, 2))",
    ),
    ('w.set_at_("images", torch.ones(3, 2), 0)', "x.__setitem__(0, torch.ones(3, 2))"),
    ('w.update_at_({"images": torch.ones(3, 2)}, 0)', None),
    ('w.set_("images", torch.ones(5, 3, 2))', "x.copy_(torch.ones(5, 3, 2))"),
    ('w.set("images", torch.ones(5, 3, 2), inplace=True)', None),
    ("w.update_(TensorDict(images=torch.ones(5, 3, 2), batch_size=[5]))", None),
    # containers or modules of different structures
    ('torch.stack([td, td.exclude("b")], 0)', None),
    ('torch.cat([td, td.exclude("b")], 0)', None),
    ("TensorDict.from_modules(seq, lin)", "torch.func.stack_module_state([seq, lin])"),
    # a TensorClass field whose value does not start with the batch size
    ('setattr(pair, "images", torch.ones(3, 2))', None),
    ("Pair(images=torch.zeros(4, 2), targets=torch.arange(3), batch_size=[4])", None),
    ("Pair(images=torch.zeros(4, 2), targets=td, batch_size=[4])", None),
]
SETUP = """
import json, torch
from {lib} import TensorClass, TensorDict
class Pair(TensorClass):
    images: torch.Tensor
    targets: torch.Tensor
pair = Pair(images=torch.zeros(4, 2), targets=torch.arange(4), batch_size=[4])
td = TensorDict({{"a": torch.zeros(3, 4), "b": torch.zeros(3, 4, 5)}}, [3, 4])
flat = TensorDict({{"a": torch.arange(12)}}, [12])
w = TensorDict({{"images": torch.zeros(5, 2, 2)}}, [5])
seq, lin = torch.nn.Sequential(torch.nn.Linear(3, 4)), torch.nn.Linear(3, 4)
"""
PROBE = (
    SETUP
    + """
out = []
for call in {calls!r}:
    try:
        eval(call)
        out.append(None)
    except Exception as error:
        out.append([cls.__name__ for cls in type(error).__mro__])
print(json.dumps(out))
"""
)


def _raised(call: str, namespace: dict) -> BaseException | None:
    try:
        eval(call, namespace)
    except Exception as error:  # the class is what is checked
        return error
    return None


def _namespace() -> dict:
    namespace: dict = {}
    exec(SETUP.format(lib="tdfunc"), namespace)
    namespace.update(t=torch.zeros(3, 4), u=torch.arange(12), x=torch.zeros(5, 2, 2))
    return namespace


@pytest.mark.parametrize(("call", "on_tensor"), [c for c in CASES if c[1]])
def test_the_class_torch_raises_for_a_tensor_catches_it(call, on_tensor):
    namespace = _namespace()
    expected = _raised(on_tensor, namespace)
    assert expected is not None
    got = _raised(call, namespace)
    assert isinstance(got, type(expected)), (call, type(got), type(expected))
    assert isinstance(got, (ValueError, KeyError, TypeError))  # and stays what it was
    api = call.split("(")[0].rpartition(".")[2]
    assert api + ":" in str(got) or api + " " in str(got)  # names the API


def test_the_class_tensordict_raises_catches_it():
    calls = [call for call, _ in CASES]
    done = tensordict_peer.run(PROBE.format(lib="tensordict", calls=calls))
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    namespace = _namespace()
    for call, raised in zip(calls, expected, strict=True):
        assert raised is not None, f"tensordict runs {call}: this case no longer tests an error"
        got = _raised(call, namespace)
        assert got is not None, call
        # tensordict's own private classes cannot be caught by name: its public bases can
        public = [name for name in raised if not name.startswith("_")]
        caught_as = [cls.__name__ for cls in type(got).__mro__]
        assert all(name in caught_as for name in public[:2]), (call, raised, type(got))
