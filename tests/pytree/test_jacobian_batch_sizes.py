"""Batch sizes of jacobians of containers: ``jacrev`` and ``jacfwd`` agree.

``jacrev`` rebuilds its result with the spec of the function's output;
``jacfwd`` with the spec of its ``vmap`` over the input elements (one more
leading dim, which it then moves behind every leaf). Both must give the same
containers, with leaves equal to ``torch.func`` on plain dicts.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch.func import hessian, jacfwd, jacrev

from tdfunc import TensorClass, TensorDict


class _Point(TensorClass):
    x: torch.Tensor
    y: torch.Tensor


def _flat(tree) -> dict:
    return {
        tuple(getattr(entry, "key", getattr(entry, "idx", None)) for entry in path): leaf
        for path, leaf in pytree.tree_flatten_with_path(tree)[0]
    }


def _batch_sizes(tree, at: tuple = ()) -> dict:
    """``{path: (class name, batch size)}`` of every container in ``tree`` (tuples too)."""
    out = {}
    if isinstance(tree, tuple):
        for index, item in enumerate(tree):
            out.update(_batch_sizes(item, at + (index,)))
    elif hasattr(tree, "_to_tensordict_view"):
        out[at] = (type(tree).__name__, tuple(tree.batch_size))
        for key, value in tree._to_tensordict_view()._data.items():
            out.update(_batch_sizes(value, at + (key,)))
    return out


def _assert_close(result, reference) -> None:
    got, want = _flat(result), _flat(reference)
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape, key
        assert torch.allclose(got[key], want[key], atol=1e-6), key


def _out(x: torch.Tensor) -> dict:
    # batch [3] (x has 3 rows), leaves with different feature shapes
    return {"x": x * 2, "y": x.sum(-1).sin()}


@pytest.mark.parametrize("make", [TensorDict, _Point], ids=["TensorDict", "TensorClass"])
def test_container_output_of_a_tensor_input(make):
    x = torch.randn(3, 2, generator=torch.Generator().manual_seed(0))

    def f(x):
        return make(**_out(x), batch_size=[3])

    results = {}
    for transform in (jacrev, jacfwd):
        out = transform(f)(x)
        _assert_close(out, transform(_out)(x))
        assert type(out) is make
        results[transform] = out.batch_size
    # the output's batch dims: every leaf is output shape + input shape
    assert results[jacrev] == results[jacfwd] == torch.Size([3])


def test_unbatched_container_output_of_a_tensor_input():
    x = torch.randn(3, 2, generator=torch.Generator().manual_seed(1))
    sizes = {
        transform: transform(lambda x: TensorDict(_out(x), []))(x).batch_size
        for transform in (jacrev, jacfwd)
    }
    assert sizes[jacrev] == sizes[jacfwd] == torch.Size([])


def test_argnums_tuple_gives_the_batch_size_of_argnums_int():
    g = torch.Generator().manual_seed(2)
    raw = {"a": torch.randn(2, 3, generator=g), "n": {"b": torch.randn(2, 4, generator=g)}}
    td = TensorDict(raw, [2])

    def f(t):
        return TensorDict({"y": t["a"].sum(-1), "z": t["n"]["b"].cos()}, [2])

    for transform in (jacrev, jacfwd):
        as_int = transform(f)(td)
        as_tuple = transform(f, argnums=(0,))(td)
        assert isinstance(as_tuple["y"], tuple)
        assert as_tuple.batch_size == as_int.batch_size == torch.Size([2])
        assert as_tuple["y"][0].batch_size == as_int["y"].batch_size
        reference = transform(
            lambda d: {"y": d["a"].sum(-1), "z": d["n"]["b"].cos()}, argnums=(0,)
        )(raw)
        _assert_close(as_tuple, reference)


def _sin_times(tree):
    return pytree.tree_map(lambda v: v.sin() * v, tree)


@pytest.mark.parametrize("root_batch", [[], [3]])
def test_nested_blocks_get_the_same_batch_sizes_from_jacrev_and_jacfwd(root_batch):
    # a container that holds only a nested container: each of its levels is the
    # longest prefix its blocks share, whatever spec the transform recorded
    g = torch.Generator().manual_seed(3)
    inner = torch.randn(3, 2, 5, generator=g)
    raw = {"p": {"q": inner}}
    td = TensorDict({"p": TensorDict({"q": inner}, [3, 2])}, root_batch)
    results = {transform: transform(_sin_times)(td) for transform in (jacrev, jacfwd)}
    for transform, out in results.items():
        _assert_close(out, transform(_sin_times)(raw))
    assert _batch_sizes(results[jacrev]) == _batch_sizes(results[jacfwd])
    # the block of output leaf (3, 2, 5): shaped like the input, behind the leaf's shape
    block = results[jacrev]["p", "q"]
    assert block.batch_size == torch.Size([3, 2, 5, *root_batch])
    assert block["p"].batch_size == torch.Size([3, 2, 5, 3, 2])


def test_hessian_of_a_nested_container_matches_plain_dicts():
    g = torch.Generator().manual_seed(4)
    raw = {"p": {"q": torch.randn(2, 3, generator=g)}, "r": torch.randn(4, generator=g)}
    td = TensorDict({"p": TensorDict(raw["p"], []), "r": raw["r"]}, [])

    def loss(tree):
        return (tree["p"]["q"].sin() * tree["r"].sum()).sum()

    _assert_close(hessian(loss)(td), hessian(loss)(raw))
