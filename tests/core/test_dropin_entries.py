"""Entry-level methods tensordict users call: set_at_ on non-tensor leaves,
``type(dtype)``, ``create_nested``, ``entry_class``, ``filter_empty_``, ``*_like(device=)``,
nested containers with a shorter batch size, locked views, transpose's range error.

References are plain Python lists, dicts and tensors.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorData, TensorClass, TensorDict


class Pair(TensorClass):
    x: torch.Tensor
    label: str


@pytest.mark.parametrize("method", ["update_at_", "copy_at_", "set_at_"])
def test_write_at_index_into_non_tensor_leaf(method):
    values = [0] * 10
    values[1::2] = [1] * 5  # the plain-list reference
    td = TensorDict({"val": NonTensorData(0, batch_size=[10]), "t": torch.zeros(10)}, [10])
    if method == "set_at_":
        td.set_at_("val", 1, slice(1, None, 2))
    else:
        other = TensorDict({"val": NonTensorData(1, batch_size=[5]), "t": torch.ones(5)}, [5])
        getattr(td, method)(other, slice(1, None, 2))
    assert td.get("val").tolist() == values


def test_set_at_non_tensor_nested_mask_and_locked():
    reference = ["a"] * 4
    td = TensorDict({"n": {"s": NonTensorData("a", batch_size=[4])}}, [4])
    mask = torch.tensor([True, False, True, False])
    td.set_at_(("n", "s"), "b", mask)
    reference[0] = reference[2] = "b"
    assert td["n", "s"] == reference
    td.lock_()  # an in-place write: allowed on a locked container
    td.set_at_(("n", "s"), "c", 3)
    reference[3] = "c"
    assert td["n", "s"] == reference


@pytest.mark.parametrize("kind", ["TensorDict", "TensorClass"])
def test_type_casts_every_leaf(kind):
    a, b = torch.zeros(2, 3), torch.ones(2, dtype=torch.int64)
    if kind == "TensorDict":
        obj = TensorDict({"a": a, "n": {"b": b}}, [2])
    else:
        obj = Pair(x=a, label="l", batch_size=[2])
    out = obj.type(torch.float16)
    leaves = [v for v in out.values(True, True) if isinstance(v, torch.Tensor)]
    assert leaves and all(v.dtype is torch.float16 for v in leaves)
    assert torch.equal(leaves[0], a.half())
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        obj.type("torch.FloatTensor")


def test_create_nested_entry_class_filter_empty():
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3], names=["r", "c"])
    td.create_nested(("x", "y"))
    nested = td["x", "y"]
    assert nested.batch_size == torch.Size([2, 3]) and nested.names == ["r", "c"]
    assert nested.is_empty()
    td["s"] = "text"
    assert td.entry_class("a") is torch.Tensor
    assert td.entry_class("s") is NonTensorData
    assert td.entry_class(("x", "y")) is TensorDict
    td["z", "w"] = torch.ones(2, 3)
    td.filter_empty_()
    assert sorted(td.keys(True), key=str) == sorted(["a", "s", "z", ("z", "w")], key=str)
    td.lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.create_nested("q")


@pytest.mark.parametrize("like", [torch.empty_like, torch.zeros_like, torch.ones_like])
def test_like_with_device_sets_the_device(like):
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2, 1)}}, [2])
    out = like(td, device="meta")
    assert out.device == torch.device("meta")
    assert out["n"].device == torch.device("meta")
    assert out["n", "b"].shape == torch.Size([2, 1])  # as like(tensor, device="meta")


def test_nested_container_with_shorter_batch_size_is_extended():
    inner_value = torch.randn(4, 3, 1)
    td = TensorDict({"a": torch.zeros(4, 3)}, [4, 3])
    inner = TensorDict({"inner": inner_value}, [])
    td["x"] = inner
    assert td["x"].batch_size == torch.Size([4, 3])
    assert inner.batch_size == torch.Size([])  # the caller's container is not changed
    assert td["x", "inner"] is inner_value  # same tensor, no copy
    with pytest.raises(ValueError, match="batch size"):
        td["y"] = TensorDict({"inner": torch.randn(4, 1)}, [])


@pytest.mark.parametrize(
    "op",
    [
        lambda t: t.reshape(-1),
        lambda t: t.view(-1),
        lambda t: t.permute(1, 0),
        lambda t: t.transpose(0, 1),
        lambda t: t.unsqueeze(0),
        lambda t: t.flatten(0, 1),
        lambda t: t.unflatten(0, (2, 2)),
    ],
)
def test_views_of_a_locked_container_are_locked(op):
    td = TensorDict({"a": torch.zeros(4, 3, 2), "n": {"b": torch.zeros(4, 3)}}, [4, 3])
    assert not op(td).is_locked
    out = op(td.lock_())
    assert out.is_locked and out["n"].is_locked
    assert not td[0].is_locked and not td.clone().is_locked  # copies are not


def test_transpose_out_of_range_is_index_and_value_error():
    td = TensorDict({"a": torch.zeros(2, 3)}, [2, 3])
    with pytest.raises(IndexError):
        torch.zeros(2, 3).transpose(-3, 0)  # torch's error type for tensors
    with pytest.raises(IndexError, match="dim0 and dim1 must be within the range"):
        td.transpose(-3, 0)
    with pytest.raises(ValueError, match="dim0 and dim1 must be within the range"):
        td.transpose(0, 2)


def test_none_entry_compares_as_an_unset_field():
    class Node(TensorClass):
        x: torch.Tensor
        child: Node | None = None

    node = Node(x=torch.ones(2), child=Node(x=torch.zeros(2), batch_size=[2]), batch_size=[2])
    plain = node.to_tensordict(retain_none=True)  # keeps the unset fields as None entries
    assert (node == plain).all()
    assert not (node == plain.apply(lambda t: t + 1)).any()
    with pytest.raises(KeyError, match="same keys"):
        _ = node == TensorDict({"x": torch.ones(2)}, [2])


def test_pad_safe_checks_before_anything_changes():
    td = TensorDict({"a": torch.ones(3, 4), "b": torch.zeros(3, 4, 2)}, [3, 4])
    a, b = td["a"], td["b"]
    for safe in (True, False):
        with pytest.raises(RuntimeError):
            td.pad([-10, 0, 0, 0], inplace=True, safe=safe)
        assert td["a"] is a and td["b"] is b and td.batch_size == torch.Size([3, 4])
    with pytest.raises(RuntimeError, match="negative output size"):
        td.pad([-10, 0])
    cropped = td.pad([-1, 0, 0, 1])  # negative sizes crop, as torch.nn.functional.pad
    assert torch.equal(cropped["a"], torch.nn.functional.pad(a, [0, 1, -1, 0]))


def test_from_dict_batch_dims_holds_at_every_level():
    data = {"a": torch.zeros(3, 4, 5), "b": {"c": torch.zeros(3, 4, 5, 6)}}
    td = TensorDict.from_dict(data, batch_dims=1)
    assert td.batch_size == td["b"].batch_size == torch.Size([3])
    td = TensorDict.from_dict(data, auto_batch_size=True)
    assert td.batch_size == torch.Size([3, 4, 5])  # without batch_dims, each level's own
    assert td["b"].batch_size == torch.Size([3, 4, 5, 6])
    with pytest.raises(ValueError, match="both batch_size and batch_dims"):
        TensorDict.from_dict(data, batch_size=[3], batch_dims=1)


def test_depth_counts_levels_holding_leaves():
    plain = {"a": {"b": {"c": {"d": 0}, "e": 0}, "f": 0}, "g": 0}

    def leaf_depth(tree, level=0):  # the reference: depth of the deepest leaf
        return max(
            (leaf_depth(v, level + 1) if isinstance(v, dict) else level for v in tree.values()),
            default=0,
        )

    td = TensorDict(plain)
    assert td.depth == leaf_depth(plain) == 3
    del td["a", "b", "c", "d"]
    del plain["a"]["b"]["c"]["d"]
    assert td.depth == leaf_depth(plain) == 2


def test_split_keys_drops_levels_it_emptied():
    td = TensorDict({"a": 0, "b": {"c": 1}, "d": {"e": 2, "f": 3}, "g": 4, "h": {}})
    first, second, rest = td.split_keys(["a"], [("d", "e"), ("d", "f")])
    assert set(first.keys()) == {"a"}
    assert set(second.keys(True, True)) == {("d", "e"), ("d", "f")}
    assert set(rest.keys()) == {"b", "g", "h"}  # "h" was empty before: kept


def test_expand_as_a_container_expands_leaf_by_leaf():
    small = TensorDict({"a": torch.ones(3, 1, 4), "b": {"c": torch.ones(3, 2, 1, 4)}}, [3])
    big = TensorDict({"a": torch.zeros(2, 3, 5, 4), "b": {"c": torch.zeros(2, 3, 2, 6, 4)}}, [2, 3])
    out = small.expand_as(big)
    assert out.batch_size == out["b"].batch_size == torch.Size([2, 3])
    assert torch.equal(out["a"], small["a"].expand_as(big["a"]))
    assert torch.equal(out["b", "c"], small["b", "c"].expand_as(big["b", "c"]))
    assert small.expand_as(torch.zeros(2, 3)).batch_size == torch.Size([2, 3])


def test_reflected_logical_operators():
    mask = torch.tensor([True, False, True])
    td = TensorDict({"m": mask, "n": {"k": ~mask}}, [3])
    for op in (lambda a, b: a & b, lambda a, b: a | b, lambda a, b: a ^ b):
        out = op(True, td)
        assert torch.equal(out["m"], op(True, mask))
        assert torch.equal(out["n", "k"], op(True, ~mask))


def test_writing_another_class_into_a_tensorclass_at_an_index():
    class Target(TensorClass):
        x: torch.Tensor
        y: torch.Tensor

    class SameFields(TensorClass):
        x: torch.Tensor
        y: torch.Tensor

    class OtherFields(TensorClass):
        x: torch.Tensor
        z: torch.Tensor

    plain = {"x": torch.zeros(3, 2), "y": torch.zeros(3, 2)}
    target = Target(x=plain["x"].clone(), y=plain["y"].clone(), batch_size=[3])
    target[:2] = SameFields(x=torch.ones(2, 2), y=torch.ones(2, 2), batch_size=[2])
    plain["x"][:2] = 1
    plain["y"][:2] = 1
    assert torch.equal(target.x, plain["x"]) and torch.equal(target.y, plain["y"])
    other = OtherFields(x=torch.ones(2, 2), z=torch.ones(2, 2), batch_size=[2])
    with pytest.raises(ValueError, match="same-class or compatible class"):
        target[:2] = other
    with pytest.raises(ValueError, match="not fields of Target"):
        target[0] = {"q": torch.ones(2)}
    assert set(target.keys()) == {"x", "y"}  # nothing was added
    assert torch.equal(target.x, plain["x"])


def test_a_list_that_does_not_fit_the_batch_is_an_error():
    from tdfunc import set_list_to_stack

    rows = [["a"] * 4 for _ in range(3)]
    td = TensorDict({"z": rows}, [3, 4])  # one value per element
    assert td["z"] == rows and td[1, 2]["z"] == rows[1][2]
    with pytest.raises(ValueError, match="batch dimension mismatch") as info:
        TensorDict({"z": ["a", "b", "c"]}, [3, 4])
    assert isinstance(info.value, RuntimeError)  # tensordict's error type too
    with set_list_to_stack(False):
        assert TensorDict({"z": ["a", "b", "c"]}, [3, 4])["z"] == ["a", "b", "c"]
    whole = TensorDict({}, [3, 4]).set_non_tensor("z", ["a", "b", "c"])
    assert whole["z"] == ["a", "b", "c"]


def test_auto_batch_size_with_batch_dims_shrinks_handed_out_levels():
    td = TensorDict({"a": torch.zeros(4, 3, 2), "n": {"b": torch.zeros(4, 3, 2, 5)}}, [4, 3, 2])
    nested = td["n"]  # a level handed out: its parent's batch size is checked on resize
    td.auto_batch_size_(1)
    assert td.batch_size == nested.batch_size == torch.Size([4])
    td.auto_batch_size_()
    assert td.batch_size == torch.Size([4, 3, 2]) and nested.batch_size == torch.Size([4, 3, 2, 5])


def test_from_any_tuples_and_lists():
    pair = (torch.zeros(2), {"inner": (1, 2)})
    td = TensorDict.from_any(pair)
    assert set(td.keys(True, True)) == {"0", ("1", "inner", "0"), ("1", "inner", "1")}
    assert torch.equal(td["0"], pair[0]) and td["1", "inner", "1"].item() == 2
    numbers = [[1.0, 2.0], [3.0, 4.0]]
    assert torch.equal(TensorDict.from_any(numbers), torch.tensor(numbers))
    ragged = [[[1, 2], [3]], [[4], [5, 6, 7]]]  # regular over 2 dims, ragged below
    stack = TensorDict.from_any(ragged)
    assert stack.batch_size == torch.Size([2, 2])
    assert stack.tolist() == ragged


def test_from_any_converts_tuples_inside_dataclasses_and_named_tuples():
    import collections
    import dataclasses

    @dataclasses.dataclass
    class Data:
        obs: torch.Tensor
        extra: tuple

    extra = (torch.ones(3), {"x": torch.ones(3) * 2})
    td = TensorDict.from_any(Data(obs=torch.zeros(3, 4), extra=extra), auto_batch_size=True)
    # before, the tuple was one non-tensor value and the batch size took the obs' 4 too
    assert td.batch_size == torch.Size([3])
    assert sorted(td.keys(True, True), key=str) == [("extra", "0"), ("extra", "1", "x"), "obs"]
    assert torch.equal(td["extra", "1", "x"], extra[1]["x"])
    Pair = collections.namedtuple("Pair", ["a", "b"])
    td = TensorDict.from_any(Pair(a=(torch.zeros(2),), b=torch.ones(2)))
    assert set(td.keys(True, True)) == {("a", "0"), "b"}


def test_from_tuple_keys_by_position():
    import collections

    plain = (torch.arange(3), (torch.ones(3, 2), {"x": 5}))
    td = TensorDict.from_tuple(plain)
    assert td.batch_size == torch.Size([])
    assert torch.equal(td["0"], plain[0]) and torch.equal(td["1", "0"], plain[1][0])
    assert td["1", "1", "x"].item() == 5
    batched = (torch.arange(3), (torch.ones(3, 2),))
    td = TensorDict.from_tuple(batched, auto_batch_size=True, batch_dims=1)
    assert td.batch_size == td["1"].batch_size == (3,)
    assert TensorDict.from_tuple(batched, batch_size=[3])["1"].batch_size == (3,)
    pair = collections.namedtuple("Pair", ["a", "b"])
    assert sorted(TensorDict.from_tuple(pair(1, 2)).keys()) == ["0", "1"]

    class Point(TensorClass):
        x: torch.Tensor

    assert type(Point.from_tuple((1,))) is TensorDict  # positions are not fields
    with pytest.raises(TypeError, match="from_tuple: expected a tuple, got a list"):
        TensorDict.from_tuple([1, 2])


def test_from_dict_names_the_batch_dims():
    td = TensorDict.from_dict({"a": torch.zeros(3, 4)}, auto_batch_size=True, names=["t", "f"])
    assert td.names == ["t", "f"] and td.batch_size == (3, 4)


def test_backward_errors_name_the_missing_keys():
    x = torch.randn(3, requires_grad=True)
    out = TensorDict(a=x * 2, n={"b": x * 3})
    with pytest.raises(KeyError, match=r"Missing gradient entry for key 'a', \('n', 'b'\)"):
        out.backward(TensorDict(c=torch.ones(3)))
    with pytest.raises(RuntimeError, match="only for scalar outputs"):
        out.backward()
    with pytest.raises(RuntimeError, match="no leaf tensor requiring gradients"):
        TensorDict(a=torch.ones(2)).backward()
    out.backward(TensorDict(a=torch.ones(3), n={"b": torch.ones(3)}))
    assert torch.equal(x.grad, torch.full((3,), 5.0))  # d(2x + 3x)/dx, as plain autograd


def test_to_other_takes_device_and_shared_dtype():
    plain = {"a": torch.zeros(2), "b": torch.arange(2)}
    td = TensorDict(plain, [2])
    half = TensorDict({"x": torch.ones(3, dtype=torch.half)}, [], device="cpu")
    out = td.to(other=half)
    assert out.device == torch.device("cpu")
    assert torch.equal(out["a"], plain["a"].half()) and out["b"].dtype is torch.half
    mixed = TensorDict({"x": torch.ones(3, dtype=torch.half), "y": torch.arange(2)}, [])
    out = td.to(mixed)  # no dtype shared by all its tensors: the dtypes are kept
    assert out["a"].dtype is torch.float32 and out["b"].dtype is torch.int64
    assert td.to(other=torch.zeros(1, dtype=torch.float64))["b"].dtype is torch.float64


def test_to_with_batch_size():
    plain = {"a": torch.zeros(2, 3), "n": {"b": torch.ones(2, 3)}}
    td = TensorDict(plain, [2, 3])
    out = td.to(torch.device("cpu"), torch.int32, batch_size=torch.Size([]))
    assert out.batch_size == torch.Size([]) and out.device == torch.device("cpu")
    assert torch.equal(out["n", "b"], plain["n"]["b"].int())
    only = td.to(batch_size=[2])
    assert only.batch_size == torch.Size([2]) and td.batch_size == torch.Size([2, 3])
    assert only["a"] is plain["a"]  # no copy of the leaves
    with pytest.raises(ValueError):
        td.to(batch_size=[5])
