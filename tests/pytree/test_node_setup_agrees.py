"""The flatten walk's paths build the same node contexts.

A level of plain tensors takes a short path, a level of ``in_dims`` values another,
everything else the general walk; all three end in one setup (``_built`` in
``tdfunc/_pytree/node.py``). The general walk is forced here by reporting that dynamo
traces (the short path is skipped there), and every field of each context is compared
with the short path's and with ``NodeContext(...)`` built by ``flatten_shallow``.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict
from tdfunc._pytree import node

FIELDS = node.NodeContext.__slots__


def _corpus() -> dict:
    return {
        "empty": TensorDict({}, []),
        "one leaf": TensorDict({"a": torch.zeros(3)}, []),
        "batched": TensorDict({"a": torch.zeros(4, 3), "b": torch.ones(4)}, [4]),
        "two dims, named": TensorDict({"a": torch.zeros(2, 3, 5)}, [2, 3], names=["x", "y"]),
        "a parameter": TensorDict({"w": torch.nn.Parameter(torch.zeros(2, 2))}, [2]),
        "nested": TensorDict({"a": torch.zeros(4), "b": {"c": torch.zeros(4, 2)}}, [4]),
        "non-tensor": TensorDict({"a": torch.zeros(2), "s": "text"}, [2]),
    }


def _fields(context) -> dict:
    values = {name: getattr(context, name) for name in FIELDS}
    values["nested"] = (
        None if context.nested is None else [c and _fields(c) for c in context.nested]
    )
    return values


def _inline(td, monkeypatch=None, general: bool = False):
    if general:
        monkeypatch.setattr(node, "_dynamo_compiling", lambda: True)
    out: list = []
    context = node._inline(td, type(td), out, None, None)
    if general:
        monkeypatch.undo()
    return out, context


@pytest.mark.parametrize("name", list(_corpus()))
def test_the_short_path_and_the_general_walk_agree(name, monkeypatch):
    td = _corpus()[name]
    leaves, short = _inline(td)
    general_leaves, general = _inline(td, monkeypatch, general=True)
    assert all(a is b for a, b in zip(leaves, general_leaves, strict=True))
    assert _fields(short) == _fields(general)


@pytest.mark.parametrize("name", ["empty", "one leaf", "batched", "two dims, named", "a parameter"])
def test_a_flat_level_matches_the_public_constructor(name):
    td = _corpus()[name]
    _, inlined = _inline(td)
    _, shallow = node.flatten_shallow(td)
    assert _fields(inlined) == _fields(shallow)


def test_an_in_dims_level_matches_the_public_constructor():
    td = TensorDict({"a": torch.zeros(4, 3), "b": torch.ones(4)}, [4])
    dims = TensorDict._new_unsafe({"a": 0, "b": None}, td.batch_size, None, None)
    _, inlined = _inline(dims)
    expected = node.NodeContext(
        TensorDict,
        ("a", "b"),
        (),
        td.batch_size,
        (None, None),
        (False, False),
        None,
        None,
        width=2,
        shapes=(None, None),
    )
    assert _fields(inlined) == _fields(expected)
