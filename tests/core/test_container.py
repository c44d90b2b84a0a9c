"""TensorDict as a container: construction, keys, reading and writing, nesting, locking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdfunc import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    is_tensor_collection,
    set_capture_non_tensor_stack,
)


# ---------------------------------------------------------------- construction
def test_construct_from_dict_shares_tensors_and_nests_dicts():
    a, c = torch.randn(3, 4), torch.randn(3)
    td = TensorDict({"a": a, "b": {"c": c}}, batch_size=[3])
    assert td["a"] is a
    assert type(td["b"]) is TensorDict
    assert td["b"].batch_size == torch.Size([3])
    assert td["b", "c"] is c
    assert td.batch_size == td.shape == torch.Size([3])
    assert td.batch_dims == td.ndim == td.dim() == 1
    assert td.numel() == 3 and len(td) == 3
    assert td.size() == torch.Size([3]) and td.size(0) == 3


@pytest.mark.parametrize("batch_size", [[3, 4], (3, 4), torch.Size([3, 4])])
def test_batch_size_spellings(batch_size):
    td = TensorDict({"x": torch.zeros(3, 4, 2)}, batch_size=batch_size)
    assert td.batch_size == torch.Size([3, 4])
    assert type(td.batch_size) is torch.Size


def _not_a_container(cls: type) -> bool:
    """An ``is_leaf`` that counts non-tensor data as leaves (tensordict's default does not)."""
    return not getattr(cls, "_is_tensor_collection", False)


def test_batch_size_int_and_default():
    assert TensorDict({"x": torch.zeros(3)}, 3).batch_size == torch.Size([3])
    assert TensorDict({"x": torch.zeros(3)}).batch_size == torch.Size([])
    assert TensorDict().batch_size == torch.Size([])


def test_empty_with_batch_size():
    td = TensorDict({}, batch_size=[4, 2])
    assert td.batch_size == torch.Size([4, 2])
    assert list(td.keys()) == []
    assert td.is_empty()
    assert td[1:3].batch_size == torch.Size([2, 2])


def test_nested_tensordict_may_have_longer_batch():
    inner = TensorDict({"y": torch.zeros(3, 4, 5)}, batch_size=[3, 4])
    td = TensorDict({"x": torch.zeros(3), "inner": inner}, batch_size=[3])
    assert td["inner"].batch_size == torch.Size([3, 4])
    assert td[0]["inner"].batch_size == torch.Size([4])


def test_nested_dict_value_gets_parent_batch_size():
    td = TensorDict({"a": {"b": {"c": torch.zeros(2, 3)}}}, batch_size=[2])
    assert td["a"].batch_size == torch.Size([2])
    assert td["a", "b"].batch_size == torch.Size([2])


def test_construct_with_tuple_keys_and_mixed_values():
    td = TensorDict({("a", "b"): torch.zeros(2), "a": {"c": torch.ones(2)}, "s": "hi"}, [2])
    # tensordict's default leaves are tensors: non-tensor data needs is_leaf
    assert sorted(td.keys(True, True), key=str) == [("a", "b"), ("a", "c")]
    assert sorted(td.keys(True, True, is_leaf=_not_a_container), key=str) == [
        ("a", "b"),
        ("a", "c"),
        "s",
    ]
    assert td["s"] == "hi"


def test_construct_from_tensordict_copies_structure():
    source = TensorDict({"a": torch.zeros(2), "n": {"b": torch.ones(2)}}, [2])
    td = TensorDict(source)
    assert td.batch_size == torch.Size([2])
    assert td["a"] is source["a"]
    td["new"] = torch.zeros(2)
    assert "new" not in source


def test_scalars_and_lists_become_tensors():
    td = TensorDict({"i": 3, "f": 1.5, "b": True, "l": [1, 2, 3]}, [])
    assert td["i"].dtype == torch.int64 and td["i"].item() == 3
    assert td["f"].dtype == torch.float32
    assert td["b"].dtype == torch.bool
    assert torch.equal(td["l"], torch.tensor([1, 2, 3]))


def test_device_moves_values_written_later():
    td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3], device="meta")
    assert td.device == torch.device("meta")
    assert td["a"].device.type == "meta"
    td["b"] = torch.randn(3, 2)
    assert td["b"].device.type == "meta"
    td["n", "c"] = torch.randn(3)
    assert td["n", "c"].device.type == "meta"
    assert td["n"].device == torch.device("meta")
    td.set("d", {"e": torch.ones(3)})
    assert td["d", "e"].device.type == "meta"


def test_device_none_keeps_each_tensor_device():
    td = TensorDict({"a": torch.zeros(2), "m": torch.zeros(2, device="meta")}, [2])
    assert td.device is None
    assert td["a"].device.type == "cpu" and td["m"].device.type == "meta"


def test_names():
    td = TensorDict({"x": torch.zeros(2, 3, 4)}, [2, 3], names=["env", "time"])
    assert td.names == ["env", "time"]
    assert TensorDict({}, [2, 3]).names == [None, None]
    assert TensorDict({}, []).names == []
    td.names = ["a", None]
    assert td.names == ["a", None]
    td.names = None
    assert td.names == [None, None]
    assert td.refine_names("p", "q").names == ["p", "q"]


def test_fromkeys():
    td = TensorDict.fromkeys(["a", ("nested", "e")], 0)
    assert td["a"].item() == 0 and td["nested", "e"].item() == 0
    value = torch.zeros(2)
    td = TensorDict.fromkeys(["x", "y"], value, batch_size=[2])
    assert td.batch_size == torch.Size([2])
    assert td["x"] is not value and td["x"] is not td["y"]
    assert torch.equal(td["x"], value)


def test_lock_at_construction():
    td = TensorDict({"a": {"b": torch.zeros(())}}, lock=True)
    assert td.is_locked and td["a"].is_locked


def test_is_tensor_collection():
    assert is_tensor_collection(TensorDict())
    assert not is_tensor_collection({"a": 1})
    assert not is_tensor_collection(torch.zeros(1))


# ---------------------------------------------------------------- keys
def _nested() -> TensorDict:
    return TensorDict(
        {"a": torch.zeros(2), "b": {"c": torch.ones(2), "d": {"e": torch.ones(2)}}, "s": "x"},
        [2],
    )


def test_keys_top_level_and_nested():
    td = _nested()
    assert list(td.keys()) == ["a", "b", "s"]
    assert list(td.keys(include_nested=True)) == [
        "a",
        "b",
        ("b", "c"),
        ("b", "d"),
        ("b", "d", "e"),
        "s",
    ]
    assert list(td.keys(True, True)) == ["a", ("b", "c"), ("b", "d", "e")]
    assert list(td.keys(leaves_only=True)) == ["a"]
    assert "s" in td and "s" not in td.keys(leaves_only=True)
    assert len(td.keys()) == 3 and len(td.keys(True, True)) == 3
    assert list(td.keys(True, True, sort=True)) == ["a", ("b", "c"), ("b", "d", "e")]
    assert list(td.keys(True, True, is_leaf=_not_a_container)) == [
        "a",
        ("b", "c"),
        ("b", "d", "e"),
        "s",
    ]


def test_keys_membership_unravels_nested_tuples():
    td = _nested()
    keys = td.keys(include_nested=True)
    assert ("b", "c") in keys
    assert (("b",), ("d", ("e",))) in keys
    with pytest.raises(TypeError, match="include_nested=True"):  # as in tensordict
        _ = ("b", "c") in td.keys()  # noqa: SIM118 - the view, not the container
    assert "b" not in td.keys(True, leaves_only=True)
    assert ("b", "zz") not in keys
    with pytest.raises(TypeError, match="always strings"):  # not a key: a mistake
        _ = 3 in keys
    assert td.keys() == {"a", "b", "s"}


def test_values_and_items():
    td = _nested()
    assert set(dict(td.items(True, True))) == {"a", ("b", "c"), ("b", "d", "e")}
    items = dict(td.items(True, True, is_leaf=_not_a_container))
    assert set(items) == {"a", ("b", "c"), ("b", "d", "e"), "s"}
    assert items["s"] == "x"
    assert items[("b", "c")] is td["b", "c"]
    values = list(td.values())
    assert values[0] is td["a"] and values[2] == "x"


def test_contains():
    td = _nested()
    assert "a" in td and ("b", "d", "e") in td and ("b", ("d",)) in td
    assert "zz" not in td and ("a", "x") not in td
    with pytest.raises(TypeError, match="NestedKey"):
        _ = 1 in td  # not a key: an error, not False (as tensordict)


def test_get_with_default():
    td = _nested()
    assert td.get(("b", "c")) is td["b", "c"]
    assert td.get("missing", None) is None
    assert td.get(("b", "missing"), 7) == 7
    assert td.get(("a", "under_a_tensor"), "d") == "d"
    assert td.get("missing") is None  # as dict.get, and tensordict since 0.7


def test_unravelled_nested_keys_for_read_and_write():
    td = TensorDict({}, [3, 4])
    td["nested", ("supernested", ("key",))] = torch.zeros(3, 4)
    assert (td["nested", "supernested", "key"] == 0).all()
    assert (("nested",), "supernested", (("key",),)) in td.keys(include_nested=True)
    assert td[("nested",)].batch_size == torch.Size([3, 4])


# ---------------------------------------------------------------- writing
def test_set_returns_self_and_replaces():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    new = torch.ones(2)
    assert td.set("a", new) is td
    assert td["a"] is new


def test_set_nested_creates_intermediate_tensordicts():
    td = TensorDict({}, [2])
    td.set(("x", "y", "z"), torch.zeros(2, 3))
    assert type(td["x"]) is TensorDict and td["x", "y"].batch_size == torch.Size([2])
    assert td["x", "y", "z"].shape == torch.Size([2, 3])


def test_set_inplace_flag():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    before = td["a"]
    td.set("a", torch.ones(2), inplace=True)
    assert td["a"] is before and before.tolist() == [1.0, 1.0]
    td.set("b", torch.ones(2), inplace=True)  # missing keys are created
    assert td["b"].tolist() == [1.0, 1.0]


def test_set_inplace_casts_and_checks_the_batch_size_as_set_does():
    td = TensorDict({"a": torch.zeros(2, 3, dtype=torch.int64)}, [2])
    td.set_("a", torch.tensor([[1.0, 2.0, 3.0]]).expand(2, 3))
    assert td["a"].dtype == torch.int64
    assert td["a"].tolist() == [[1, 2, 3], [1, 2, 3]]
    td.set_("a", torch.full((2, 1), 5))  # feature dims broadcast, as copy_ does
    assert (td["a"] == 5).all()
    for value in (torch.tensor([1.0, 2.0, 3.0]), 5):  # never into the batch dims
        with pytest.raises(ValueError, match="does not start with the batch size"):
            td.set_("a", value)
    assert (td["a"] == 5).all()


def test_set_underscore_into_nested_and_non_tensor():
    td = TensorDict({"n": {"x": torch.zeros(2)}, "s": "old"}, [2])
    x = td["n", "x"]
    td.set_("n", {"x": torch.ones(2)})
    assert td["n", "x"] is x and x.tolist() == [1.0, 1.0]
    td.set_(("n", "x"), torch.full((2,), 2.0))
    assert x.tolist() == [2.0, 2.0]
    td.set_("s", "new")
    assert td["s"] == "new"


def test_setitem_key_writes_and_nested_dict_values():
    td = TensorDict({}, [2])
    td["a"] = {"b": torch.zeros(2), "c": {"d": torch.ones(2, 1)}}
    assert td["a", "c", "d"].shape == torch.Size([2, 1])
    assert td["a"].batch_size == torch.Size([2])


def test_update_merges_nested_and_returns_self():
    td = TensorDict({"a": {"b": torch.zeros(2)}, "x": torch.zeros(2)}, [2])
    out = td.update({"a": {"c": torch.ones(2)}, "y": torch.ones(2), ("a", "d"): torch.ones(2)})
    assert out is td
    assert set(td.keys(True, True)) == {("a", "b"), ("a", "c"), ("a", "d"), "x", "y"}
    other = TensorDict({"a": {"e": torch.ones(2)}}, [2])
    td.update(other)
    assert ("a", "b") in td and ("a", "e") in td


def test_update_replaces_tensors_and_inplace_copies():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    first = td["a"]
    new = torch.ones(2)
    td.update({"a": new})
    assert td["a"] is new
    td.update({"a": torch.full((2,), 3.0)}, inplace=True)
    assert td["a"] is new and new.tolist() == [3.0, 3.0]
    assert first.tolist() == [0.0, 0.0]


def test_update_underscore_is_in_place():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2, 3)}}, [2])
    a, b = td["a"], td["n", "b"]
    td.update_({"a": torch.ones(2), "n": {"b": torch.ones(2, 3)}})
    assert td["a"] is a and td["n", "b"] is b
    assert a.sum() == 2 and b.sum() == 6
    td.update_(TensorDict({"a": torch.full((2,), 4.0)}, [2]))
    assert a.tolist() == [4.0, 4.0]


def test_del_pop_clear():
    td = _nested()
    del td["a"]
    assert "a" not in td
    td.del_(("b", "d", "e"))
    assert ("b", "d", "e") not in td and ("b", "d") in td
    value = td.pop(("b", "c"))
    assert value.tolist() == [1.0, 1.0] and ("b", "c") not in td
    assert td.pop("missing", "default") == "default"
    assert td.pop("s") == "x"
    td.clear()
    assert list(td.keys()) == []


def test_setdefault():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    assert td.setdefault("a", torch.ones(2)) is td["a"]
    assert td.setdefault(("n", "b"), torch.ones(2)).tolist() == [1.0, 1.0]


def test_rename_key():
    td = _nested()
    a = td["a"]
    td.rename_key_("a", "z")
    assert "a" not in td and td["z"] is a
    td.rename_key_(("b", "c"), ("q", "r"))
    assert ("b", "c") not in td and td["q", "r"].tolist() == [1.0, 1.0]
    td.rename_key_("z", "z")
    assert td["z"] is a
    td.rename_key_("z", "s")  # replaces
    assert td["s"] is a
    with pytest.raises(KeyError, match="already present"):
        td.rename_key_("s", ("b", "d"), safe=True)


# ---------------------------------------------------------------- non-tensor data
def test_non_tensor_reads_back_python_value():
    data = TensorDict({"a-tensor": torch.randn(1, 2)}, batch_size=[1, 2])
    data["non-tensor"] = "a string!"
    assert data["non-tensor"] == "a string!"
    assert data.get("non-tensor") == "a string!"
    stored = data._get_leaf("non-tensor")
    assert type(stored) is NonTensorData
    assert stored.batch_size == torch.Size([1, 2])


def test_non_tensor_objects_and_none():
    obj = object()
    td = TensorDict({"o": obj, "n": None, "d": NonTensorData({"k": 1})}, [2])
    assert td["o"] is obj and td["n"] is None and td["d"] == {"k": 1}
    assert td._get_leaf("d").batch_size == torch.Size([2])


def test_non_tensor_follows_shape_ops():
    td = TensorDict({"x": torch.zeros(2, 3), "s": "v"}, [2, 3])
    # rearrangements and selections keep the one value
    ones = TensorDict({"x": torch.zeros(1, 3), "s": "v"}, [1, 3])
    kept = [td.reshape(-1), td.permute(1, 0), td.transpose(0, 1), td.flatten(0, 1)]
    for out in [*kept, td[0], td[:, 1:], td[None][0], ones.squeeze(0), *td.unbind(1)]:
        assert out["s"] == "v"
        assert out._get_leaf("s").batch_size == out.batch_size
    # ops that lay the value over new elements give one per element, as tensordict does
    for out in [td.unsqueeze(0), td.expand(4, 2, 3)]:
        leaf = out._get_leaf("s")
        assert isinstance(leaf, NonTensorStack) and leaf.batch_size == out.batch_size
        assert out["s"] == np.full(tuple(out.batch_size), "v", dtype=object).tolist()


def test_non_tensor_shape_ops_share_the_value():
    value = ["a", "mutable", "value"]
    td = TensorDict({"s": NonTensorData(value)}, [])
    expanded = td.unsqueeze(0).expand(2, 3)
    assert expanded["s"] == [[value] * 3] * 2
    # every element references the stored object: no copy of the value is made
    assert all(item is value for row in expanded._get_leaf("s").data for item in row)
    assert td.unsqueeze(0)["s"] == [value] and td.unsqueeze(0).squeeze()["s"] is value


def test_stack_of_different_strings_gives_a_list():
    tds = [TensorDict({"s": name, "x": torch.zeros(())}, []) for name in ["a", "b", "c"]]
    stacked = torch.stack(tds)
    assert stacked["s"] == ["a", "b", "c"]
    assert isinstance(stacked._get_leaf("s"), NonTensorStack)
    assert stacked[1]["s"] == "b"
    assert stacked[1:]["s"] == ["b", "c"]
    assert stacked[torch.tensor([2, 0])]["s"] == ["c", "a"]
    assert [td["s"] for td in stacked.unbind(0)] == ["a", "b", "c"]
    same = torch.stack([tds[0], tds[0]])
    assert same["s"] == ["a", "a"]  # one value per element, as a list of per-element values
    with set_capture_non_tensor_stack(True):
        captured = torch.stack([tds[0], tds[0]])
    assert captured["s"] == "a"
    assert same[0]["s"] == captured[0]["s"] == "a"


# ---------------------------------------------------------------- select / exclude / keys ops
def test_select_and_exclude_share_leaves():
    td = _nested()
    sub = td.select("a", ("b", "c"))
    assert set(sub.keys(True, True)) == {"a", ("b", "c")}
    assert sub["a"] is td["a"]
    sub["b", "new"] = torch.zeros(2)
    assert ("b", "new") not in td  # the structure is a copy
    assert td.select("a", "zz", strict=False).keys() == {"a"}
    ex = td.exclude("a", ("b", "d"), "not-there")
    assert set(ex.keys(True, True, is_leaf=_not_a_container)) == {("b", "c"), "s"}
    assert "a" in td and ("b", "d", "e") in td
    assert ex["b", "c"] is td["b", "c"]


def test_select_exclude_inplace():
    td = _nested()
    assert td.select("a", inplace=True) is td
    assert list(td.keys()) == ["a"]
    td = _nested()
    assert td.exclude(("b", "c"), inplace=True) is td
    assert ("b", "c") not in td


def test_flatten_and_unflatten_keys():
    data = TensorDict(
        {
            "key 1": torch.ones(3, 4, 5),
            "key 2": TensorDict({"sub-key": torch.randn(3, 4, 5, 6)}, batch_size=[3, 4, 5]),
        },
        batch_size=[3, 4],
    )
    flat = data.flatten_keys(separator=".")
    assert set(flat.keys()) == {"key 1", "key 2.sub-key"}
    assert flat["key 2.sub-key"] is data["key 2", "sub-key"]
    back = flat.unflatten_keys(".")
    assert back["key 2", "sub-key"] is data["key 2", "sub-key"]
    assert back.batch_size == torch.Size([3, 4])
    assert set(data.flatten_keys("/").keys()) == {"key 1", "key 2/sub-key"}


def test_flatten_keys_inplace():
    td = _nested()
    td.flatten_keys(".", inplace=True)
    assert set(td.keys()) == {"a", "b.c", "b.d.e", "s"}
    td.unflatten_keys(".", inplace=True)
    assert ("b", "d", "e") in td


def test_empty_and_copy():
    td = _nested()
    assert list(td.empty().keys()) == [] and td.empty().batch_size == td.batch_size
    deep = td.empty(recurse=True)
    assert list(deep.keys(True)) == ["b", ("b", "d")]
    shallow = td.copy()
    shallow["b", "new"] = torch.zeros(2)
    assert ("b", "new") not in td
    assert shallow["a"] is td["a"]


# ---------------------------------------------------------------- locking
def test_lock_refuses_structure_but_allows_in_place():
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3)}}, [3]).lock_()
    assert td.is_locked and td["n"].is_locked
    a = td["a"]
    td.set("a", torch.ones(3), inplace=True)
    assert td["a"] is a and a.tolist() == [1.0, 1.0, 1.0]
    td.set_(("n", "b"), torch.ones(3))
    td[0] = TensorDict({"a": torch.tensor(5.0)}, [])
    assert a[0] == 5
    td.update({"a": torch.zeros(3)}, inplace=True)
    assert td["a"] is a and a.sum() == 0
    td.update_({"n": {"b": torch.full((3,), 2.0)}})
    assert td["n", "b"].tolist() == [2.0, 2.0, 2.0]
    for action in [
        lambda: td.__setitem__("a", torch.ones(3)),  # replacing an entry is structural
        lambda: td.set(("n", "b"), torch.ones(3)),
        lambda: td.update({"a": torch.ones(3)}),
        lambda: td.set("new", torch.zeros(3)),
        lambda: td.__setitem__(("n", "new"), torch.zeros(3)),
        lambda: td.__delitem__("a"),
        lambda: td.rename_key_("a", "b"),
        lambda: td.__setitem__(0, TensorDict({"zz": torch.tensor(1.0)}, [])),
        lambda: td.update({"new": torch.zeros(3)}),
        lambda: td.pop("a"),
    ]:
        with pytest.raises(RuntimeError, match="locked"):
            action()
    assert set(td.keys(True, True)) == {"a", ("n", "b")}
    td.unlock_()
    assert not td.is_locked and not td["n"].is_locked
    td["new"] = torch.zeros(3)
    assert "new" in td


def test_derived_results_are_unlocked():
    td = TensorDict({"a": torch.zeros(3)}, [3]).lock_()
    assert not td[0].is_locked
    assert not td.clone().is_locked
    assert not td.apply(lambda x: x + 1).is_locked


# ---------------------------------------------------------------- misc
def test_iteration_and_truth_value():
    td = TensorDict({"a": torch.arange(3)}, [3])
    assert [item["a"].item() for item in td] == [0, 1, 2]
    with pytest.raises(TypeError, match="batch_size=\\[\\]"):
        iter(TensorDict())
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(td)


def test_batch_size_setter():
    td = TensorDict({"a": torch.zeros(3, 4), "s": "x"}, [3])
    td.batch_size = [3, 4]
    assert td.batch_size == torch.Size([3, 4])
    assert td._get_leaf("s").batch_size == torch.Size([3, 4])
    td.batch_size = []
    assert td.batch_size == torch.Size([])


def test_to_dict_and_to_tensordict():
    td = _nested()
    plain = td.to_dict()
    assert plain["b"]["d"]["e"] is td["b", "d", "e"] and plain["s"] == "x"
    copy = td.to_tensordict()
    assert torch.equal(copy["b", "c"], td["b", "c"]) and copy["b", "c"] is not td["b", "c"]
    assert copy["s"] == "x"


def test_weakref_and_no_dict():
    import weakref

    td = TensorDict()
    assert weakref.ref(td)() is td
    with pytest.raises(AttributeError):
        td.some_attribute = 1


def test_lock_refuses_to_replace_but_writes_non_tensor_values_in_place():
    td = TensorDict({"a": torch.zeros(3), "label": "cat"}, [3]).lock_()
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        td.set("label", "dog")
    td.set_("label", "dog")  # a value has no storage: written in place, it is replaced
    assert td["label"] == "dog" and td.is_locked
    assert sorted(td.keys()) == ["a", "label"]


def test_to_inplace_on_a_locked_container_refuses_only_a_change():
    plain = {"a": torch.zeros(3), "b": torch.zeros(3, 2)}
    td = TensorDict({"a": plain["a"], "n": {"b": plain["b"]}}, [3]).lock_()
    assert td.to(torch.float32, inplace=True) is td  # nothing changes: allowed
    assert td.to("cpu", inplace=True) is td and td.device == torch.device("cpu")
    with pytest.raises(RuntimeError, match=r"TensorDict\.to: .*Cannot modify locked TensorDict"):
        td.to(torch.float64, inplace=True)
    assert td["a"] is plain["a"] and td["n", "b"] is plain["b"]  # nothing was replaced
    with td.unlock_():
        td.to(torch.float64, inplace=True)
    assert td["n", "b"].dtype == torch.float64 and td.is_locked


def test_a_shallow_copy_has_its_own_nested_tensorclasses_sharing_the_tensors():
    from tdfunc import TensorClass

    class Pair(TensorClass):
        x: torch.Tensor
        label: str

    plain = {"a": torch.zeros(3), "x": torch.ones(3, 2)}
    td = TensorDict({"a": plain["a"], "pair": Pair(plain["x"], "p", batch_size=[3])}, [3])
    for copy in (td.clone(False), td.copy()):
        assert type(copy["pair"]) is Pair and copy["pair"] is not td["pair"]
        assert copy["pair"].x is plain["x"] and copy["a"] is plain["a"]  # the same tensors
        copy["pair"].x = torch.full((3, 2), 5.0)  # replacing in the copy leaves td alone
        assert td["pair"].x is plain["x"]
    shallow = td.clone(False)
    td.load_state_dict({"a": torch.ones(3), "pair.x": torch.zeros(3, 2)}, assign=True)
    assert shallow["pair"].x is plain["x"] and shallow["a"] is plain["a"]  # not reassigned
    assert torch.equal(td["pair"].x, torch.zeros(3, 2))
