"""``apply`` and friends, leaf-wise methods, arithmetic and comparisons.

References are computed with plain tensors and Python loops over the leaves.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict


def _pair():
    g = torch.Generator().manual_seed(2)
    left = TensorDict(
        {"a": torch.randn(3, 2, generator=g), "n": {"b": torch.randn(3, generator=g)}}, [3]
    )
    right = TensorDict(
        {"a": torch.randn(3, 2, generator=g), "n": {"b": torch.randn(3, generator=g)}}, [3]
    )
    return left, right


# ---------------------------------------------------------------- apply
def test_apply_maps_every_tensor_leaf():
    td, _ = _pair()
    td["s"] = "keep"
    out = td.apply(lambda x: x * 2)
    assert torch.equal(out["a"], td["a"] * 2)
    assert torch.equal(out["n", "b"], td["n", "b"] * 2)
    assert out["s"] == "keep"
    assert out.batch_size == td.batch_size and out["n"].batch_size == td["n"].batch_size


def test_apply_several_tensordicts():
    left, right = _pair()
    out = left.apply(lambda x, y: x - y, right)
    assert torch.equal(out["a"], left["a"] - right["a"])
    assert torch.equal(out["n", "b"], left["n", "b"] - right["n", "b"])
    three = left.apply(lambda x, y, z: x + y + z, right, right)
    assert torch.allclose(three["a"], left["a"] + 2 * right["a"])


def test_apply_none_drops_keys_and_empty_nested():
    data = TensorDict(
        {"a": torch.tensor(1.0, dtype=torch.float), "b": torch.tensor(1, dtype=torch.int64)}, []
    )
    data_float = data.apply(lambda x: x if x.dtype == torch.float else None)
    assert "b" not in data_float and "a" in data_float
    td = TensorDict({"x": torch.zeros(2), "n": {"i": torch.zeros(2, dtype=torch.long)}}, [2])
    out = td.apply(lambda x: x if x.is_floating_point() else None)
    assert list(out.keys()) == ["x"]
    kept = td.apply(lambda x: x if x.is_floating_point() else None, filter_empty=False)
    assert list(kept.keys(True)) == ["x", "n"]


def test_apply_with_new_batch_size():
    td = TensorDict({"a": torch.zeros(3, 4, 2), "n": {"b": torch.zeros(3, 4)}, "s": "v"}, [3, 4])
    out = td.apply(lambda x: x.sum(0), batch_size=[4])
    assert out.batch_size == torch.Size([4])
    assert out["n"].batch_size == torch.Size([4])
    assert out["a"].shape == torch.Size([4, 2])
    assert out._get_leaf("s").batch_size == torch.Size([4])


def test_apply_names_argument():
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["x", "y"])
    assert td.apply(lambda t: t + 1).names == ["x", "y"]
    assert td.apply(lambda t: t + 1, names=["p", "q"]).names == ["p", "q"]
    assert td.apply(lambda t: t[0], batch_size=[3]).names == [None]


def test_apply_inplace_and_apply_():
    td, other = _pair()
    a = td["a"]
    expected = a * 3
    assert td.apply_(lambda x: x * 3) is td
    assert td["a"] is a and torch.equal(a, expected)
    before = td["n", "b"].clone()
    td.apply(lambda x, y: x + y, other, inplace=True)
    assert torch.equal(td["n", "b"], before + other["n", "b"])


def test_named_apply():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2])
    seen = []

    def record(key, value):
        seen.append(key)
        return value + len(key)

    out = td.named_apply(record)
    assert seen == ["a", "b"]
    assert out["n", "b"].tolist() == [1.0, 1.0]
    seen.clear()
    out = td.named_apply(record, nested_keys=True)
    assert seen == [("a",), ("n", "b")]
    assert out["n", "b"].tolist() == [2.0, 2.0]
    dropped = td.named_apply(lambda key, value: None if key == "a" else value)
    assert list(dropped.keys(True, True)) == [("n", "b")]


def test_apply_uniform_like_the_seed():
    data = TensorDict({"key 1": torch.ones(3, 4, 5)}, batch_size=[3, 4])
    uniform = data.apply(lambda tensor: tensor.uniform_())
    assert uniform["key 1"] is data["key 1"]  # uniform_ works in place and returns its input
    assert ((uniform["key 1"] >= 0) & (uniform["key 1"] < 1)).all()


# ---------------------------------------------------------------- leaf-wise
def test_clone_detach_contiguous():
    td, _ = _pair()
    td["s"] = "v"
    clone = td.clone()
    assert clone["a"] is not td["a"] and torch.equal(clone["a"], td["a"])
    assert clone["s"] == "v"
    clone.set_("s", "other")
    assert td["s"] == "v"
    shallow = td.clone(recurse=False)
    assert shallow["a"] is td["a"]
    grad = td["a"].clone().requires_grad_()
    td["a"] = grad * 2
    detached = td.detach()
    assert not detached["a"].requires_grad and td["a"].requires_grad
    nc = TensorDict({"t": torch.zeros(3, 2).t()}, [2])
    assert nc.contiguous()["t"].is_contiguous()


def test_to_dtype_and_device():
    td, _ = _pair()
    td["i"] = torch.ones(3, dtype=torch.int64)
    double = td.to(torch.float64)
    assert double["a"].dtype == torch.float64 and double["i"].dtype == torch.float64
    assert double.device is None
    meta = td.to("meta")
    assert meta.device == torch.device("meta") and meta["n"].device == torch.device("meta")
    assert meta["n", "b"].device.type == "meta"
    assert td.to(torch.device("cpu")).device == torch.device("cpu")
    assert td.to() is td
    assert td.float()["i"].dtype == torch.float32
    assert td.double()["a"].dtype == torch.float64
    assert td.half()["a"].dtype == torch.float16
    assert td.bfloat16()["a"].dtype == torch.bfloat16
    assert td.cpu().device == torch.device("cpu")
    other = TensorDict({}, [], device="meta")
    assert td.to(other).device == torch.device("meta")


def test_in_place_leafwise_methods():
    td, _ = _pair()
    assert td.zero_() is td
    assert td["a"].sum() == 0 and td["n", "b"].sum() == 0
    td.fill_("a", 2.0)
    assert (td["a"] == 2).all()
    td.fill_("n", 3.0)
    assert (td["n", "b"] == 3).all()
    td.requires_grad_()
    assert td["a"].requires_grad and td["n", "b"].requires_grad
    td.detach_()
    assert not td["a"].requires_grad


def test_share_memory_and_is_shared():
    td, _ = _pair()
    assert not td.is_shared()
    assert td.share_memory_() is td
    assert td.is_shared() and td["n", "b"].is_shared()
    assert not TensorDict().is_shared()


# ---------------------------------------------------------------- arithmetic
@pytest.mark.parametrize(
    "op",
    [
        lambda x, y: x + y,
        lambda x, y: x - y,
        lambda x, y: x * y,
        lambda x, y: x / y,
        lambda x, y: x**2,
        lambda x, y: 2 + x,
        lambda x, y: 1 - x,
        lambda x, y: 3 * x,
        lambda x, y: 1 / (x.abs() + 1),
        lambda x, y: -x,
        lambda x, y: abs(x),
    ],
)
def test_arithmetic_matches_leafwise(op):
    left, right = _pair()
    out = op(left, right)
    assert torch.allclose(out["a"], op(left["a"], right["a"]))
    assert torch.allclose(out["n", "b"], op(left["n", "b"], right["n", "b"]))
    assert out.batch_size == left.batch_size


def test_arithmetic_with_tensor_and_integer_ops():
    td = TensorDict({"a": torch.arange(6).reshape(3, 2)}, [3])
    assert torch.equal((td // 4)["a"], td["a"] // 4)
    assert torch.equal((td % 4)["a"], td["a"] % 4)
    assert torch.equal((td + torch.tensor([1, 2]))["a"], td["a"] + torch.tensor([1, 2]))
    mask = td > 2
    assert torch.equal((~mask)["a"], ~(td["a"] > 2))
    assert torch.equal((mask & (td < 5))["a"], (td["a"] > 2) & (td["a"] < 5))
    assert torch.equal((mask | (td < 1))["a"], (td["a"] > 2) | (td["a"] < 1))
    assert torch.equal((mask ^ (td < 5))["a"], (td["a"] > 2) ^ (td["a"] < 5))


def test_in_place_arithmetic():
    left, right = _pair()
    a = left["a"]
    expected = (a + right["a"]) * 2 - 1
    left += right
    left *= 2
    left -= 1
    assert left["a"] is a and torch.allclose(a, expected)
    left /= 2
    assert torch.allclose(a, expected / 2)
    left.add_(right, alpha=2)
    assert torch.allclose(a, expected / 2 + 2 * right["a"])
    left.mul_(0).add_(1).sub_(right).div_(2)
    assert torch.allclose(a, (1 - right["a"]) / 2)
    start = left.clone()
    left.lerp_(right, 0.5)
    assert torch.allclose(left["a"], start["a"] + 0.5 * (right["a"] - start["a"]))


def test_comparisons_and_all_any():
    left, right = _pair()
    eq = left == left.clone()
    assert isinstance(eq, TensorDict)
    assert eq["a"].dtype == torch.bool and eq.all()
    ne = left != right
    assert torch.equal(ne["a"], left["a"] != right["a"])
    assert ne.any()
    assert not (left != left).any()
    lt = left < right
    assert torch.equal(lt["n", "b"], left["n", "b"] < right["n", "b"])
    assert torch.equal((left <= 0)["a"], left["a"] <= 0)
    assert torch.equal((left >= 0)["a"], left["a"] >= 0)
    assert torch.equal((left > right)["a"], left["a"] > right["a"])
    assert (left == 5).any() is False
    assert isinstance(eq.all(), bool)
    assert left != None  # noqa: E711
    assert not (left == None)  # noqa: E711, SIM201


def test_eq_with_non_tensor_leaves():
    a = TensorDict({"x": torch.zeros(2), "s": "v"}, [2])
    b = TensorDict({"x": torch.zeros(2), "s": "w"}, [2])
    assert (a == a.clone()).all()
    result = a == b
    assert result["s"].tolist() == [False, False]
    assert not result.all()
    assert (a != b)["s"].all()


def test_norm():
    td, _ = _pair()
    norms = td.norm()  # one 2-norm per leaf, batch_size=[] (tensordict's norm)
    assert norms.batch_size == torch.Size([])
    assert torch.allclose(norms["a"], td["a"].norm())
    assert torch.allclose(norms["n", "b"], td["n", "b"].norm())
