"""Index and shape ops, constructors, conversions, autograd and consolidation of
containers, against plain tensors leaf by leaf.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle

import numpy as np
import pytest
import torch
from leafwise_helpers import BATCH, NAMES, assert_leafwise, make

import tdfunc
import tdfunc.functional
from tdfunc import TensorDict


# ---------------------------------------------------------------- index and shape ops
@pytest.mark.parametrize("rank", [1, 2])
def test_gather_along_each_batch_dim(rank):
    td, plain = make(rank)
    g = torch.Generator().manual_seed(0)
    for dim in range(rank):
        shape = list(BATCH[rank])
        shape[dim] = 5
        index = torch.randint(0, BATCH[rank][dim], shape, generator=g)

        def ref(v, dim=dim, index=index):
            extra = v.shape[rank:]
            full = index.reshape(index.shape + (1,) * len(extra)).expand(index.shape + extra)
            return torch.gather(v, dim, full)

        expected = {k: ref(v) for k, v in plain.items()}
        assert_leafwise(td.gather(dim, index), expected, shape)
        assert_leafwise(torch.gather(td, dim, index), expected, shape)


@pytest.mark.parametrize("rank", [1, 2])
def test_where_with_containers_tensors_and_numbers(rank):
    td, plain = make(rank, names=True)
    other, other_plain = make(rank, seed=1)
    cond = torch.rand(BATCH[rank], generator=torch.Generator().manual_seed(2)) > 0.5

    def align(c, v):
        return c.reshape(c.shape + (1,) * (v.dim() - c.dim()))

    expected = {k: torch.where(align(cond, v), v, other_plain[k]) for k, v in plain.items()}
    result = td.where(cond, other)
    assert_leafwise(result, expected, BATCH[rank])
    assert result.names == NAMES[rank]
    assert_leafwise(torch.where(cond, td, other), expected, BATCH[rank])
    expected = {k: torch.where(align(cond, v), v, -1.0) for k, v in plain.items()}
    assert_leafwise(td.where(cond, -1.0), expected, BATCH[rank])
    expected = {k: torch.where(align(~cond, v), 0.0, v) for k, v in plain.items()}
    assert_leafwise(torch.where(~cond, 0.0, td), expected, BATCH[rank])


def test_where_pad_fills_the_missing_side():
    cond = torch.tensor([True, False])
    a = TensorDict({"x": torch.ones(2), "only_a": torch.ones(2)}, [2])
    b = TensorDict({"x": torch.zeros(2), "only_b": torch.full((2,), 5.0)}, [2])
    with pytest.raises(KeyError, match="pad="):
        a.where(cond, b)
    out = a.where(cond, b, pad=-1.0)
    assert out["x"].tolist() == [1.0, 0.0]
    assert out["only_a"].tolist() == [1.0, -1.0]
    assert out["only_b"].tolist() == [-1.0, 5.0]
    target = a.where(cond, b, pad=-1.0).zero_()
    assert a.where(cond, b, pad=-1.0, out=target) is target
    assert target["only_b"].tolist() == [-1.0, 5.0]


@pytest.mark.parametrize("rank", [1, 2])
def test_masked_fill_and_masked_select(rank):
    td, plain = make(rank)
    mask = torch.rand(BATCH[rank], generator=torch.Generator().manual_seed(3)) > 0.5

    def align(v):
        return mask.reshape(mask.shape + (1,) * (v.dim() - mask.dim()))

    expected = {k: v.masked_fill(align(v), 7.0) for k, v in plain.items()}
    assert_leafwise(td.masked_fill(mask, 7.0), expected, BATCH[rank])
    assert_leafwise(torch.masked_fill(td, mask, 7.0), expected, BATCH[rank])
    expected_select = {k: v[mask] for k, v in plain.items()}
    assert_leafwise(td.masked_select(mask), expected_select, [int(mask.sum())])
    locked = td.clone().lock_()
    assert locked.masked_fill_(mask, 7.0) is locked
    assert_leafwise(locked, expected, BATCH[rank])
    with pytest.raises(ValueError, match="leading part of the batch size"):
        td.masked_fill(torch.ones(7, dtype=torch.bool), 0.0)


def test_reordering_ops_follow_torch_on_the_batch_shape():
    td, plain = make(2, names=True)
    checks = [
        (lambda x: x.movedim(0, 1), lambda v: v.movedim(0, 1), [4, 3], ["y", "x"]),
        (lambda x: torch.movedim(x, 1, 0), lambda v: v.movedim(1, 0), [4, 3], ["y", "x"]),
        (lambda x: x.swapaxes(0, 1), lambda v: v.swapaxes(0, 1), [4, 3], ["y", "x"]),
        (lambda x: x.narrow(1, 1, 2), lambda v: v.narrow(1, 1, 2), [3, 2], ["x", "y"]),
        (lambda x: x.flip(0, 1), lambda v: v.flip(0, 1), [3, 4], ["x", "y"]),
        (lambda x: torch.flip(x, [1]), lambda v: v.flip(1), [3, 4], ["x", "y"]),
        (lambda x: x.fliplr(), lambda v: v.flip(1), [3, 4], ["x", "y"]),
        (lambda x: x.flipud(), lambda v: v.flip(0), [3, 4], ["x", "y"]),
        (lambda x: x.roll(2, 1), lambda v: v.roll(2, 1), [3, 4], ["x", "y"]),
        (
            lambda x: torch.roll(x, (1, 2), (0, 1)),
            lambda v: v.roll((1, 2), (0, 1)),
            [3, 4],
            ["x", "y"],
        ),
        (lambda x: x.rot90(1, (0, 1)), lambda v: v.rot90(1, (0, 1)), [4, 3], ["y", "x"]),
        (lambda x: x.rot90(2, (0, 1)), lambda v: v.rot90(2, (0, 1)), [3, 4], ["x", "y"]),
    ]
    for op, ref, size, names in checks:
        result = op(td)
        assert_leafwise(result, {k: ref(v) for k, v in plain.items()}, size)
        assert result.names == names, (op, result.names)


def test_growing_ops_follow_torch_on_the_batch_shape():
    td, plain = make(1)

    def rep(v, reps):
        return v.repeat(*reps, *([1] * (v.dim() - 1)))

    assert_leafwise(td.tile(2), {k: rep(v, (2,)) for k, v in plain.items()}, [6])
    assert_leafwise(td.tile(2, 2), {k: rep(v, (2, 2)) for k, v in plain.items()}, [2, 6])
    assert_leafwise(td.repeat(2), {k: rep(v, (2,)) for k, v in plain.items()}, [6])
    assert_leafwise(
        td.repeat_interleave(2, 0), {k: v.repeat_interleave(2, 0) for k, v in plain.items()}, [6]
    )
    counts = torch.tensor([1, 0, 3])
    assert_leafwise(
        torch.repeat_interleave(td, counts, 0),
        {k: v.repeat_interleave(counts, 0) for k, v in plain.items()},
        [4],
    )
    assert_leafwise(
        td[:1].broadcast_to([5]), {k: v[:1].expand(5, *v.shape[1:]) for k, v in plain.items()}, [5]
    )
    scalar, scalar_plain = make(0)
    assert_leafwise(scalar.atleast_1d(), {k: v.unsqueeze(0) for k, v in scalar_plain.items()}, [1])
    assert_leafwise(td.atleast_2d(), {k: v.unsqueeze(0) for k, v in plain.items()}, [1, 3])
    # new batch dims lead (as tensordict documents), unlike torch.atleast_3d on a tensor
    assert_leafwise(
        td.atleast_3d(), {k: v.unsqueeze(0).unsqueeze(0) for k, v in plain.items()}, [1, 1, 3]
    )
    assert_leafwise(torch.atleast_3d(td), {k: v[None, None] for k, v in plain.items()}, [1, 1, 3])
    assert_leafwise(
        scalar.atleast_3d(), {k: v[None, None, None] for k, v in scalar_plain.items()}, [1, 1, 1]
    )
    assert td.atleast_3d().atleast_3d().batch_size == torch.Size([1, 1, 3])
    named = TensorDict({"a": torch.zeros(3, 2)}, [3], names=["x"])
    assert named.atleast_3d().names == [None, None, "x"]
    assert td.atleast_1d().batch_size == td.batch_size
    with pytest.raises(ValueError, match="at least 1 repeats"):
        td.repeat()


def test_pad_method_and_function():
    td, plain = make(2, names=True)

    def ref(v):
        out = torch.zeros(4, 7, *v.shape[2:])
        out[0:3, 2:6] = v
        return out

    expected = {k: ref(v) for k, v in plain.items()}
    assert_leafwise(td.pad([0, 1, 2, 1]), expected, [4, 7])
    assert td.pad([0, 1, 2, 1]).names == ["x", "y"]
    assert_leafwise(tdfunc.pad(td, [0, 1, 2, 1]), expected, [4, 7])
    assert tdfunc.pad(td, [1, 1], value=3.0)["a"][0].unique().tolist() == [3.0]
    with pytest.raises(RuntimeError) as torch_error:  # the error torch raises for a bad pad
        torch.nn.functional.pad(torch.zeros(2), [1])
    with pytest.raises(type(torch_error.value), match="even length"):
        td.pad([1])
    with pytest.raises(RuntimeError, match="even length"):
        tdfunc.functional.pad(td, [0, 1, 0, 1, 0, 1])


def test_tensor_split_and_split_keys():
    td, plain = make(2)
    for sections, dim in ((2, 0), ([1, 3], 1)):
        parts = td.tensor_split(sections, dim)
        pieces = {k: torch.tensor_split(v, sections, dim) for k, v in plain.items()}
        assert len(parts) == len(next(iter(pieces.values())))
        for i, part in enumerate(parts):
            expected = {k: p[i] for k, p in pieces.items()}
            assert_leafwise(part, expected, next(iter(expected.values())).shape[:2])
    first, second, rest = td.split_keys(["a"], [("n", "c")])
    assert list(first.keys(True, True)) == ["a"]
    assert list(second.keys(True, True)) == [("n", "c")]
    assert set(rest.keys(True, True)) == {"b", ("n", "m", "d")}


# ---------------------------------------------------------------- functional helpers
def test_pad_sequence_pads_and_stacks_with_masks():
    lengths = (3, 5, 1)
    tds = [TensorDict({"a": torch.randn(n, 2), "n": {"b": torch.randn(n)}}, []) for n in lengths]
    out = tdfunc.pad_sequence(tds, padding_value=-1.0, return_mask=True)
    assert out.batch_size == torch.Size([3])
    for i, (n, td) in enumerate(zip(lengths, tds)):
        ref = torch.full((5, 2), -1.0)
        ref[:n] = td["a"]
        torch.testing.assert_close(out["a"][i], ref)
        refb = torch.full((5,), -1.0)
        refb[:n] = td["n", "b"]
        torch.testing.assert_close(out["n", "b"][i], refb)
        # a mask covers the batch dims and the leaf's dims up to the padded one
        assert out["masks", "a"][i].tolist() == [j < n for j in range(5)]
        assert out["masks", "n", "b"][i].tolist() == [j < n for j in range(5)]
    custom = tdfunc.pad_sequence(tds, return_mask=("meta", "valid"))
    assert ("meta", "valid", "a") in custom.keys(True, True)
    batched = [TensorDict({"a": torch.randn(n, 2)}, [n]) for n in lengths]
    out = tdfunc.pad_sequence(batched)
    assert out.batch_size == torch.Size([3, 5])


def test_merge_tensordicts():
    td0 = TensorDict({"a": {"b0": torch.tensor(0)}, "common": torch.tensor(0)})
    td1 = TensorDict({"a": {"b1": torch.tensor(1)}, "common": torch.tensor(1)})
    merged = tdfunc.merge_tensordicts(td0, td1)
    assert set(merged.keys(True, True)) == {("a", "b0"), ("a", "b1"), "common"}
    assert merged["common"].item() == 0  # the first value wins
    stacked = tdfunc.merge_tensordicts(td0, td1, callback_exist=lambda *v: torch.stack(v))
    assert stacked["common"].tolist() == [0, 1]
    by_key = tdfunc.merge_tensordicts(td0, td1, callback_exist={"common": lambda *v: sum(v)})
    assert by_key["common"].item() == 1


def test_top_level_cat_and_stack():
    td, plain = make(1)
    assert_leafwise(tdfunc.cat([td, td]), {k: torch.cat([v, v]) for k, v in plain.items()}, [6])
    assert_leafwise(
        tdfunc.stack([td, td], 1), {k: torch.stack([v, v], 1) for k, v in plain.items()}, [3, 2]
    )


# ---------------------------------------------------------------- constructors and conversions
@pytest.mark.parametrize("rank", [0, 1, 2])
def test_new_constructors_replace_the_batch_dims_and_keep_the_feature_dims(rank):
    # tensordict's documentation: a leaf of shape (*batch_size, *f) becomes (*size, *f)
    td, plain = make(rank)
    nd = len(BATCH[rank])
    for name, ref in (("new_zeros", torch.zeros), ("new_ones", torch.ones)):
        out = getattr(td, name)(2, 5)
        assert_leafwise(out, {k: ref(2, 5, *v.shape[nd:]) for k, v in plain.items()}, [2, 5])
    full = td.new_full([4], 3.0)
    assert_leafwise(full, {k: torch.full((4, *v.shape[nd:]), 3.0) for k, v in plain.items()}, [4])
    empty = td.new_empty(4)
    assert {k: v.shape for k, v in empty.items(True, True)} == {
        k if len(k) > 1 else k[0]: torch.Size([4, *v.shape[nd:]]) for k, v in plain.items()
    }
    assert empty.batch_size == torch.Size([4])


def test_new_constructors_keep_the_extra_batch_dims_of_nested_containers():
    td = TensorDict({"n": TensorDict({"b": torch.ones(2, 3, 7)}, [2, 3]), "s": "x"}, [2])
    out = td.new_zeros(4, 1)
    assert out["n"].batch_size == torch.Size([4, 1, 3])
    assert out["n", "b"].shape == torch.Size([4, 1, 3, 7])
    assert out.get("s").batch_size == torch.Size([4, 1]) and out["s"] == "x"


def test_new_constructors_keep_the_names_of_a_batch_with_as_many_dims():
    td = TensorDict(a=torch.zeros(3, 4), n={"b": torch.zeros(3, 2)}, batch_size=[3], names=["x"])
    for out in (td.new_zeros(2), td.new_ones(2), td.new_empty(2), td.new_full((2,), 1.0)):
        assert out.names == ["x"] and out["n"].names == ["x"]
    assert td.new_zeros(2, 5).names == [None, None]  # which old dim a new one is: unknown


def test_new_constructors():
    td, _ = make(1)
    ints = TensorDict({"i": torch.zeros(2, dtype=torch.int64), "f": torch.zeros(2)}, [2])
    out = ints.new_tensor([1.5, 2.5])
    assert out["i"].tolist() == [1, 2] and out["f"].tolist() == [1.5, 2.5]
    assert out.batch_size == torch.Size([2])
    source = torch.tensor([1.5, 2.5, 3.5], requires_grad=True)
    out = ints.new_tensor(source)
    assert out["i"].tolist() == [1, 2, 3] and not out["f"].requires_grad
    assert out["f"].data_ptr() != source.data_ptr()
    out = ints.new_tensor(TensorDict({"i": torch.ones(3), "f": torch.ones(3)}, [3]))
    assert out["i"].dtype == torch.int64 and out.batch_size == torch.Size([3])
    assert td.new_zeros(2, dtype=torch.float64)["a"].dtype == torch.float64


def test_from_structures_and_back():
    @dataclasses.dataclass
    class Inner:
        y: torch.Tensor

    @dataclasses.dataclass
    class Outer:
        x: torch.Tensor
        inner: Inner

    obj = Outer(torch.zeros(3, 2), Inner(torch.ones(3)))
    td = TensorDict.from_dataclass(obj, auto_batch_size=True)
    assert td.batch_size == torch.Size([3]) and td["inner", "y"] is obj.inner.y
    Pair = collections.namedtuple("Pair", ["a", "b"])
    nt = Pair(torch.zeros(4), Pair(torch.ones(4), torch.ones(4, 2)))
    td = TensorDict.from_namedtuple(nt, auto_batch_size=True)
    assert td.batch_size == torch.Size([4]) and td["b", "b"].shape == (4, 2)
    back = td.to_namedtuple()
    assert torch.equal(back.b.b, nt.b.b) and back._fields == ("a", "b")
    arr = np.zeros(3, dtype=[("x", "f4"), ("y", "i8")])
    arr["y"] = [1, 2, 3]
    td = TensorDict.from_struct_array(arr)
    assert td["y"].tolist() == [1, 2, 3] and td.batch_size == torch.Size([3])
    assert TensorDict.from_any(arr)["y"].tolist() == [1, 2, 3]
    assert TensorDict.from_any({"p": nt}, auto_batch_size=True)["p", "b", "a"].shape == (4,)
    td = TensorDict.from_dict({"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3, 4, 5)}})
    assert td.batch_size == torch.Size([])
    td = TensorDict.from_dict(
        {"a": torch.zeros(3, 4), "b": {"c": torch.zeros(3, 4, 5)}}, auto_batch_size=True
    )
    assert td.batch_size == torch.Size([3, 4]) and td["b"].batch_size == torch.Size([3, 4, 5])
    td = TensorDict.from_dict({"a": torch.zeros(3, 4)}, batch_dims=1)
    assert td.batch_size == torch.Size([3])
    with pytest.raises(TypeError, match="from_dataclass"):
        TensorDict.from_dataclass({"a": 1})
    with pytest.raises(TypeError, match="from_any"):
        TensorDict.from_any(3)


def test_numpy_dtype_depth_and_small_accessors():
    td, plain = make(2)
    arrays = td.numpy()
    assert np.array_equal(arrays["n"]["m"]["d"], plain[("n", "m", "d")].numpy())
    assert td.dtype == torch.float32
    td["i"] = torch.zeros(3, 4, dtype=torch.int64)
    assert td.dtype is None
    assert td.depth == 2 and TensorDict({"a": torch.zeros(())}).depth == 0
    assert td.ndimension() == 2
    ptrs = td.data_ptr()
    assert ptrs["n", "c"].item() == td["n", "c"].data_ptr() and ptrs.batch_size == torch.Size([])
    assert td.get_at(("n", "c"), (1, 2)).tolist() == td["n", "c"][1, 2].tolist()
    assert td.get_at("missing", 0, default=None) is None
    td["s"] = "text"
    filtered = td.filter_non_tensor_data()
    assert "s" not in filtered and ("n", "m", "d") in filtered.keys(True, True)
    assert td.as_tensor()["a"] is td["a"]


def test_replace_is_a_shallow_copy():
    td, _ = make(1)
    new = td.replace(a=torch.zeros(3, 2), n={"c": torch.ones(3, 5)})
    assert new["a"].abs().sum() == 0 and td["a"].abs().sum() > 0
    assert new["n", "m", "d"] is td["n", "m", "d"]
    assert new["n", "c"].sum() == 15 and td["n", "c"].sum() != 15
    locked = td.clone().lock_()
    assert locked.replace(a=torch.zeros(3, 2))["a"].sum() == 0  # a new container


def test_writes_at_an_index_in_place_also_when_locked():
    td, _plain = make(1, lock=True)
    before = td["a"]
    td.set_at_("a", 0.0, 1)
    assert td["a"] is before and td["a"][1].tolist() == [0.0, 0.0]
    td.update_at_({"b": 5.0, ("n", "c"): 1.0}, slice(0, 2))
    assert td["b"][:2].tolist() == [5.0, 5.0] and td["n", "c"][:2].sum() == 10
    with pytest.raises(KeyError):
        td.update_at_({"nope": 1.0}, 0)
    other = TensorDict(
        {
            "a": torch.ones(2, 2),
            "b": torch.ones(2),
            "n": {"c": torch.ones(2, 5), "m": {"d": torch.ones(2, 2, 3)}},
        },
        [2],
    )
    td.copy_at_(other, slice(1, 3))
    assert td["n", "m", "d"][1:].sum() == 12
    torch.testing.assert_close(td["b"][0], torch.tensor(5.0))


def test_auto_batch_size():
    td = TensorDict({"a": torch.zeros(3, 4, 5), "b": {"c": torch.zeros(3, 4, 6)}}, [])
    assert td.auto_batch_size_().batch_size == torch.Size([3, 4])
    assert td["b"].batch_size == torch.Size([3, 4, 6])
    td = TensorDict({"a": torch.zeros(3, 4, 5), "b": torch.zeros(3, 4)}, [])
    assert td.auto_batch_size_(batch_dims=1).batch_size == torch.Size([3])


def test_auto_batch_size_ignores_non_tensors_and_keeps_levels_without_tensors():
    plain = {"a": torch.zeros(4, 3, 5), "b": torch.zeros(4, 3)}
    td = TensorDict(plain, [4, 3])
    td.set_non_tensor(("data", "text"), "some text")  # a level holding no tensor
    td["label"] = "top"
    td.batch_size = []
    assert td["data"].batch_size == (4, 3)  # nested levels keep theirs
    assert td.auto_batch_size_().batch_size == plain["b"].shape  # what every tensor shares
    assert td["data"].batch_size == (4, 3) and td["data", "text"] == "some text"
    assert TensorDict({}, [2]).auto_batch_size_().batch_size == (2,)
    assert TensorDict({"s": "x"}, [2]).auto_batch_size_(batch_dims=0).batch_size == ()


# ---------------------------------------------------------------- autograd
def test_backward_grad_data_requires_grad_zero_grad():
    w = torch.randn(3, 2, requires_grad=True)
    v = torch.randn(3, requires_grad=True)
    td = TensorDict({"w": w, "n": {"v": v}}, [3])
    assert td.requires_grad and not td.detach().requires_grad
    loss = TensorDict({"loss": (w**2).sum() + v.sum()}, [])
    loss.backward()
    assert_leafwise(td.grad, {("w",): 2 * w.detach(), ("n", "v"): torch.ones(3)}, [3])
    assert td.data["w"].requires_grad is False and td.data["w"].data_ptr() == w.data_ptr()
    td.zero_grad(set_to_none=False)
    assert w.grad.abs().sum() == 0
    td.zero_grad()
    assert w.grad is None and td.grad is None
    with pytest.raises(RuntimeError, match="one element"):
        td.backward()
    td.backward(
        gradient=TensorDict({"w": torch.ones(3, 2), "n": {"v": torch.full((3,), 2.0)}}, [3])
    )
    assert_leafwise(td.grad, {("w",): torch.ones(3, 2), ("n", "v"): torch.full((3,), 2.0)}, [3])
    td.zero_grad()
    both = TensorDict({"l1": (w**2).sum(), "n": {"l2": v.sum(), "c": torch.ones(())}}, [])
    both.backward()  # every differentiable scalar leaf, in one call; "c" is ignored
    assert_leafwise(td.grad, {("w",): 2 * w.detach(), ("n", "v"): torch.ones(3)}, [3])


def test_torch_autograd_grad_with_containers():
    w = torch.randn(3, 2, requires_grad=True)
    v = torch.randn(3, requires_grad=True)
    params = TensorDict({"w": w, "n": {"v": v}}, [3])
    out = TensorDict({"y": (w**2).sum(1) * v}, [3])
    grads = torch.autograd.grad(out.sum(reduce=True), params, retain_graph=True)
    assert type(grads) is TensorDict  # one container in, that container of gradients out
    ref_w, ref_v = torch.autograd.grad((w**2).sum(1).mul(v).sum(), (w, v), retain_graph=True)
    assert_leafwise(grads, {("w",): ref_w, ("n", "v"): ref_v}, [3])
    cotangent = TensorDict({"y": torch.arange(3.0)}, [3])
    grads, extra = torch.autograd.grad(out, (params, w), cotangent)
    ref_w, ref_v = torch.autograd.grad((w**2).sum(1) * v, (w, v), torch.arange(3.0))
    assert_leafwise(grads, {("w",): ref_w, ("n", "v"): ref_v}, [3])
    torch.testing.assert_close(extra, ref_w)
    # torch hands a lone input over as a one-tuple: (params,) cannot differ from params
    w0, v0 = w.detach(), v.detach()
    out = TensorDict({"y": (w**2).sum(1) * v}, [3])
    lone = torch.autograd.grad(out.sum(reduce=True), (params,))
    assert_leafwise(lone, {("w",): 2 * w0 * v0[:, None], ("n", "v"): (w0**2).sum(1)}, [3])


# ---------------------------------------------------------------- consolidate
def test_consolidate_one_storage_locked_and_equal():
    td, plain = make(2)
    td["i"] = torch.arange(12).reshape(3, 4)
    td["s"] = "text"
    plain[("i",)] = torch.arange(12).reshape(3, 4)
    out = td.consolidate()
    assert out.is_consolidated() and not td.is_consolidated()
    pointers = {
        t.untyped_storage().data_ptr()
        for _, t in out.items(True, True)
        if isinstance(t, torch.Tensor)
    }
    assert len(pointers) == 1
    assert out["s"] == "text"
    del plain  # the values: compare with the original container leaf by leaf
    for key, value in td.items(True, True):
        if isinstance(value, torch.Tensor):
            assert torch.equal(out[key], value)
    assert out.is_locked
    with pytest.raises(RuntimeError, match="locked"):
        out["new"] = torch.zeros(3, 4)
    out.set_("a", torch.ones(3, 4, 2))
    assert out["a"].untyped_storage().data_ptr() in pointers
    assert out.consolidate() is out
    again = pickle.loads(pickle.dumps(out))
    assert torch.equal(again["n", "m", "d"], td["n", "m", "d"])


def test_consolidate_in_place_and_to_a_file(tmp_path):
    td, plain = make(1)
    leaf = td["a"]
    assert td.consolidate(inplace=True) is td
    assert td.is_consolidated() and td.is_locked and td["a"] is not leaf
    assert_leafwise(td, plain, [3])
    td2, plain2 = make(1, seed=4)
    out = td2.consolidate(filename=tmp_path / "td.bin")
    assert_leafwise(out, plain2, [3])
    assert (tmp_path / "td.bin").stat().st_size >= sum(v.numel() * 4 for v in plain2.values())
    locked, _ = make(1, lock=True)
    with pytest.raises(RuntimeError, match="locked"):
        locked.consolidate(inplace=True)
    on_cpu = make(1)[0].consolidate(device="cpu")
    assert on_cpu.device == torch.device("cpu") and on_cpu["n"].device == torch.device("cpu")
    assert on_cpu.is_consolidated()


# ---------------------------------------------------------------- non-tensor leaves
def test_non_tensor_leaves_follow_or_refuse():
    td = TensorDict({"a": torch.arange(6.0).reshape(2, 3), "n": {"s": "text"}, "t": "top"}, [2, 3])
    out = td.sum(0)
    assert out["n", "s"] == "text" and out.batch_size == torch.Size([3])
    assert td.flip(1)["t"] == "top" and td.exp()["n", "s"] == "text"
    filtered = td.filter_non_tensor_data()
    assert list(filtered.keys(True, True)) == ["a"]
    stacked = torch.stack([TensorDict({"x": torch.zeros(()), "s": s}, []) for s in "ab"])
    assert stacked.exp()["s"] == ["a", "b"]  # pointwise ops move nothing
    # ops that only move elements move the values too; reductions cannot
    assert stacked.flip(0)["s"] == ["b", "a"] and stacked.roll(1, 0)["s"] == ["b", "a"]
    assert stacked.tile(2)["s"] == ["a", "b", "a", "b"]
    with pytest.raises(TypeError, match="NonTensorStack"):
        stacked.sum(0)
    assert stacked.filter_non_tensor_data().sum(0)["x"].shape == ()


def test_reductions_inside_torch_func_transforms():
    params, plain = make(1)

    def loss(p):
        return (p * p).sum(reduce=True) + p.norm()["a"]

    grads = torch.func.grad(loss)(params)
    a = plain[("a",)]
    expected = {k: 2 * v for k, v in plain.items()}
    expected[("a",)] = 2 * a + a / torch.linalg.vector_norm(a)
    assert_leafwise(grads, expected, [3])
    means = torch.func.vmap(lambda p: p.mean(0))(params.unsqueeze(1).expand(3, 2))
    assert_leafwise(means, plain, [3])
    stds = torch.func.vmap(lambda p: p.std("feature"))(params)
    assert_leafwise(stds, {k: v.reshape(3, -1).std(-1) for k, v in plain.items()}, [3])


def test_to_namedtuple_prints_like_a_generic_named_tuple():
    import collections

    a = torch.zeros(3)
    td = TensorDict({"a": a, "nested": {"a": a, "s": "zero!"}}, [3])
    generic = collections.namedtuple("GenericDict", ["a", "s"])
    reference = collections.namedtuple("GenericDict", ["a", "nested"])(
        a=a, nested=generic(a, "zero!")
    )
    assert repr(td.to_namedtuple()) == repr(reference)


@pytest.mark.parametrize(
    "op",
    [lambda x: 2**x, lambda x: 7 // x, lambda x: 7 % x, lambda x: torch.tensor(3.0) ** x],
    ids=["rpow", "rfloordiv", "rmod", "tensor-rpow"],
)
def test_reflected_operators_with_a_number_on_the_left(op):
    td, ref = make(2, positive=True)
    td, ref = td + 1, {k: v + 1 for k, v in ref.items()}
    assert_leafwise(op(td), {k: op(v) for k, v in ref.items()}, BATCH[2])


def test_clamp_takes_container_bounds_paired_key_by_key():
    td, ref = make(2)
    low, high = td * 0 - 0.5, td * 0 + 0.25
    expected = {k: torch.clamp(v, -0.5, 0.25) for k, v in ref.items()}
    assert_leafwise(td.clamp(low, high), expected, BATCH[2])
    assert_leafwise(td.clamp(max=high), {k: v.clamp(max=0.25) for k, v in ref.items()}, BATCH[2])
    assert_leafwise(td.clone().clamp_(low, 0.25), expected, BATCH[2])
    with pytest.raises(TypeError, match="lerp: weight must be a number or a tensor"):
        td.lerp(high, low)  # a weight per entry: td.apply(torch.lerp, end, weight)


def test_from_namedtuple_takes_torch_return_types():
    # torch's return types are struct sequences, not collections.namedtuple
    x = torch.tensor([[2.0, 0.0, 1.0], [0.0, 5.0, 1.0]])
    result = x.max(dim=1)
    for td in (TensorDict.from_namedtuple(result), tdfunc.from_namedtuple(result)):
        assert list(td.keys()) == ["values", "indices"]
        assert torch.equal(td["values"], result.values)
        assert torch.equal(td["indices"], result.indices)
    assert TensorDict.from_namedtuple(result, auto_batch_size=True).batch_size == (2,)
    with pytest.raises(TypeError, match="from_namedtuple: expected a named tuple, got tuple"):
        TensorDict.from_namedtuple((x, x))


def test_masked_select_in_place():
    mask = torch.tensor([True, False, True])
    a = torch.arange(6.0).view(3, 2)
    td = TensorDict(a=a, n={"b": torch.arange(3)}, s="x", batch_size=[3])
    assert td.masked_select(mask, inplace=True) is td
    assert td.batch_size == torch.Size([2]) and td["n"].batch_size == torch.Size([2])
    assert torch.equal(td["a"], a[mask]) and td["n", "b"].tolist() == [0, 2] and td["s"] == "x"
    locked = TensorDict(a=torch.arange(3.0), batch_size=[3]).lock_()
    with pytest.raises(RuntimeError):
        locked.masked_select(mask, inplace=True)
    assert locked.batch_size == torch.Size([3])
    # a nested level cannot leave its parent's batch size behind
    parent = TensorDict(n={"b": torch.arange(3)}, batch_size=[3])
    with pytest.raises(ValueError, match="masked_select"):
        parent["n"].masked_select(mask, inplace=True)
    assert parent["n"].batch_size == torch.Size([3])
