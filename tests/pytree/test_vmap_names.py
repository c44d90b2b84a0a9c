"""Dim names through ``vmap`` and other transforms: the dims that are not mapped keep theirs.

The expected names are those tensordict gives (its ``test_vmap_names``): the
mapped dim leaves the names inside the function and comes back unnamed.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch.func import jacrev, vmap

from tdfunc import TensorDict


def _add(a, b):
    b["c"] = a["a"] + b["b"]
    return b


def test_vmap_keeps_the_names_of_the_dims_it_does_not_map():
    seen = []

    def fun(a, b):
        seen.append((list(a.names), list(b.names)))
        return _add(a, b)

    a = TensorDict({"a": torch.randn(3, 4)}, [3], names=["0"])
    b = TensorDict({"b": torch.randn(3, 5, 4)}, [3, 5], names=["A", "B"])
    c = vmap(fun, (None, 1))(a, b)
    assert c.names == [None, "A"] and c.batch_size == torch.Size([5, 3])
    assert seen[-1] == (["0"], ["A"])
    assert torch.equal(c["c"], (a["a"] + b["b"].transpose(0, 1)))

    a = TensorDict({"a": torch.randn(5, 4)}, [5], names=["0"])
    c = vmap(fun, (None, 0))(a, b)
    assert c.names == [None, "B"]
    assert seen[-1] == (["0"], ["B"])


def test_mapped_dim_is_read_from_the_leaves_when_sizes_are_equal():
    td = TensorDict({"x": torch.randn(3, 3, 2)}, [3, 3], names=["row", "col"])
    inside: list = []

    def names(t):
        inside.append(list(t.names))
        return t["x"].sum()

    vmap(names, (0,))(td)
    vmap(names, (1,))(td)
    assert inside == [["col"], ["row"]]


def test_nested_vmap_keeps_the_remaining_name():
    td = TensorDict({"x": torch.randn(2, 3, 4, 5)}, [2, 3, 4], names=["a", "b", "c"])
    inside = []

    def inner(t):
        inside.append(list(t.names))
        return t

    out = vmap(vmap(inner, (1,)), (0,))(td)
    assert inside == [["b"]]  # the outer vmap maps "a", the inner one "c"
    assert out.batch_size == torch.Size([2, 4, 3])
    assert out.names == [None, None, "b"]
    assert torch.equal(out["x"], td["x"].transpose(1, 2))


def test_tree_map_that_removes_a_batch_dim_keeps_the_other_names():
    td = TensorDict({"x": torch.randn(3, 4, 2), "y": torch.randn(3, 4)}, [3, 4], names=["a", "b"])
    out = pytree.tree_map(lambda t: t.sum(0), td)
    assert out.batch_size == torch.Size([4]) and out.names == ["b"]
    assert torch.equal(out["y"], td["y"].sum(0))


def test_ambiguous_placement_drops_the_names():
    # the output dim could be either of two equal-sized dims: no guess
    td = TensorDict({"x": torch.randn(3, 3)}, [3, 3], names=["a", "b"])
    out = vmap(lambda t: t, (0,), 1)(td)
    assert out.batch_size == torch.Size([3, 3]) and out.names == [None, None]


def test_jacobian_blocks_keep_the_input_names():
    td = TensorDict({"x": torch.randn(3)}, [3], names=["a"])
    out = jacrev(lambda t: t["x"].sin().sum(0, keepdim=True).expand(2))(td)
    assert out.batch_size == torch.Size([2, 3]) and out.names == [None, "a"]


def test_vmap_in_chunks_keeps_the_names_of_the_dims_it_does_not_map():
    # the chunks (of 1 and 2 members) come back concatenated: the mapped dim grows
    # back to 5, the dims that were not mapped keep their names
    td = TensorDict({"x": torch.randn(5, 3, 4), "n": {"y": torch.randn(5, 3)}}, [5, 3])
    td.names = ["a", "b"]
    for chunk_size in (1, 2):
        out = vmap(lambda t: t.apply(torch.sin), 0, 1, chunk_size=chunk_size)(td)
        assert out.batch_size == torch.Size([3, 5]) and out.names == ["b", None]
        assert out["n"].names == ["b", None]
        assert torch.equal(out["x"], td["x"].sin().transpose(0, 1))
