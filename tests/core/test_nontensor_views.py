"""Elements read from a NonTensorStack by basic indexing write back into it.

The reference is a nested Python list edited by hand.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdfunc import NonTensorData, NonTensorStack, TensorDict


def test_element_write_reaches_the_stack():
    stack = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    expected = [["a", "b"], ["c", "d"]]
    row = stack[1]
    row[0] = "x"
    expected[1][0] = "x"
    assert stack.tolist() == expected and row.tolist() == ["x", "d"]
    stack[1, 1] = "y"  # written through the stack meanwhile: the row does not undo it
    expected[1][1] = "y"
    row[0] = "z"
    expected[1][0] = "z"
    assert stack.tolist() == expected and row.tolist() == ["z", "y"]


def test_element_of_element_and_update():
    stack = NonTensorStack("a", "b")
    stack[0][...] = "c"
    stack[1].update(NonTensorData("d"))
    assert stack.tolist() == ["c", "d"]
    single = NonTensorStack("a string")
    single[0][True] = NonTensorStack("another string")
    assert single[0].data == "another string"


@pytest.mark.parametrize("index", [None, True])
def test_setitem_with_new_dims(index):
    stack = NonTensorStack("0", "1")
    stack[:, index] = NonTensorStack(NonTensorStack("2", "3"), stack_dim=1)
    assert stack.tolist() == ["2", "3"]


def test_advanced_index_gives_a_copy():
    stack = NonTensorStack("a", "b")
    picked = stack[[0, 0]]  # an element twice: a copy, as for tensors
    picked[0] = "x"
    assert stack.tolist() == ["a", "b"] and picked.tolist() == ["x", "a"]


def test_element_of_a_stack_in_a_tensordict():
    td = TensorDict({"s": NonTensorStack.from_list([["a", "b"], ["c", "d"]])}, [2, 2])
    td[0].get("s")[1] = "q"
    assert td["s"] == [["a", "q"], ["c", "d"]]


def test_pickled_element_leaves_its_stack_behind():
    stack = NonTensorStack.from_list(list(range(100)))
    element = stack[3:5]
    copy = pickle.loads(pickle.dumps(element))
    assert copy.tolist() == [3, 4] and "_view_of" not in copy.__dict__
    assert len(pickle.dumps(element)) < len(pickle.dumps(stack))


def test_non_tensor_data_holds_one_value():
    leaf = NonTensorData("a", batch_size=[2])
    with pytest.raises(TypeError, match="one value for its whole batch"):
        leaf[0] = "b"
    leaf[:] = "b"
    assert leaf.tolist() == ["b", "b"] and type(leaf) is NonTensorData
    with pytest.raises(ValueError, match="Cannot update a NonTensorDataBase object"):
        NonTensorData(1, batch_size=[2]).update(NonTensorStack(2, 3))
    assert NonTensorData(1, batch_size=[2]).maybe_to_stack().update(
        NonTensorStack(2, 3)
    ).tolist() == [2, 3]


def test_in_place_writes_through_an_index_reach_the_stack():
    # as for a tensor entry: set_ / update_ on td[index] write into the parent's stack
    td = TensorDict({"x": torch.zeros(3)}, [3])
    td["st"] = NonTensorStack("a", "b", "c")
    td[0].set_("st", "Z")
    assert list(td["st"]) == ["Z", "b", "c"]
    td[1:].set_("st", NonTensorStack("P", "Q"))
    assert list(td["st"]) == ["Z", "P", "Q"]
    td[1:].update_({"st": "R", "x": torch.ones(2)})
    assert list(td["st"]) == ["Z", "R", "R"] and td["x"].tolist() == [0.0, 1.0, 1.0]
    # atomic: a bad entry of the same update writes nothing
    with pytest.raises(ValueError):
        td[0:2].update_({"st": "S", "x": torch.ones(5)})
    assert list(td["st"]) == ["Z", "R", "R"] and td["x"].tolist() == [0.0, 1.0, 1.0]
    grid = TensorDict({"x": torch.zeros(2, 2)}, [2, 2])
    grid["st"] = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    grid[:, 1].set_("st", "W")
    assert grid["st"] == [["a", "W"], ["c", "W"]]


# ---------------------------------------------------------------- against torch's views
# A tensor entry "x" and a text entry "s" hold the same numbers (str(k) in "s"). Every
# write goes to both, through containers and views read by basic indexing; torch's
# own view semantics decide what every view of "x" shows, and "s" must agree.


def _agree(container) -> None:
    x, s = container["x"].tolist(), container["s"]
    expected = _as_text(x)
    assert (s if isinstance(s, str) else list(s)) == expected


def _as_text(value):
    return [_as_text(v) for v in value] if isinstance(value, list) else str(value)


def _write(container, index, k: int) -> None:
    container[index] = TensorDict({"x": torch.tensor(k), "s": str(k)}, [])


def test_a_view_sees_writes_to_its_container_and_its_writes_reach_it():
    td = TensorDict({"x": torch.arange(4), "s": [str(i) for i in range(4)]}, [4])
    view, element = td[1:], td[2]
    _write(td, 1, 10)  # through the container: both views see it
    _write(td, 2, 12)
    _write(view, 0, 11)  # through a view, after the container's write: reaches td
    for container in (td, view, element):
        _agree(container)
    assert td["s"] == ["0", "11", "12", "3"]


@pytest.mark.parametrize(
    "derive",
    [
        lambda t: t.apply(lambda x: x * 2),
        lambda t: t + 1,
        lambda t: t * 2,
        lambda t: t.abs(),
        lambda t: t.sqrt(),
        lambda t: t.clamp(0, 10),
        lambda t: torch.exp(t),
        lambda t: torch.lerp(t, t, 0.5),
        lambda t: torch.where(torch.ones(3, dtype=torch.bool), t, t),
    ],
)
def test_a_write_into_the_result_of_a_tensor_op_leaves_the_original_alone(derive):
    td = TensorDict({"x": torch.arange(1.0, 4.0), "s": ["a", "b", "c"]}, [3])
    _ = td[0]  # an element read through an index: writes into td's stack are in place
    derived = derive(td)  # new tensors: a write into it must reach none of td's values
    derived[0] = TensorDict({"x": torch.tensor(0.0), "s": "z"}, [])
    assert td["x"].tolist() == [1.0, 2.0, 3.0] and td["s"] == ["a", "b", "c"]
    assert derived["s"] == ["z", "b", "c"]


_INDICES = [0, 1, -1, slice(None), slice(1, None), slice(0, 2), slice(None, None, 2), ...]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_views_and_writes_agree_with_tensor_views(data):
    rank = data.draw(st.sampled_from([1, 2]))
    shape = [4] if rank == 1 else [3, 4]
    numbers = torch.arange(12)[: 4 * (rank * 2 - 1)].reshape(shape)
    td = TensorDict({"x": numbers.clone(), "s": _as_text(numbers.tolist())}, shape)
    containers = [td]
    for _ in range(data.draw(st.integers(1, 12))):
        container = data.draw(st.sampled_from(containers))
        if not container.batch_size:
            index = ...
        else:  # an int index must exist in the container's first dim (a view may have 1 row)
            rows = container.batch_size[0]
            valid = [i for i in _INDICES if not isinstance(i, int) or -rows <= i < rows]
            index = data.draw(st.sampled_from(valid))
        action = data.draw(st.sampled_from(["view", "write", "leaf write"]))
        k = data.draw(st.integers(20, 99))
        if action == "view" and container.batch_size:
            containers.append(container[index])
        elif action == "write":
            _write(container, index, k)
        elif container.batch_size:  # into the entries read from the container
            container.get("x")[index] = k
            container.get("s")[index] = str(k)
        for each in containers:
            _agree(each)
