"""The non-tensor API as tensordict documents it: ``get`` gives ``NonTensorData``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorClass, TensorDict


def test_set_and_get_non_tensor_docs_example():
    data = TensorDict({}, batch_size=[])
    data = data.set_non_tensor(("nested", "the string"), "a string!")
    assert data.get_non_tensor(("nested", "the string")) == "a string!"
    assert data["nested", "the string"] == "a string!"
    stored = data.get(("nested", "the string"))
    assert type(stored) is NonTensorData and stored.data == "a string!"
    assert data.get_non_tensor("missing", "default") == "default"
    with pytest.raises(KeyError):
        data.get_non_tensor("missing")


def test_set_non_tensor_stores_numbers_as_non_tensor():
    td = TensorDict({}, [3]).set_non_tensor("n", 5)
    assert td.is_non_tensor("n") and td["n"] == 5 and td.get("n").batch_size == torch.Size([3])
    td["t"] = torch.full((3,), 5)
    assert not td.is_non_tensor("t") and isinstance(td["t"], torch.Tensor)
    with pytest.raises(KeyError):
        td.is_non_tensor("missing")


def test_set_non_tensor_refused_on_locked():
    td = TensorDict({}, []).lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.set_non_tensor("s", "x")


def test_get_items_values_give_non_tensor_data_getitem_gives_value():
    td = TensorDict({"a": torch.zeros(2), "s": "text", "n": {"t": "more"}}, [2])
    assert td["s"] == "text" and td["n", "t"] == "more"
    assert isinstance(td.get("s"), NonTensorData) and td.get("s").data == "text"
    assert set(dict(td.items(True, True))) == {"a"}  # tensordict's default leaves: tensors
    values = dict(td.items(True, True, is_leaf=lambda cls: cls is not TensorDict))
    assert isinstance(values["s"], NonTensorData) and isinstance(values[("n", "t")], NonTensorData)
    assert [type(v).__name__ for v in td.values()] == ["Tensor", "NonTensorData", "TensorDict"]
    assert [k for k, _ in td.non_tensor_items(include_nested=True)] == ["s", ("n", "t")]
    assert td.get_non_tensor("a") is td["a"]  # other entries come as they are


def test_stack_of_strings_get_tolist_and_masking():
    # the tensordict "non-tensor data" concept page
    reads = TensorDict(
        {"seq": ["ACGT", "GGCC", "TTAG"], "gc": torch.tensor([0.50, 1.00, 0.25])}, batch_size=[3]
    )
    gc_rich = reads[reads["gc"] > 0.4]
    assert gc_rich.batch_size == torch.Size([2])
    assert gc_rich.get("seq").tolist() == ["ACGT", "GGCC"]
    assert gc_rich["seq"] == ["ACGT", "GGCC"]


def test_update_from_a_tensordict_keeps_non_tensor_leaves():
    source = TensorDict({"s": "x", "stack": ["a", "b"]}, [2])
    target = TensorDict({}, [2]).update(source)
    assert target["s"] == "x" and target["stack"] == ["a", "b"]


def test_non_tensor_data_names_keyword():
    leaf = NonTensorData("a", batch_size=[2, 3], names=["x", None])
    assert leaf.names == ["x", None] and leaf.data == "a"
    assert NonTensorData("a").names == []
    with pytest.raises(ValueError, match="expected 2 names"):
        NonTensorData("a", batch_size=[2, 3], names=["x"])
    assert NonTensorData(NonTensorData("inner")).data == "inner"  # unwrapped


def test_non_tensor_stack_from_values_and_data():
    stack = NonTensorStack("a", "b")
    assert stack.batch_size == torch.Size([2]) and stack.tolist() == ["a", "b"]
    stacked = NonTensorStack(NonTensorData("x", [2]), NonTensorData("y", [2]), stack_dim=1)
    expected = np.stack([np.array(["x", "x"]), np.array(["y", "y"])], axis=1).tolist()
    assert stacked.batch_size == torch.Size([2, 2]) and stacked.tolist() == expected
    with pytest.raises(ValueError, match="same batch size"):
        NonTensorStack(NonTensorData("x", [2]), NonTensorData("y", [3]))
    with pytest.raises(ValueError, match="at least one"):
        NonTensorStack()


def test_non_tensor_stack_from_list_and_shape_ops_match_numpy():
    values = [["a", "b", "c"], ["d", "e", "f"]]
    stack = NonTensorStack.from_list(values)
    reference = np.array(values, dtype=object)
    assert stack.batch_size == torch.Size([2, 3])
    assert stack.reshape(3, 2).tolist() == reference.reshape(3, 2).tolist()
    assert stack.view(-1).tolist() == reference.reshape(-1).tolist()
    assert stack.permute(1, 0).tolist() == reference.T.tolist()
    assert stack.transpose(0, 1).tolist() == reference.T.tolist()
    assert stack.unsqueeze(0).tolist() == reference[None].tolist()
    assert stack.unsqueeze(0).squeeze(0).tolist() == values
    assert stack.flatten().tolist() == reference.reshape(-1).tolist()
    assert stack.flatten().unflatten(0, (2, 3)).tolist() == values
    assert [s.tolist() for s in stack.unbind(1)] == [list(col) for col in reference.T.tolist()]
    assert stack[1, 1:].tolist() == reference[1, 1:].tolist()
    assert [p.tolist() for p in stack.split(2, dim=1)] == [
        reference[:, :2].tolist(),
        reference[:, 2:].tolist(),
    ]
    assert NonTensorStack.from_list(["a", "b"], batch_size=[2]).tolist() == ["a", "b"]
    assert NonTensorStack.from_list([[]]).batch_size == torch.Size([1, 0])
    with pytest.raises(ValueError, match="nested list of shape"):
        NonTensorStack.from_list([["a"], ["b", "c"]], batch_size=[2, 1])


def test_legacy_positional_form_still_builds_from_a_nested_list():
    stack = NonTensorStack(["a", "b", "c"], batch_size=[3])
    assert stack[torch.tensor([2, 0])].data == ["c", "a"]


class _Labelled(TensorClass):
    x: torch.Tensor
    label: Any = None


def test_tensorclass_get_gives_the_content():
    item = _Labelled(x=torch.zeros(2), label="cat", batch_size=[2])
    assert item.get("label") == "cat" and item.label == "cat"
    assert item.get("nope") is None  # as tensordict: get of a missing key gives None
    assert item.get("nope", 3) == 3


# ---------------------------------------------------------------- tensordict's leaf surface
def test_leaf_has_a_dict_without_its_data_and_a_tensordict_view():
    leaf = NonTensorData("a", batch_size=[2])
    assert "data" not in leaf.__dict__
    view = leaf._tensordict
    assert view["data"] == "a" and view.batch_size == torch.Size([2])
    assert view.get("data") is leaf  # a view, not a copy


@pytest.mark.parametrize("how", ["update_", "update-inplace", "update"])
@pytest.mark.parametrize("values", [("x", "y"), (0, 1), ([0, "s"], [9, "t"]), ({"k": 1}, {"k": 2})])
def test_update_of_a_leaf_reaches_every_holder(how, values):
    before, after = values
    td = TensorDict({"val": NonTensorData(before)}, [])
    other = td.copy()  # shares the leaf, as a shallow copy does
    leaf = td.get("val")
    if how == "update_":
        leaf.update_(NonTensorData(after))
    elif how == "update-inplace":
        leaf.update(NonTensorData(after), inplace=True)
    else:
        leaf.update({"data": after})
    assert td["val"] == after and other["val"] == after


def test_a_locked_container_locks_its_leaves_for_update():
    td = TensorDict({"val": "x", "n": {"s": "y"}}, []).lock_()
    for key in ("val", ("n", "s")):
        with pytest.raises(RuntimeError, match="lock"):
            td.get(key).update(NonTensorData("z"))
        td.get(key).update_(NonTensorData("z"))
        assert td[key] == "z"
    with td.unlock_():
        td.get("val").update(NonTensorData("w"))
        assert td["val"] == "w"
    with pytest.raises(RuntimeError, match="lock"):
        td.get("val").update(NonTensorData("v"))
    td.unlock_()
    td.get("val").update(NonTensorData("v"))
    assert td["val"] == "v"


def test_share_memory_marks_non_tensor_leaves_and_locks():
    td = TensorDict({"val": "x"}, [])
    assert not td._is_shared and not td.get("val")._is_shared
    td.share_memory_()
    assert td.is_locked and td._is_shared and td.is_shared()
    assert td.get("val")._is_shared and td.get("val")._tensordict._is_shared


def test_a_stack_update_keeps_one_value_per_element():
    stack = NonTensorStack.from_list(["a", "b"])
    stack.update_(NonTensorData("c", batch_size=[2]))
    assert stack.tolist() == ["c", "c"]
    stack.update_(NonTensorStack.from_list(["d", "e"]))
    assert stack.tolist() == ["d", "e"]


def test_reading_a_stack_gives_a_linked_list():
    from tdfunc.utils import LinkedList

    reference = ["foo", "bar"]
    td = TensorDict({"a": NonTensorStack(*reference)}, [2])
    read = td["a"]
    assert isinstance(read, LinkedList) and read == reference
    assert repr(read) == str(read) == "LinkedList(['foo', 'bar'])"
    read[0] = "baz"
    reference[0] = "baz"
    assert td["a"] == reference and read._td() is td.get("a")
    read[:2] = ["x", "y"]
    assert td["a"] == ["x", "y"]
    read.extend(["z"])  # a change of length detaches the list
    assert read._td() is None and td["a"] == ["x", "y"]
    import pickle

    assert pickle.loads(pickle.dumps(read)) == ["x", "y", "z"]


def test_calling_a_stored_function():
    td0, td1 = TensorDict({"a": 0, "b": 0}), TensorDict({"a": 1, "b": 1})
    funcs = TensorDict({"a": lambda x, y: x - y, "b": lambda x, y: x + y})
    out = td0.apply(lambda x, y, f: f(x, y), td1, funcs)
    assert out["a"] == 0 - 1 and out["b"] == 0 + 1


@pytest.mark.parametrize("dims", [(None, None), (0, -1), (None, 0), (0, None), (0, 0)])
def test_flatten_accepts_none_for_the_first_and_last_dims(dims):
    leaf = NonTensorData(0)
    reference = np.zeros(()).flatten()  # numpy's flatten of a 0-d array
    out = leaf.flatten(*dims)
    assert out.shape == reference.shape and out.tolist() == reference.astype(int).tolist()
    stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    assert stack.flatten(None, None).tolist() == ["a", "b", "c", "d"]


def test_item_assignment_into_a_stack():
    stack = NonTensorStack("0", "1")
    other = NonTensorStack(NonTensorStack("2", "3"), stack_dim=1)
    stack[:, None] = other
    assert stack.tolist() == ["2", "3"]
    stack[0] = "x"
    assert stack.tolist() == ["x", "3"]
