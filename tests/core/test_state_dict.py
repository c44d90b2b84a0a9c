"""``state_dict`` as tensordict documents it: ``_metadata`` attribute, ``flatten=``, legacy."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from tdfunc import TensorClass, TensorDict


def _nested() -> TensorDict:
    return TensorDict(
        {"a": torch.arange(6.0).view(2, 3), "n": {"b": torch.arange(2.0), "s": "text"}},
        [2],
        names=["batch"],
    )


def test_metadata_is_an_attribute_like_nn_module():
    module = nn.Linear(3, 2)
    reference = module.state_dict()
    state = TensorDict.from_module(module).state_dict()
    assert type(state) is type(reference) is OrderedDict
    assert set(state) == set(reference) and hasattr(state, "_metadata")
    for key in reference:
        assert torch.equal(state[key], reference[key])


def test_moving_values_with_a_comprehension_then_loading():
    td = _nested()
    state = td.state_dict()
    assert "_metadata" not in state and state._metadata[""]["batch_size"] == [2]
    moved = {k: v.to("cpu", torch.float64) for k, v in state.items()}  # a common idiom
    target = td.apply(torch.zeros_like)
    target.load_state_dict(moved)
    assert torch.equal(target["a"], torch.arange(6.0).view(2, 3))
    assert target["a"].dtype == torch.float32  # copied in place, the target keeps its dtype
    assert torch.equal(target["n", "b"], torch.arange(2.0))


def test_levels_are_keyed_by_dotted_prefix():
    state = _nested().state_dict()
    assert list(state) == ["a", "n.b"]
    assert set(state._metadata) == {"", "n"}
    assert state._metadata["n"]["batch_size"] == [2]
    assert state._metadata[""]["names"] == ["batch"]
    assert state._metadata[""]["non_tensor"]["n.s"]["data"] == "text"


def test_round_trip_into_empty_restores_structure_names_and_non_tensors():
    td = _nested()
    back = TensorDict().load_state_dict(td.state_dict())
    assert back.batch_size == torch.Size([2]) and back.names == ["batch"]
    assert back["n", "s"] == "text"
    assert torch.equal(back["a"], td["a"]) and torch.equal(back["n", "b"], td["n", "b"])


def test_flatten_false_gives_nested_ordered_dicts_each_with_metadata():
    td = _nested()
    state = td.state_dict(flatten=False)
    assert list(state) == ["a", "n"] and isinstance(state["n"], OrderedDict)
    assert list(state["n"]) == ["b"]
    assert state._metadata[""]["batch_size"] == [2]
    assert state["n"]._metadata[""]["non_tensor"]["s"]["data"] == "text"
    back = TensorDict().load_state_dict(state)
    assert back["n", "s"] == "text" and torch.equal(back["n", "b"], td["n", "b"])
    target = td.apply(torch.zeros_like)
    target.load_state_dict(state)
    assert torch.equal(target["a"], td["a"])
    # keys containing dots survive nesting without key-path bookkeeping
    dotted = TensorDict({"layer.0": {"w": torch.ones(1)}}).state_dict(flatten=False)
    assert list(dotted) == ["layer.0"] and list(dotted["layer.0"]) == ["w"]


def test_from_flatten_forces_the_reading():
    td = TensorDict({"a.b": torch.ones(1)})
    back = TensorDict().load_state_dict({"a.b": torch.ones(1)}, from_flatten=True)
    assert ("a", "b") in back  # read as flat: the dot splits
    kept = TensorDict({"a.b": torch.zeros(1)}).load_state_dict({"a.b": torch.ones(1)})
    assert torch.equal(kept["a.b"], td["a.b"])  # matched against the target's own keys


def test_destination_must_take_the_attribute():
    destination: OrderedDict = OrderedDict()
    assert _nested().state_dict(destination=destination) is destination
    assert hasattr(destination, "_metadata")
    with pytest.raises(AttributeError, match="_metadata"):
        _nested().state_dict(destination={})


def test_legacy_nested_format_with_batch_size_keys():
    legacy = {
        "a": torch.ones(3, 2),
        "n": {"b": torch.zeros(3), "__batch_size": torch.Size([3]), "__device": None},
        "__batch_size": torch.Size([3]),
        "__device": None,
    }
    back = TensorDict().load_state_dict(legacy)
    assert back.batch_size == torch.Size([3]) and back["n"].batch_size == torch.Size([3])
    assert torch.equal(back["a"], legacy["a"]) and torch.equal(back["n", "b"], legacy["n"]["b"])


def test_legacy_tdfunc_metadata_key_still_loads():
    legacy = {"a.b": torch.ones(2), "_metadata": {"batch_size": [2], "nested": {}}}
    back = TensorDict().load_state_dict(legacy)
    assert back.batch_size == torch.Size([2]) and torch.equal(back["a", "b"], torch.ones(2))


class _Point(TensorClass):
    x: torch.Tensor
    y: torch.Tensor
    label: str


def test_legacy_tensorclass_wrapper_format_loads():
    # the newer TensorClass page: "the legacy format (_tensordict/_non_tensordict wrapper keys)"
    legacy: OrderedDict = OrderedDict()
    legacy["_tensordict"] = OrderedDict(
        x=torch.tensor([1.0, 2.0, 3.0]),
        y=torch.tensor([4.0, 5.0, 6.0]),
        __batch_size=torch.Size([]),
        __device=None,
    )
    legacy["_non_tensordict"] = {"label": "old"}
    point = _Point(x=torch.zeros(3), y=torch.zeros(3), label="new")
    point.load_state_dict(legacy)
    assert torch.equal(point.x, torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(point.y, torch.tensor([4.0, 5.0, 6.0]))
    assert point.label == "old"


def test_tensorclass_state_dict_metadata_attribute_and_flatten():
    point = _Point(x=torch.ones(2), y=torch.zeros(2), label="p", batch_size=[2])
    state = point.state_dict()
    assert set(state) == {"x", "y"} and state._metadata[""]["type"].endswith("_Point")
    other = _Point(x=torch.zeros(2), y=torch.ones(2), label="q", batch_size=[2])
    other.load_state_dict({k: v.clone() for k, v in state.items()})
    assert torch.equal(other.x, torch.ones(2)) and other.label == "q"  # no metadata: tensors only
    other.load_state_dict(point.state_dict(flatten=False))
    assert other.label == "p"


class _Inner(TensorClass):
    z: torch.Tensor
    tag: str = "t"


@pytest.mark.parametrize("flatten", [True, False])
def test_nested_tensorclass_round_trips_in_both_formats(flatten):
    z = torch.arange(6.0).view(2, 3)
    td = TensorDict({"tc": _Inner(z=z, tag="q", batch_size=[2]), "a": torch.zeros(2)}, [2])
    state = td.state_dict(flatten=flatten)
    back = TensorDict().load_state_dict(state)
    assert type(back["tc"]) is _Inner and back["tc"].tag == "q"
    assert torch.equal(back["tc"].z, z)
    target = TensorDict(
        {"tc": _Inner(z=torch.zeros(2, 3), tag="x", batch_size=[2]), "a": torch.ones(2)}, [2]
    )
    storage = target["tc"].z
    target.load_state_dict(state)
    assert target["tc"].z is storage and torch.equal(storage, z)
    assert target["tc"].tag == "q" and torch.equal(target["a"], torch.zeros(2))
