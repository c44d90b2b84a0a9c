"""A stack of per-element values inside a transform that maps its batch dims.

Inside ``vmap`` the function runs once for all the elements, so no element's value
exists there: reading the stack must raise, not return the whole list as if it were
one element's. Carried through untouched, it comes back out as it went in.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch.func import grad, vmap

from tdfunc import NonTensorData, NonTensorStack, TensorClass, TensorDict


def _labelled() -> TensorDict:
    td = TensorDict({"x": torch.arange(3.0)}, [3])
    td["label"] = NonTensorStack.from_list(["p", "q", "q"])
    return td


class _Labelled(TensorClass):
    x: torch.Tensor
    label: str


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t["label"],
        lambda t: t.get("label").tolist(),
        lambda t: t.get("label")[0],
        lambda t: t.get("label") == "p",
        lambda t: t.get_non_tensor("label"),
    ],
)
def test_reading_inside_vmap_raises(read):
    def f(t):
        read(t)
        return t["x"]

    with pytest.raises(RuntimeError, match="one value per element"):
        vmap(f)(_labelled())


def test_a_tensorclass_field_inside_vmap_raises():
    stacked = torch.stack([_Labelled(x=torch.tensor(1.0), label=s) for s in "pqq"])
    with pytest.raises(RuntimeError, match="one value per element"):
        vmap(lambda t: t.x * (t.label == "p"))(stacked)
    assert vmap(lambda t: t.apply(lambda x: x * 2))(stacked).label == ["p", "q", "q"]


def test_carried_through_and_back():
    td = _labelled()
    out = vmap(lambda t: t * 2)(td)
    assert type(out.get("label")) is NonTensorStack and list(out["label"]) == ["p", "q", "q"]
    assert torch.equal(out["x"], td["x"] * 2)
    # a pytree round trip inside the transform keeps it carried, and out it comes
    out = vmap(lambda t: pytree.tree_map(lambda x: x + 1, t))(td)
    assert type(out.get("label")) is NonTensorStack and list(out["label"]) == ["p", "q", "q"]


def test_nested_and_other_dims():
    td = TensorDict({"x": torch.zeros(2, 3)}, [2, 3])
    values = [["a", "b", "c"], ["d", "e", "f"]]
    td["s"] = NonTensorStack.from_list(values)
    for out in (
        vmap(vmap(lambda t: t + 1))(td),
        vmap(lambda t: t + 1, in_dims=1, out_dims=1)(td),
    ):
        assert type(out.get("s")) is NonTensorStack and out["s"] == values
    with pytest.raises(RuntimeError, match="one value per element"):
        vmap(vmap(lambda t: (t["s"], t)[1]))(td)


def test_readable_where_nothing_is_mapped():
    td = _labelled()
    # not mapped: every call sees the whole batch
    out = vmap(lambda x, t: x + len(t["label"]), in_dims=(0, None))(torch.zeros(2), td)
    assert out.tolist() == [3.0, 3.0]
    # grad keeps the batch: the values are still per element
    g = grad(lambda t: (t["x"] ** 2).sum() * (t["label"][0] == "p"))(td)
    assert torch.equal(g["x"], 2 * td["x"]) and list(g["label"]) == ["p", "q", "q"]
    # one value for the whole batch is readable anywhere
    td["mode"] = NonTensorData("train", batch_size=[3])
    assert vmap(lambda t: t["x"] * (t["mode"] == "train"))(td).tolist() == [0.0, 1.0, 2.0]
