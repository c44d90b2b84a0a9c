"""Nested levels carry their parent's dim names on the batch dims they share."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


def test_a_level_written_into_a_named_container_takes_its_names():
    inner = TensorDict({"b": torch.zeros(3, 2)}, [3, 2])
    outer = TensorDict({"a": inner}, batch_size=[3], names=["x"])
    assert outer["a"].names == ["x", None]
    assert inner.names == [None, None]  # the caller's object is not renamed
    assert torch.equal(outer["a", "b"], inner["b"])
    outer["n"] = {"q": torch.zeros(3)}
    assert outer["n"].names == ["x"]


def test_an_unnamed_container_takes_the_names_of_a_named_level():
    outer = TensorDict({"c": torch.zeros(3)}, batch_size=[3])
    outer["a"] = TensorDict({"q": torch.zeros(3, 4)}, [3, 4], names=["x", "y"])
    assert outer.names == ["x"]
    assert outer["a"].names == ["x", "y"]


def test_clashing_names_are_refused_and_nothing_is_written():
    outer = TensorDict({"c": torch.zeros(3)}, batch_size=[3], names=["x"])
    with pytest.raises(RuntimeError, match="names"):
        outer["m"] = TensorDict({"q": torch.zeros(3)}, [3], names=["y"])
    assert "m" not in outer


@pytest.mark.parametrize(
    "op",
    [
        lambda td: td.cumsum(1),
        lambda td: td.cumprod(0),
        lambda td: td.flip(0),
        lambda td: td.roll(1, 1),
        lambda td: td.roll((1, 2), (0, 1)),
    ],
    ids=["cumsum", "cumprod", "flip", "roll", "roll2"],
)
def test_ops_that_move_elements_keep_the_names_of_nested_levels(op):
    # a nested level with more batch dims than its parent keeps the parent's names
    td = TensorDict(
        {"a": torch.randn(3, 4), "n": TensorDict({"b": torch.randn(3, 4, 5)}, [3, 4, 5])},
        [3, 4],
        names=["x", "y"],
    )
    out = op(td)
    assert out.names == ["x", "y"]
    assert out["n"].names == ["x", "y", None]
    assert out["n"].batch_size == torch.Size([3, 4, 5])
    assert torch.equal(out["n", "b"], op(TensorDict({"b": td["n", "b"]}, [3, 4]))["b"])


class _Frozen(TensorClass["frozen"]):
    x: torch.Tensor


def test_a_frozen_tensorclass_written_into_a_named_container_is_named_by_a_copy():
    frozen = _Frozen(x=torch.zeros(3, 2), batch_size=[3])
    outer = TensorDict({"f": frozen}, batch_size=[3], names=["x"])
    assert outer["f"].names == ["x"] and outer["f"]._frozen
    assert frozen.names == [None]
    assert outer["f"].x is frozen.x


def test_naming_a_container_never_renames_a_frozen_tensorclass_it_holds():
    frozen = _Frozen(x=torch.zeros(3, 2), batch_size=[3])
    outer = TensorDict({"f": frozen}, batch_size=[3])
    outer.names = ["x"]
    assert outer["f"].names == ["x"] and type(outer["f"]) is _Frozen and outer["f"]._frozen
    assert frozen.names == [None]  # the frozen instance itself never changes
    renamed = outer.rename("y")
    assert renamed["f"].names == ["y"] and outer["f"].names == ["x"]


def test_rename_of_a_frozen_tensorclass_returns_a_renamed_frozen_copy():
    frozen = _Frozen(x=torch.zeros(3, 2), batch_size=[3])
    renamed = frozen.rename("k")
    assert renamed.names == ["k"] and renamed._frozen and frozen.names == [None]
