"""TensorDict as a pytree node of ``torch.utils._pytree`` and optree (``tdfunc/_pytree/``).

References are computed without tdfunc: the plain nested dicts the corpus is
built from (``corpus.plain_leaves``), torch's own pytree on those dicts, and
shapes written out by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import optree
import pytest
import torch
import torch.utils._pytree as pytree
from corpus import CORPUS, RAW, assert_same_leaves, plain_leaves
from torch.func import grad, jacrev, vmap

from tdfunc import NonTensorStack, TensorClass, TensorDict
from tdfunc._pytree.node import NAMESPACE, NodeContext


def _corpus_params():
    return pytest.mark.parametrize("name", list(CORPUS))


def _tensor_leaves_in_order(source: dict) -> list:
    """Tensor leaves of a plain nested dict in insertion order (tdfunc's flatten order)."""
    out = []
    for value in source.values():
        if isinstance(value, dict):
            out += _tensor_leaves_in_order(value)
        elif isinstance(value, torch.Tensor):
            out.append(value)
    return out


def _context_fields(context: NodeContext) -> dict:
    return {name: getattr(context, name) for name in NodeContext.__slots__}


# ---------------------------------------------------------------- registration
@_corpus_params()
def test_flatten_unflatten_roundtrip_over_corpus(name):
    td = CORPUS[name]()
    raw = RAW.get(name)
    leaves, spec = pytree.tree_flatten(td)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert type(rebuilt) is TensorDict
    assert rebuilt.batch_size == td.batch_size
    assert rebuilt.names == td.names
    for key in td.keys(True):
        value = td.get(key)
        if isinstance(value, TensorDict):
            assert rebuilt.get(key).batch_size == value.batch_size, key
    if raw is not None:
        source, _ = raw()
        assert all(
            torch.equal(a, b) for a, b in zip(leaves, _tensor_leaves_in_order(source), strict=True)
        )
        assert_same_leaves(rebuilt, plain_leaves(source))


@_corpus_params()
def test_leaves_are_the_stored_tensors_not_copies(name):
    td = CORPUS[name]()
    leaves = pytree.tree_leaves(td)
    stored = [td.get(k) for k in td.keys(True, True) if isinstance(td.get(k), torch.Tensor)]
    assert len(leaves) == len(stored)
    assert all(a is b for a, b in zip(leaves, stored))


def test_key_paths_match_nested_keys():
    source, batch = RAW["nested_2d"]()
    td = TensorDict(source, batch)
    paths = [tuple(k.key for k in path) for path, _ in pytree.tree_flatten_with_path(td)[0]]
    assert paths == list(plain_leaves(source))
    assert pytree.keystr(pytree.tree_flatten_with_path(td)[0][1][0]) == "['b']['c']"


def test_torch_pytree_sees_one_node_per_tree_optree_one_per_level():
    source, batch = RAW["nested_2d"]()
    td = TensorDict(source, batch)
    leaves, spec = pytree.tree_flatten(td)
    reference = pytree.tree_structure(source)  # plain dicts: one node per level
    assert spec.num_leaves == reference.num_leaves == len(leaves)
    assert spec.num_nodes == 1 + spec.num_leaves  # nested levels live in the context
    assert reference.num_nodes > spec.num_nodes
    # key paths and optree still see every level
    optree_spec = optree.tree_structure(td, namespace=NAMESPACE)
    assert optree_spec.num_nodes == optree.tree_structure(source).num_nodes
    assert len(optree.tree_paths(td, namespace=NAMESPACE)[1]) == 2  # ('b', 'c')


def test_containers_without_leaves_ride_in_the_spec():
    td = TensorDict({"x": torch.randn(3, 2), "empty": {}, "tagged": {"s": "t", "deeper": {}}}, [3])
    leaves, spec = pytree.tree_flatten(td)
    assert len(leaves) == 1 and spec.num_nodes == 2
    for rebuilt in (
        pytree.tree_unflatten([leaves[0] * 2], spec),
        pytree.tree_unflatten(leaves, pytree.treespec_loads(pytree.treespec_dumps(spec))),
    ):
        assert set(rebuilt.keys(True)) == set(td.keys(True))
        assert rebuilt["tagged", "s"] == "t"
        assert rebuilt["tagged", "deeper"].batch_size == torch.Size([3])
    out = vmap(lambda t: t)(td)
    assert out["tagged"].batch_size == out["tagged", "deeper"].batch_size == torch.Size([3])


def test_optree_namespace_tree_map_returns_tensordict():
    source, batch = RAW["nested_2d"]()
    td = TensorDict(source, batch)
    out = optree.tree_map(lambda x: x * 2, td, namespace=NAMESPACE)
    assert type(out) is TensorDict and out.batch_size == td.batch_size
    assert_same_leaves(out, {k: v * 2 for k, v in plain_leaves(source).items()})
    # without the namespace optree treats the container as a leaf
    assert optree.tree_leaves(td) == [td]
    assert len(optree.tree_leaves(td, namespace=NAMESPACE)) == 3


def test_optree_and_torch_pytree_agree_on_leaves():
    td = CORPUS["non_tensor"]()
    torch_leaves = pytree.tree_leaves(td)
    optree_leaves = optree.tree_leaves(td, namespace=NAMESPACE)
    assert len(torch_leaves) == len(optree_leaves) == 2
    assert all(a is b for a, b in zip(torch_leaves, optree_leaves))


# ---------------------------------------------------------------- spec equality
def test_spec_equality_is_structural():
    a = TensorDict({"x": torch.zeros(2, 3), "n": {"y": torch.zeros(2)}}, [2])
    b = TensorDict({"x": torch.zeros(5, 7, 1), "n": {"y": torch.zeros(5, 7)}}, [5, 7])
    spec_a, spec_b = pytree.tree_structure(a), pytree.tree_structure(b)
    assert spec_a == spec_b and hash(spec_a.context) == hash(spec_b.context)
    other_keys = TensorDict({"x": torch.zeros(2, 3), "n": {"z": torch.zeros(2)}}, [2])
    assert pytree.tree_structure(other_keys) != spec_a


def test_spec_equality_compares_non_tensor_values():
    def make(tag):
        return TensorDict({"x": torch.zeros(2), "tag": tag}, [2])

    assert pytree.tree_structure(make("a")) == pytree.tree_structure(make("a"))
    assert pytree.tree_structure(make("a")) != pytree.tree_structure(make("b"))
    stacked = torch.stack([make("a"), make("b")])
    assert isinstance(stacked._get_leaf("tag"), NonTensorStack)
    assert pytree.tree_structure(stacked) != pytree.tree_structure(torch.stack([make("a")] * 2))


def test_non_tensor_values_ride_in_the_spec():
    td = CORPUS["non_tensor"]()
    leaves, spec = pytree.tree_flatten(td)
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    rebuilt = pytree.tree_unflatten([leaf + 1 for leaf in leaves], spec)
    assert rebuilt["name"] == "a string!" and rebuilt["meta", "tag"] == "nested"
    assert rebuilt._get_leaf("name").batch_size == torch.Size([3])


def test_non_tensor_stack_keeps_its_class_and_values():
    stacked = torch.stack(
        [TensorDict({"x": torch.zeros(2), "s": text}, [2]) for text in ("a", "b", "c")]
    )
    before = stacked._get_leaf("s")
    assert type(before) is NonTensorStack
    rebuilt = pytree.tree_map(lambda x: x + 1, stacked)
    leaf = rebuilt._get_leaf("s")
    assert type(leaf) is NonTensorStack and leaf.data == before.data
    assert leaf.batch_size == torch.Size([3, 2])


class _Labelled(TensorClass):
    x: torch.Tensor
    label: str
    y: torch.Tensor


def test_non_tensor_entries_keep_their_place_among_the_keys():
    plain = {"a": torch.zeros(3), "s": "text", "b": torch.ones(3, 2)}
    td = TensorDict(
        {**plain, "n": {"c": torch.zeros(3), "t": "x", "d": torch.ones(3)}, "tc": None}, [3]
    )
    td["tc"] = _Labelled(x=torch.zeros(3), label="l", y=torch.ones(3), batch_size=[3])
    expected = list(td.keys(True))
    assert expected.index("s") < expected.index("b")
    leaves, spec = pytree.tree_flatten(td)
    rebuilt = {
        "tree_map": pytree.tree_map(lambda x: x + 1, td),
        "treespec_loads": pytree.tree_unflatten(
            leaves, pytree.treespec_loads(pytree.treespec_dumps(spec))
        ),
        "optree": optree.tree_map(lambda x: x + 1, td, namespace=NAMESPACE),
        "grad": grad(lambda t: sum(leaf.sum() for leaf in pytree.tree_leaves(t)))(td),
        "vmap": vmap(lambda t: t)(td),
    }
    for name, out in rebuilt.items():
        assert list(out.keys(True)) == expected, name
        assert list(out["tc"]._to_tensordict_view().keys()) == ["x", "label", "y"], name
    # the order is part of the structure
    swapped = TensorDict({"s": "text", "a": plain["a"], "b": plain["b"]}, [3])
    assert pytree.tree_structure(swapped) != pytree.tree_structure(TensorDict(plain, [3]))


# ---------------------------------------------------------------- serialisation
def test_treespec_dumps_loads_roundtrip():
    source, batch = RAW["nested_2d"]()
    td = TensorDict(source, batch)
    td["label"] = "text"
    leaves, spec = pytree.tree_flatten(td)
    dumped = pytree.treespec_dumps(spec)
    json.loads(dumped)  # plain JSON
    loaded = pytree.treespec_loads(dumped)
    assert loaded == spec
    rebuilt = pytree.tree_unflatten(leaves, loaded)
    assert rebuilt.batch_size == td.batch_size and rebuilt["label"] == "text"
    assert rebuilt["b", "d"].batch_size == torch.Size([4, 3])
    assert_same_leaves(rebuilt.exclude("label"), plain_leaves(source))


def test_treespec_dumps_rejects_values_json_cannot_hold():
    td = TensorDict({"x": torch.zeros(1), "obj": object()}, [1])
    with pytest.raises(TypeError, match=r"treespec_dumps: the non-tensor value at key 'obj'"):
        pytree.treespec_dumps(pytree.tree_structure(td))


def test_torch_export_accepts_a_tensordict_input():
    class Model(torch.nn.Module):
        def forward(self, td):
            return td["a"] * 2 + td["n", "b"].sum(-1, keepdim=True)

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 3, generator=g), torch.randn(4, 5, generator=g)
    td = TensorDict({"a": a, "n": {"b": b}, "tag": "x"}, [4])
    program = torch.export.export(Model(), (td,))
    expected = a * 2 + b.sum(-1, keepdim=True)
    assert torch.allclose(program.module()(td), expected)
    spec = pytree.treespec_loads(pytree.treespec_dumps(program.call_spec.in_spec))
    assert spec == program.call_spec.in_spec


# ---------------------------------------------------------------- batch size inference
def test_tree_map_reducing_a_batch_dim():
    td = TensorDict({"x": torch.randn(4, 3), "n": {"y": torch.randn(4, 2, 5)}}, [4])
    out = pytree.tree_map(lambda t: t.mean(0), td)
    assert out.batch_size == torch.Size([]) and out["n"].batch_size == torch.Size([])
    assert torch.equal(out["x"], td["x"].mean(0))


def test_tree_map_reducing_an_inner_batch_dim():
    td = TensorDict({"x": torch.randn(4, 6, 3), "y": torch.randn(4, 6)}, [4, 6])
    out = pytree.tree_map(lambda t: t.sum(1), td)
    assert out.batch_size == torch.Size([4])


def test_tree_map_reducing_a_feature_dim_keeps_the_batch():
    td = TensorDict({"x": torch.randn(4, 3), "y": torch.randn(4, 5, 2)}, [4])
    out = pytree.tree_map(lambda t: t.sum(-1), td)
    assert out.batch_size == torch.Size([4])
    assert out["y"].shape == (4, 5)


def test_tree_map_that_makes_leaves_inconsistent_falls_back_to_a_common_prefix():
    # x loses its feature dim, y loses its batch dim: only [] is consistent
    td = TensorDict({"x": torch.randn(4, 3), "y": torch.randn(4)}, [4])
    out = pytree.tree_map(lambda t: t.sum(-1), td)
    assert out.batch_size == torch.Size([])


def test_tree_map_adding_leading_dims():
    td = TensorDict({"x": torch.randn(4, 3), "n": {"y": torch.randn(4)}}, [4])
    out = pytree.tree_map(lambda t: t.expand(2, *t.shape), td)
    assert out.batch_size == torch.Size([2, 4]) and out["n"].batch_size == torch.Size([2, 4])


def test_unflatten_accepts_leaves_that_are_not_tensors():
    td = TensorDict({"x": torch.randn(2, 3), "n": {"y": torch.randn(2)}}, [2])
    leaves, spec = pytree.tree_flatten(td)
    for fill in (0, None, "text"):
        out = pytree.tree_unflatten([fill] * len(leaves), spec)
        assert out._data["x"] is fill or out._data["x"] == fill
        assert out._data["n"]._data["y"] == fill
        assert out.batch_size == td.batch_size
    mixed = pytree.tree_unflatten([None, torch.zeros(2)], spec)
    assert mixed.batch_size == torch.Size([2]) and mixed._data["x"] is None
    mixed = pytree.tree_unflatten([torch.zeros(2, 3), None], spec)
    assert mixed.batch_size == torch.Size([2]) and mixed["n"].batch_size == torch.Size([2])


def test_leafless_nested_container_gets_the_parents_batch_dims():
    td = TensorDict({"x": torch.randn(2, 3, 4), "empty": {}, "tagged": {"s": "t"}}, [2, 3])
    out = vmap(lambda t: t, in_dims=1, out_dims=0)(td)
    assert out.batch_size == torch.Size([3, 2])
    assert out["empty"].batch_size == torch.Size([3, 2])
    assert out["tagged"].batch_size == torch.Size([3, 2])
    assert out["tagged"]._get_leaf("s").batch_size == torch.Size([3, 2])
    # the leafless containers of the input are not modified
    assert td["empty"].batch_size == torch.Size([2, 3])


def test_names_kept_on_the_dims_a_transform_leaves_alone():
    td = CORPUS["named"]()
    assert pytree.tree_map(lambda t: t + 1, td).names == ["env", "time"]
    assert grad(lambda t: t["x"].sum() + t["n", "y"].sum())(td).names == ["env", "time"]
    # vmap removes the mapped dim's name and brings the dim back unnamed (as tensordict)
    seen = []
    out = vmap(lambda t: seen.append(t.names) or t, in_dims=1)(td)
    assert seen == [["env"]] and out.batch_size == torch.Size([3, 2])
    assert out.names == [None, "env"]


def test_context_is_never_mutated():
    td = TensorDict(
        {"x": torch.randn(3, 4), "n": {"y": torch.randn(3)}, "tag": "t", "empty": {}}, [3]
    )
    leaves, spec = pytree.tree_flatten(td)
    contexts = [spec.context] + [child.context for child in spec.children()]
    before = [dict(_context_fields(c)) for c in contexts if isinstance(c, NodeContext)]

    def f(t):
        return (t["x"].sin().sum() + t["n", "y"].pow(2).sum()) * 1.0

    pytree.tree_unflatten(leaves, spec)
    pytree.tree_unflatten([0] * len(leaves), spec)
    vmap(lambda t: t.apply(torch.cos), in_dims=(pytree.tree_unflatten([0] * 2, spec),))(td)
    grad(f)(td)
    jacrev(lambda t: t.apply(torch.sin))(td)
    pytree.tree_map(lambda t: t.sum(0), td)
    after = [dict(_context_fields(c)) for c in contexts if isinstance(c, NodeContext)]
    assert before == after


# ---------------------------------------------------------------- no patching
_SNAPSHOT = textwrap.dedent(
    """
    import inspect, json, sys
    import torch, torch.func, torch.utils._pytree, torch._functorch.vmap
    import torch._functorch.apis, torch._functorch.eager_transforms

    MODULES = [torch._functorch.vmap, torch._functorch.apis,
               torch._functorch.eager_transforms, torch.utils._pytree, torch.func]

    def snapshot():
        out = {}
        for module in MODULES:
            for name, value in vars(module).items():
                if callable(value):
                    out[f"{module.__name__}.{name}"] = id(value)
        for cls in (torch.Tensor, torch.nn.Module, torch.nn.Parameter):
            for name, value in vars(cls).items():
                out[f"{cls.__name__}.{name}"] = id(value)
        return out

    before = snapshot()
    nodes_before = set(torch.utils._pytree.SUPPORTED_NODES)
    import tdfunc
    from tdfunc import TensorClass
    class Point(TensorClass):
        x: torch.Tensor
    after = snapshot()
    added = set(torch.utils._pytree.SUPPORTED_NODES) - nodes_before
    changed = sorted(k for k in before if before[k] != after.get(k))
    new = sorted(k for k in after if k not in before)
    print(json.dumps({"changed": changed, "new": new, "count": len(before),
                      "added": sorted(c.__module__ + "." + c.__qualname__ for c in added)}))
    """
)


@pytest.mark.slow
def test_importing_tdfunc_leaves_torch_functions_untouched():
    result = subprocess.run(
        [sys.executable, "-c", _SNAPSHOT], capture_output=True, text=True, check=True
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["count"] > 200  # the snapshot saw torch's functions
    assert report["changed"] == [] and report["new"] == []
    # the only global change: pytree registrations of tdfunc's own classes
    added = report["added"]
    assert "tdfunc.TensorDict" in added and "__main__.Point" in added
    assert all(name.startswith(("tdfunc.", "__main__.")) for name in added), added


# ---------------------------------------------------------------- TensorClass
class _Params(TensorClass["frozen"]):
    weight: torch.Tensor
    bias: torch.Tensor


def test_frozen_tensorclass_roundtrip_and_spec():
    g = torch.Generator().manual_seed(0)
    p = _Params(
        weight=torch.randn(5, 4, 3, generator=g),
        bias=torch.randn(5, 4, generator=g),
        batch_size=[5],
    )
    leaves, spec = pytree.tree_flatten(p)
    assert [leaf is value for leaf, value in zip(leaves, (p.weight, p.bias))] == [True, True]
    rebuilt = pytree.tree_unflatten([leaf * 2 for leaf in leaves], spec)
    assert type(rebuilt) is _Params and rebuilt.batch_size == torch.Size([5])
    assert torch.equal(rebuilt.weight, p.weight * 2)
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec
    other = _Params(weight=torch.zeros(4, 3), bias=torch.zeros(4), batch_size=[])
    assert pytree.tree_structure(other) == spec  # shapes are not part of the structure
    mapped = optree.tree_map(torch.neg, p, namespace=NAMESPACE)
    assert type(mapped) is _Params and torch.equal(mapped.bias, -p.bias)
    assert vmap(lambda q: q)(p).batch_size == torch.Size([5])
    assert torch.equal(vmap(lambda q: q.weight.sum())(p), p.weight.sum((1, 2)))
