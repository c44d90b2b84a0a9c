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
