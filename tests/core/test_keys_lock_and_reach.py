"""Key operations: the lock comes first, keys reach through a TensorClass, is_leaf stops
the walk, keys_to_update limits what update would write, and what is not a key says so.

Each expected result is written out by hand (a dict would give the same); the
cases are the ones the differential test of key operations found.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Pair(TensorClass):
    a: torch.Tensor
    b: torch.Tensor = None


def _tree(lock: bool = False) -> TensorDict:
    td = TensorDict(
        {"a": torch.zeros(2), "n": {"x": torch.ones(2), "s": "text"}, "t": "top"}, batch_size=[2]
    )
    return td.lock_() if lock else td


def _with_pair() -> TensorDict:
    return TensorDict(
        {"x": torch.zeros(2), "p": Pair(torch.ones(2), torch.ones(2), batch_size=[2])}, [2]
    )


def _keys(td, *args) -> list:
    return list(td.keys(*args))


# ---------------------------------------------------------------------- the lock first
@pytest.mark.parametrize(
    "change",
    [
        lambda td: td.pop("missing", None),  # used to return the default
        lambda td: td.pop(("a", "b"), None),
        lambda td: td.rename_key_("missing", "c"),  # used to be a KeyError
        lambda td: td.rename_key_("a", "a"),  # used to do nothing
        lambda td: td.rename_key_("n", ("n", "y")),  # used to be a ValueError
        lambda td: td.rename_key_("a", "t", safe=True),  # used to be a KeyError
        lambda td: td.select("missing", inplace=True),  # used to be a KeyError
        lambda td: td.del_(("a", "b")),  # a leaf in the way: used to be a KeyError
        lambda td: td.exclude("missing", inplace=True),
    ],
)
def test_a_locked_container_refuses_a_structural_change_whatever_the_key(change):
    td = _tree(lock=True)
    before = _keys(td, True)
    with pytest.raises(RuntimeError, match="locked"):
        change(td)
    assert _keys(td, True) == before


@pytest.mark.parametrize("api", ["flatten_keys", "unflatten_keys"])
def test_a_locked_container_reports_the_lock_before_a_clash_of_keys(api):
    td = _tree()
    td["n.x"] = torch.zeros(2)  # flattens onto ("n", "x"), and unflattens onto it
    with pytest.raises(KeyError, match="flatten"):
        getattr(td, api)(inplace=True)
    with pytest.raises(RuntimeError, match="locked"):  # used to be the KeyError
        getattr(td.lock_(), api)(inplace=True)


def test_popitem_of_a_locked_empty_container_reports_the_lock():
    with pytest.raises(RuntimeError, match="locked"):
        TensorDict({}, []).lock_().popitem()
    with pytest.raises(KeyError, match="empty"):
        TensorDict({}, []).popitem()


def test_a_locked_nested_level_refuses_pop_and_exclude_through_its_unlocked_parent():
    td = _tree()
    td["n"].lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.pop(("n", "missing"), None)
    with pytest.raises(RuntimeError, match="locked"):
        td.exclude(("n", "x"), inplace=True)  # used to remove it from the locked level
    assert _keys(td, True) == ["a", "n", ("n", "x"), ("n", "s"), "t"]
    assert list(td.exclude(("n", "x")).keys(True)) == ["a", "n", ("n", "s"), "t"]


def test_a_tensorclass_read_from_a_locked_parent_stays_locked():
    td = _with_pair().lock_()
    pair = td["p"]
    with pytest.raises(RuntimeError, match="unlock that parent first"):
        pair.unlock_()  # used to succeed, and then pair.b = ... wrote into a locked tree
    assert pair.is_locked
    with pytest.raises(RuntimeError):
        pair.b = torch.zeros(2)
    td.unlock_()
    assert not pair.is_locked
    pair.b = torch.zeros(2)
    assert torch.equal(td["p", "b"], torch.zeros(2))


# ---------------------------------------------------------------------- through a TensorClass
def test_exclude_reaches_through_a_tensorclass():
    td = _with_pair()
    out = td.exclude(("p", "a"))  # used to leave ("p", "a") in place, silently
    assert _keys(out, True) == ["x", "p", ("p", "b")]
    assert out["p"].a is None and _keys(td, True) == ["x", "p", ("p", "a"), ("p", "b")]
    td.exclude(("p", "b"), inplace=True)
    assert _keys(td, True) == ["x", "p", ("p", "a")] and td["p"].b is None


def test_select_and_empty_keep_a_nested_tensorclass():
    td = _with_pair()
    picked = td.select(("p", "a"))
    assert type(picked["p"]) is Pair  # used to be a TensorDict
    assert torch.equal(picked["p"].a, td["p"].a) and picked["p"].b is None
    emptied = td.empty(recurse=True)
    assert type(emptied["p"]) is Pair and _keys(emptied, True) == ["p"]


# ---------------------------------------------------------------------- is_leaf
def test_is_leaf_stops_the_walk_at_the_containers_it_calls_leaves():
    td = TensorDict({"a": torch.zeros(()), "n": {"x": torch.zeros(()), "m": {"y": 0}}}, [])
    everything = lambda cls: True  # noqa: E731
    # a nested container that is a leaf is one entry: its keys are not listed
    assert list(td.keys(True, True, is_leaf=everything)) == ["a", "n"]
    assert list(td.keys(True, False, is_leaf=everything)) == ["a", "n"]
    assert [k for k, _ in td.items(True, True, is_leaf=everything)] == ["a", "n"]
    assert list(td.keys(True, True, is_leaf=everything)) == list(
        td.flatten_keys(is_leaf=everything).keys()
    )
    levels = lambda cls: issubclass(cls, TensorDict)  # noqa: E731
    assert list(td.keys(True, True, is_leaf=levels)) == ["n"]


# ---------------------------------------------------------------------- keys_to_update
def test_keys_to_update_writes_what_update_writes_over_a_leaf():
    source = {"a": {"b": torch.ones(2)}, "t": "new"}
    expected = _tree().update(source)
    got = _tree().update(source, keys_to_update=["a"])  # used to be a KeyError
    assert (
        _keys(got, True)
        == _keys(expected, True)
        == ["a", ("a", "b"), "n", ("n", "x"), ("n", "s"), "t"]
    )
    assert got["t"] == "top"  # not a wanted key
    assert torch.equal(got["a", "b"], torch.ones(2))


def test_keys_to_update_limits_a_merge_into_an_existing_level():
    td = _tree()
    td.update({"n": {"x": torch.full((2,), 5.0), "y": torch.ones(2)}}, keys_to_update=[("n", "y")])
    assert torch.equal(td["n", "x"], torch.ones(2)) and torch.equal(td["n", "y"], torch.ones(2))
    td.update({"n": {"x": torch.full((2,), 5.0), "s": "new"}}, keys_to_update=["n"], clone=True)
    assert torch.equal(td["n", "x"], torch.full((2,), 5.0)) and td["n", "s"] == "new"


# ---------------------------------------------------------------------- not a key
@pytest.mark.parametrize("not_a_key", [("a", 0), (), 0, ["a"]])
def test_membership_of_what_is_not_a_key_raises(not_a_key):
    with pytest.raises(TypeError, match="NestedKey"):
        _ = not_a_key in _tree()  # ("a", 0) and () used to be False
    for view in (_tree().keys(), _tree().keys(include_nested=True)):
        with pytest.raises(TypeError, match="always strings"):
            _ = not_a_key in view  # used to be False


def test_a_nested_key_in_the_top_level_keys_is_a_mistake():
    td = _tree()
    assert ("n", "x") in td.keys(include_nested=True) and ("n", "x") in td
    with pytest.raises(TypeError, match="include_nested=True"):
        _ = ("n", "x") in td.keys()  # noqa: SIM118 (used to be False; it is one level down)
    top = td.keys()
    assert ("a",) in top and "zz" not in top  # a one-element tuple is its key


@pytest.mark.parametrize("api", ["get", "pop"])
def test_the_empty_tuple_error_names_the_api(api):
    with pytest.raises(KeyError, match=rf"TensorDict\.{api}: an empty tuple is not a key"):
        getattr(_tree(), api)(())


def test_pop_of_a_missing_key_says_how_to_get_a_default():
    with pytest.raises(KeyError, match=r"You are trying to pop key 'z'.*td\.pop\(key, None\)"):
        _tree().pop("z")


def test_select_gives_its_own_copy_of_a_nested_tensorclass():
    td = _with_pair().lock_()
    picked = td.select("p")
    assert picked["p"] is not td["p"]  # used to be the same, locked, instance
    assert not picked["p"].is_locked
    picked["p"].b = torch.zeros(2)  # reaches only the selection
    assert torch.equal(td["p", "b"], torch.ones(2))
    assert picked["p"].a is td["p"].a  # the tensors are shared, as select documents


def test_unflatten_keys_reports_a_clash_with_a_field_of_a_tensorclass():
    td = TensorDict({"p": Pair(a=torch.zeros(2), batch_size=[2]), "p.a": torch.ones(2)}, [2])
    with pytest.raises(KeyError, match="both unflatten"):
        td.unflatten_keys()  # used to overwrite p.a silently
    td = TensorDict({"p": Pair(a=torch.zeros(2), batch_size=[2]), "p.b": torch.ones(2)}, [2])
    out = td.unflatten_keys()
    assert type(out["p"]) is Pair and torch.equal(out["p"].b, torch.ones(2))
