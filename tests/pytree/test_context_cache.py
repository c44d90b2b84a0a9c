"""Spec contexts reused between flattens of the same structure, and never wrongly."""

import torch
import torch.utils._pytree as torch_pytree

from tdfunc import TensorDict


def _tree(shape_b=(3,), batch=(2,)) -> TensorDict:
    return TensorDict(
        {"a": torch.zeros(*batch, 4), "n": {"b": torch.ones(*batch, *shape_b)}}, batch_size=batch
    )


def test_same_structure_reuses_the_context():
    first = torch_pytree.tree_structure(_tree())
    second = torch_pytree.tree_structure(_tree())
    assert first.context is second.context


def test_changed_feature_shape_is_a_new_context_and_rebuilds_right():
    torch_pytree.tree_structure(_tree())
    changed = _tree(shape_b=(5,))
    leaves, spec = torch_pytree.tree_flatten(changed)
    assert spec.context.nested[1].shapes == (torch.Size([2, 5]),)
    # inside vmap-like use: drop the batch dim, the recorded feature shapes decide
    out = torch_pytree.tree_unflatten([leaf[0] for leaf in leaves], spec)
    assert out.batch_size == torch.Size([])
    assert out["n", "b"].shape == torch.Size([5])
    torch.testing.assert_close(out["n", "b"], changed["n", "b"][0])


def test_changed_batch_size_keys_or_class_are_new_contexts():
    base = torch_pytree.tree_structure(_tree()).context
    assert torch_pytree.tree_structure(_tree(batch=(3,))).context.batch_size == torch.Size([3])
    renamed = TensorDict({"a": torch.zeros(2, 4), "m": {"b": torch.ones(2, 3)}}, batch_size=[2])
    assert torch_pytree.tree_structure(renamed).context.keys == ("a", "m")
    assert torch_pytree.tree_structure(renamed).context != base


def test_non_tensor_values_are_never_shared():
    def make(phase):
        td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
        td["phase"] = phase
        return td

    first = torch_pytree.tree_structure(make("train")).context
    second = torch_pytree.tree_structure(make("eval")).context
    assert first.non_tensor[0][1] == "train"
    assert second.non_tensor[0][1] == "eval"
    assert first != second


def test_a_level_seen_as_tensors_is_not_reused_for_other_kinds_of_values():
    tensors = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [])
    torch_pytree.tree_structure(tensors)  # cached: a level of two tensors of shape [2]
    inner = TensorDict({"x": torch.ones(2, 3)}, [2])  # its shape is the cached one
    nested = TensorDict({"a": torch.zeros(2), "b": inner}, [])
    leaves, spec = torch_pytree.tree_flatten(nested)
    assert [leaf.shape for leaf in leaves] == [torch.Size([2]), torch.Size([2, 3])]
    assert spec.context.nested is not None and spec.context.nested[1] is not None
    assert torch_pytree.tree_unflatten(leaves, spec)["b", "x"] is inner["x"]
    text = TensorDict({"a": torch.zeros(2)}, [])
    text["b"] = "metadata"
    leaves, spec = torch_pytree.tree_flatten(text)
    assert len(leaves) == 1 and spec.context.non_tensor[0][1] == "metadata"
    assert torch_pytree.tree_unflatten(leaves, spec)["b"] == "metadata"


def test_a_level_seen_with_a_nested_container_is_not_reused_for_tensors():
    inner = TensorDict({"x": torch.ones(2, 3)}, [2])
    torch_pytree.tree_structure(TensorDict({"c": torch.zeros(2), "d": inner}, []))
    flat = TensorDict({"c": torch.zeros(2), "d": torch.ones(2)}, [])  # same keys and shapes
    leaves, spec = torch_pytree.tree_flatten(flat)
    assert spec.context.nested is None and len(leaves) == 2
    out = torch_pytree.tree_unflatten(leaves, spec)
    assert out["c"] is flat["c"] and out["d"] is flat["d"]


def test_tensor_children_that_come_back_as_containers_follow_the_general_rules():
    td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [])
    leaves, spec = torch_pytree.tree_flatten(td)
    # what a jacobian gives for each leaf: blocks whose batch sizes are the leaves' shapes
    blocks = [TensorDict({"x": torch.ones(2, 3)}, [2]) for _ in leaves]
    out = torch_pytree.tree_unflatten(blocks, spec)
    assert out.batch_size == torch.Size([2])  # the longest prefix the blocks share
    assert out["a"] is blocks[0] and out["b"] is blocks[1]
    # one leaf still a tensor of its recorded shape: it proposes the recorded batch size
    assert torch_pytree.tree_unflatten([leaves[0], blocks[1]], spec).batch_size == torch.Size([])


def test_tensor_subclasses_rebuild_like_plain_tensors():
    td = TensorDict({"a": torch.zeros(3, 2), "b": torch.ones(3)}, [3])
    leaves, spec = torch_pytree.tree_flatten(td)
    params = [torch.nn.Parameter(leaf[0]) for leaf in leaves]  # the batch dim mapped away
    out = torch_pytree.tree_unflatten(params, spec)
    assert out.batch_size == torch.Size([]) and out["a"] is params[0]
    same = torch_pytree.tree_unflatten([torch.nn.Parameter(leaf) for leaf in leaves], spec)
    assert same.batch_size == torch.Size([3])


def _shared_keys(inner_shape=(3,)) -> TensorDict:
    """Every level has the keys "0" and "1" (as a Sequential's parameters do)."""
    leaf = {"0": torch.zeros(*inner_shape), "1": torch.ones(2)}
    return TensorDict({"0": dict(leaf), "1": {"0": dict(leaf), "1": torch.zeros(4)}}, [])


def _contexts(context) -> list:
    found = [context]
    for inner in context.nested or ():
        if inner is not None:
            found += _contexts(inner)
    return found


def test_levels_that_share_keys_keep_their_contexts():
    first = _contexts(torch_pytree.tree_structure(_shared_keys()).context)
    second = _contexts(torch_pytree.tree_structure(_shared_keys()).context)
    assert len(first) == 4 and all(a is b for a, b in zip(first, second))


def test_a_changed_nested_level_is_flattened_anew():
    torch_pytree.tree_structure(_shared_keys())
    changed = _shared_keys(inner_shape=(5,))  # a leaf two levels down has another shape
    leaves, spec = torch_pytree.tree_flatten(changed)
    assert [leaf.shape[0] for leaf in leaves] == [5, 2, 5, 2, 4]
    assert spec.context.nested[1].nested[0].shapes == (torch.Size([5]), torch.Size([2]))
    out = torch_pytree.tree_unflatten(leaves, spec)
    assert out["1", "0", "0"] is changed["1", "0", "0"]
    flat = _shared_keys()
    flat["1", "0"] = torch.zeros(2)  # a nested level replaced by a tensor of its batch size
    leaves, spec = torch_pytree.tree_flatten(flat)
    assert [leaf.shape[0] for leaf in leaves] == [3, 2, 2, 4]
    assert torch_pytree.tree_unflatten(leaves, spec)["1", "0"] is flat["1", "0"]
