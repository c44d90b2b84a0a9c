"""Unflatten of leaves that kept their recorded shapes, and the cached optree contexts.

Unflatten recognises leaves that all have their recorded shapes with one comparison
and rebuilds every level with its recorded batch size (``_unchanged`` and
``_as_recorded`` in ``tdfunc/_pytree/rebuild.py``), without the inference. These
tests compare that path with its general twin, the inference's path (``_rebuild``,
``_rebuild_general``), over a corpus, and check that the optree contexts reused
between flattens (``flatten_shallow``) are never stale.
"""

from __future__ import annotations

import optree
import pytest
import torch
import torch.utils._pytree as torch_pytree

from tdfunc import TensorClass, TensorDict
from tdfunc._pytree import node, rebuild


class Pair(TensorClass):
    x: torch.Tensor
    label: str


class Frozen(TensorClass["frozen"]):
    w: torch.Tensor


def _corpus() -> dict:
    leafless = TensorDict({}, [3, 2])
    leafless["tag"] = "empty"
    reordered = TensorDict({"s": "first", "a": torch.zeros(2, 3)}, [2])
    return {
        "one leaf": TensorDict({"a": torch.zeros(3)}, []),
        "batched": TensorDict({"a": torch.zeros(4, 3), "b": torch.ones(4)}, [4]),
        "named": TensorDict({"a": torch.zeros(2, 3, 5)}, [2, 3], names=["x", "y"]),
        "device": TensorDict({"a": torch.zeros(2, 3)}, [2], device="cpu"),
        "parameter": TensorDict({"w": torch.nn.Parameter(torch.zeros(2, 2))}, [2]),
        "nested": TensorDict(
            {"a": torch.zeros(4), "b": {"c": torch.zeros(4, 2), "d": {"e": torch.ones(4, 1)}}},
            [4],
        ),
        "nested on a device": TensorDict(
            {"n": TensorDict({"a": torch.zeros(3)}, [3]), "b": torch.ones(3, 2)},
            [3],
            device="cpu",
        ),
        "non-tensor": TensorDict({"a": torch.zeros(2), "s": "text"}, [2]),
        "non-tensor first": reordered,
        "leafless nested": TensorDict({"a": torch.zeros(3, 2, 4), "l": leafless}, [3]),
        "tensorclass": Pair(x=torch.zeros(5, 2), label="p", batch_size=[5]),
        "frozen tensorclass": Frozen(w=torch.ones(2, 2), batch_size=[2]),
        "tensorclass in a TensorDict": TensorDict(
            {"p": Pair(x=torch.zeros(2, 3), label="q", batch_size=[2]), "y": torch.ones(2)},
            [2],
        ),
        "locked": TensorDict({"a": torch.zeros(2)}, [2]).lock_(),
        "100 leaves": TensorDict({f"k{i}": torch.zeros(3, i % 3) for i in range(100)}, [3]),
        "300 leaves (compared one by one)": TensorDict(
            {f"k{i}": torch.zeros(2) for i in range(300)}, []
        ),
    }


CORPUS = list(_corpus())


def _same(left, right, lock: bool = True) -> None:
    """Equal class, keys in order, batch size, names, device (and lock state, unless
    ``lock`` is false); the same tensor objects."""
    assert type(left) is type(right)
    if isinstance(left, torch.Tensor):
        assert left is right
        return
    assert left.batch_size == right.batch_size
    assert left.names == right.names
    assert left.device == right.device
    if lock:
        assert left.is_locked == right.is_locked
    left_view, right_view = left._to_tensordict_view(), right._to_tensordict_view()
    assert list(left_view._data) == list(right_view._data)
    for key, value in left_view._data.items():
        other = right_view._data[key]
        if isinstance(value, torch.Tensor) or hasattr(value, "_to_tensordict_view"):
            if type(value).__name__ in ("NonTensorData", "NonTensorStack"):
                assert type(value) is type(other) and value.data == other.data
                assert value.batch_size == other.batch_size
            else:
                _same(value, other, lock)
        else:
            assert value == other


@pytest.mark.parametrize("name", CORPUS)
def test_unchanged_leaves_rebuild_as_the_inference_does(name):
    container = _corpus()[name]
    leaves, spec = torch_pytree.tree_flatten(container)
    fast = torch_pytree.tree_unflatten(leaves, spec)
    # the general twin: the inference's path, level by level
    general = rebuild._rebuild(list(leaves), 0, spec.context, False, False)[0]
    _same(fast, general)
    _same(fast, container, lock=False)  # a rebuilt container is not locked


@pytest.mark.parametrize("name", CORPUS)
def test_optree_levels_rebuild_as_the_inference_does(name):
    container = _corpus()[name]
    for _ in range(2):  # the second flatten reuses the cached contexts
        leaves, spec = optree.tree_flatten(container, namespace="tdfunc")
        fast = optree.tree_unflatten(spec, leaves)
        children, context = node.flatten_shallow(container)
        general = rebuild._rebuild_general(children, context, False, None, None, ())[0]
        _same(rebuild.unflatten(children, context), general)
        _same(fast, container, lock=False)


def test_unflatten_of_other_shapes_still_infers():
    td = TensorDict({"a": torch.zeros(3, 2), "b": torch.zeros(3)}, [3])
    leaves, spec = torch_pytree.tree_flatten(td)
    stacked = torch_pytree.tree_unflatten([torch.zeros(5, *leaf.shape) for leaf in leaves], spec)
    assert stacked.batch_size == torch.Size([5, 3])
    reduced = torch_pytree.tree_unflatten([leaf[0] for leaf in leaves], spec)
    assert reduced.batch_size == torch.Size([])


@pytest.mark.parametrize(
    "mutate",
    [
        lambda t: t.resize_(6, 2),
        lambda t: t.t_(),
        lambda t: t.set_(torch.zeros(4, 2)),
        lambda t: setattr(t, "data", torch.zeros(7, 2)),
        lambda t: t.unsqueeze_(0),
    ],
    ids=["resize_", "t_", "set_", "data=", "unsqueeze_"],
)
def test_a_leaf_reshaped_in_place_is_not_taken_for_its_recorded_shape(mutate):
    """The same tensor object with another shape: an unflatten that trusted identity
    would give the recorded batch size to leaves that no longer have it."""
    leaf = torch.zeros(2, 2)
    td = TensorDict({"a": leaf, "b": torch.zeros(2)}, [])
    leaves, spec = torch_pytree.tree_flatten(td)
    mutate(leaf)
    out = torch_pytree.tree_unflatten(leaves, spec)
    general = rebuild._rebuild_general(list(leaves), spec.context, False, None, None, ())[0]
    assert out.batch_size == general.batch_size
    assert out["a"] is leaf
    # flattened again: the context records the new shape
    _, again = torch_pytree.tree_flatten(td)
    assert again.context.shapes[0] == leaf.shape
    # optree: the cached level is not reused either
    _, shallow = node.flatten_shallow(td)
    assert shallow.shapes[0] == leaf.shape


def test_optree_contexts_are_reused_only_for_the_same_kinds_and_shapes():
    inner = TensorDict({"x": torch.ones(2, 3)}, [2])
    first = TensorDict({"a": torch.zeros(2), "b": inner}, [])
    _, context = node.flatten_shallow(first)
    assert node.flatten_shallow(TensorDict({"a": torch.ones(2), "b": inner}, []))[1] is context
    # a tensor where a container was, with the container's batch size as its shape
    swapped = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [])
    _, other = node.flatten_shallow(swapped)
    assert other is not context and other.tensor_children == (True, True)
    leaves, _ = optree.tree_flatten(swapped, namespace="tdfunc")
    assert len(leaves) == 2
    # a nested container of another batch size
    resized = TensorDict(
        {"a": torch.zeros(2), "b": TensorDict({"x": torch.ones(2, 3)}, [2, 3])}, []
    )
    assert node.flatten_shallow(resized)[1].shapes[1] == torch.Size([2, 3])
    out = optree.tree_unflatten(*reversed(optree.tree_flatten(resized, namespace="tdfunc")))
    assert out["b"].batch_size == torch.Size([2, 3])


def test_optree_contexts_with_non_tensor_values_are_not_shared():
    def make(phase):
        td = TensorDict({"a": torch.zeros(2)}, [2])
        td["phase"] = phase
        return td

    leaves, spec = optree.tree_flatten(make("train"), namespace="tdfunc")
    assert optree.tree_unflatten(spec, leaves)["phase"] == "train"
    leaves, spec = optree.tree_flatten(make("eval"), namespace="tdfunc")
    assert optree.tree_unflatten(spec, leaves)["phase"] == "eval"


def test_optree_map_that_changes_shapes_infers_the_batch_size():
    td = TensorDict({"a": torch.zeros(3, 2), "n": TensorDict({"b": torch.zeros(3, 4)}, [3])}, [3])
    optree.tree_map(lambda x: x, td, namespace="tdfunc")  # cache the levels
    out = optree.tree_map(lambda x: x.expand(5, *x.shape), td, namespace="tdfunc")
    assert out.batch_size == torch.Size([5, 3])
    assert out["n"].batch_size == torch.Size([5, 3])
    summed = optree.tree_map(lambda x: x.sum(-1), td, namespace="tdfunc")
    assert summed.batch_size == torch.Size([3])
    torch.testing.assert_close(summed["n", "b"], td["n", "b"].sum(-1))


def test_unflatten_inside_vmap_of_a_spec_recorded_outside_checks_the_batch_dims():
    td = TensorDict({"a": torch.zeros(3, 2)}, [])
    with pytest.raises(ValueError, match="not one of its batch dims"):
        torch.func.vmap(lambda t: t["a"].sum(), (0,))(td)
    batched = TensorDict({"a": torch.arange(6.0).view(3, 2)}, [3])
    out = torch.func.vmap(lambda t: t.apply(lambda x: x * 2))(batched)
    assert out.batch_size == torch.Size([3])
    torch.testing.assert_close(out["a"], batched["a"] * 2)


@pytest.mark.parametrize("name", ["one leaf", "batched", "named", "nested", "tensorclass"])
def test_unchanged_leaves_inside_a_deeper_transform_rebuild_as_the_checked_inference(name):
    """A spec recorded outside, unflattened inside ``vmap`` with leaves of the recorded
    shapes (batched ones among them): the fast path and the inference with vmap's
    input check agree."""
    container = _corpus()[name]
    leaves, spec = torch_pytree.tree_flatten(container)
    results = []

    def inside(x):
        batched = [leaf + x.sum() * 0 for leaf in leaves]  # BatchedTensors, same shapes
        for children in (list(leaves), batched):
            fast = rebuild.unflatten(children, spec.context)
            general = rebuild._rebuild(list(children), 0, spec.context, True, False)[0]
            results.append((fast, general, children))
        return x

    torch.func.vmap(inside)(torch.zeros(3, 2))
    for fast, general, children in results:
        assert type(fast) is type(general)
        assert fast.batch_size == general.batch_size == container.batch_size
        assert fast.names == general.names
        assert all(a is b for a, b in zip(torch_pytree.tree_leaves(fast), children))


def test_a_wide_tree_of_changed_shapes_infers_its_batch_size():
    """Past the width where sizes are compared one at a time, nothing is kept from the
    first check: the inference reads the shapes itself."""
    td = TensorDict({f"k{i}": torch.arange(4.0 * 2).view(4, 2) + i for i in range(300)}, [4])
    out = torch.func.vmap(lambda t: t.apply(lambda x: x * 2))(td)
    assert out.batch_size == torch.Size([4])
    torch.testing.assert_close(out["k299"], td["k299"] * 2)
    leaves, spec = torch_pytree.tree_flatten(td)
    summed = torch_pytree.tree_unflatten([leaf.sum(-1) for leaf in leaves], spec)
    assert summed.batch_size == torch.Size([4])
    torch.testing.assert_close(summed["k7"], td["k7"].sum(-1))
