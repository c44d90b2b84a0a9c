"""A nested container's batch size always starts with its parent's."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict


def _parent() -> TensorDict:
    return TensorDict({"n": {"a": torch.zeros(3, 5)}, "e": {}}, [3])


def test_update_with_update_batch_size_on_a_nested_level_is_refused():
    td = _parent()
    child = td["n"]
    with pytest.raises(ValueError, match=r"cannot give batch size \[5\] to the nested TensorDict"):
        child.update(TensorDict({"a": torch.zeros(5)}, [5]), update_batch_size=True)
    assert child.batch_size == (3,) and torch.equal(child["a"], torch.zeros(3, 5))
    assert td[0]["n", "a"].shape == (5,)  # indexing the parent still indexes the child


@pytest.mark.parametrize("reach", ["getitem", "get", "tuple key", "stored"])
def test_an_empty_nested_level_cannot_leave_its_parents_batch_size(reach):
    td = _parent()
    if reach == "stored":
        child = TensorDict({}, [3])
        td["s"] = child
    else:
        child = {"getitem": lambda: td["e"], "get": lambda: td.get("e")}.get(
            reach, lambda: td["e",]
        )()
    with pytest.raises(ValueError, match=r"its parent has batch size \[3\]"):
        child.batch_size = [5]
    with pytest.raises(ValueError, match="its parent has batch size"):
        child.batch_size = []
    child.batch_size = [3, 2]  # still starts with the parent's
    assert child.batch_size == (3, 2)


def test_a_two_level_nested_child_answers_to_its_own_parent():
    td = TensorDict({"n": TensorDict({"m": TensorDict({}, [3, 4])}, [3, 4])}, [3])
    deep = td["n", "m"]
    with pytest.raises(ValueError, match=r"at key 'm': its parent has batch size \[3, 4\]"):
        deep.batch_size = [3]
    deep.batch_size = [3, 4, 2]


def test_updating_through_the_parent_still_resizes_consistently():
    td = TensorDict({"n": {"a": torch.zeros(3, 5)}}, [3])
    td.update(
        TensorDict({"n": TensorDict({"a": torch.zeros(5)}, [5])}, [5]), update_batch_size=True
    )
    assert td.batch_size == (5,) and td["n"].batch_size == (5,)


def test_a_level_removed_from_its_parent_is_free_again():
    td = _parent()
    child = td["e"]
    del td["e"]
    child.batch_size = [7]
    assert child.batch_size == (7,)


@pytest.mark.parametrize("error", [ValueError, RuntimeError])
def test_setting_a_batch_size_the_values_do_not_start_with_raises_either_error(error):
    # tensordict raises RuntimeError here, and tdfunc's writes raise an error that is
    # both: code written against either library catches it
    td = TensorDict({"a": torch.zeros(3, 4)}, [3])
    with pytest.raises(error, match=r"batch_size: cannot set batch size \[4\].*'a'"):
        td.batch_size = [4]
    assert td.batch_size == torch.Size([3])
