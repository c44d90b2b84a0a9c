"""Structured arrays, pytrees and ``from_dict_instance`` (``_core/convert/interop.py``),
checked against NumPy and torch's pytree utilities."""

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

from tdfunc import NonTensorData, NonTensorStack, TensorClass, TensorDict, tensorclass

PETS = [("name", "U10"), ("age", "i4"), ("weight", "f4")]


def test_struct_array_with_strings_round_trips_and_shares_numbers():
    arr = np.array([("Rex", 9, 81.0), ("Fido", 3, 27.0)], dtype=PETS)
    td = TensorDict.from_struct_array(arr)
    assert td.batch_size == torch.Size([2])
    assert isinstance(td.get("name"), NonTensorStack)
    assert td["name"] == ["Rex", "Fido"]
    back = td.to_struct_array()
    assert back.dtype.names == arr.dtype.names and back.shape == arr.shape
    assert (back == arr).all()
    arr["age"] += 1  # the numeric fields are views of the array
    assert td["age"].tolist() == [10, 4]


def test_struct_array_zero_dim_and_nested_dtype():
    arr = np.array(("Rex", 9, 81.0), dtype=PETS)
    td = TensorDict.from_struct_array(arr)
    assert td.batch_size == torch.Size([]) and td["name"] == "Rex"
    assert (td.to_struct_array() == arr).all()
    dtype = [("n", "U5"), ("g", [("m", "f4"), ("s", "f4")]), ("v", "f8", (2,))]
    arr = np.array([("a", (1.0, 2.0), (0.5, 1.5)), ("b", (3.0, 4.0), (2.5, 3.5))], dtype=dtype)
    td = TensorDict.from_struct_array(arr)
    assert td["g", "m"].tolist() == arr["g"]["m"].tolist()
    assert td["v"].shape == (2, 2)
    back = td.to_struct_array()
    assert back.dtype.names == arr.dtype.names and (back == arr).all()


def test_struct_array_string_sub_array_field_is_one_value_per_element():
    # each element's value is its (2, 3) sub-array of strings; the batch stays the array's
    names = np.array([[f"n{i}{j}" for j in range(3)] for i in range(2)])
    arr = np.zeros((4,), dtype=[("s", "U3", (2, 3)), ("g", [("t", "U3", (2,))])])
    arr["s"] = names
    arr["g"]["t"] = ["ab", "cd"]
    td = TensorDict.from_struct_array(arr)
    assert td.batch_size == torch.Size([4]) and td["g"].batch_size == torch.Size([4])
    assert td["s"] == [names.tolist()] * 4
    assert td["g", "t"] == [["ab", "cd"]] * 4
    assert (td.to_struct_array() == arr).all()
    scalar = TensorDict.from_struct_array(arr[0:1].reshape(()))
    assert scalar.batch_size == torch.Size([]) and scalar["s"] == names.tolist()


def test_struct_array_round_trips_a_value_shared_by_the_batch():
    # one list value for every element (a NonTensorData): the array holds it per element
    grid = [[f"v{i}{j}" for j in range(3)] for i in range(2)]

    class Item(TensorClass["nocast"]):
        label: str | list[str]
        x: torch.Tensor

    item = Item(label=grid, x=torch.zeros(2, 3, 4))  # batch [] : one value
    assert isinstance(item._tensordict.get("label"), NonTensorData)
    td = TensorDict({"item": item, "n": torch.arange(6).view(2, 3)}, [2, 3])
    arr = td.to_struct_array()
    assert arr.shape == (2, 3) and arr["item"]["label"].shape == (2, 3, 2, 3)
    assert (arr["item"]["label"] == np.array(grid)).all()  # broadcast over the batch
    back = TensorDict.from_struct_array(arr)
    assert [[back["item", "label"][i][j] for j in range(3)] for i in range(2)] == [[grid] * 3] * 2
    assert (back == td).all()
    assert torch.equal(back["item", "x"], item.x)
    plain = TensorDict({"label": NonTensorData(grid, batch_size=[2, 3])}, [2, 3])
    assert (TensorDict.from_struct_array(plain.to_struct_array()) == plain).all()


def test_to_struct_array_of_a_container():
    td = TensorDict({"a": torch.arange(6).view(3, 2), "b": {"c": torch.ones(3)}}, [3])
    arr = td.to_struct_array()
    assert arr.shape == (3,)
    np.testing.assert_array_equal(arr["a"], td["a"].numpy())
    np.testing.assert_array_equal(arr["b"]["c"], np.ones(3, dtype=np.float32))


def test_pytree_round_trip_keeps_structure_and_keys():
    class Key:
        pass

    key = Key()
    point = TensorDict({"x": torch.ones(1)}).to_namedtuple()
    tree = (
        [torch.arange(3), torch.zeros(2)],
        {"t": torch.randn(2), "td": TensorDict({"one": 1}), key: torch.arange(2), "l": [1, 2]},
        {"nt": point},
    )
    td = TensorDict.from_pytree(tree)
    assert torch.equal(td["0", "1"], tree[0][1])
    assert torch.equal(td["1", "t"], tree[1]["t"])
    back = td.to_pytree()
    flat, spec = pytree.tree_flatten(tree)
    flat_back, spec_back = pytree.tree_flatten(back)
    assert spec == spec_back
    for a, b in zip(flat, flat_back, strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    assert key in back[1] and type(back[2]["nt"]) is type(point)


def test_to_pytree_needs_from_pytree():
    with pytest.raises(ValueError, match="from_pytree"):
        TensorDict({"a": torch.zeros(1)}).to_pytree()


def test_from_dict_instance_rebuilds_the_types_it_holds():
    @tensorclass(autocast=True)
    class Item:
        x: torch.Tensor = None
        y: int = None
        z: "Item" = None

    td = TensorDict({"a": torch.zeros(()), "b": Item(x=torch.zeros(()), y=1, z=Item(y=2))})
    as_dict = td.to_dict()
    assert isinstance(as_dict["b"], dict)
    out = td.from_dict_instance(as_dict, auto_batch_size=True)
    assert isinstance(out["b"], Item) and isinstance(out["b"].z, Item)
    assert out["b"].y == 1 and type(out["b"].y) is int
    assert out["b"].z.y == 2 and type(out["b"].z.y) is int
    assert torch.equal(out["a"], as_dict["a"])
    plain = TensorDict.from_dict(as_dict)
    assert not isinstance(plain["b"], Item)  # from_dict knows no types
