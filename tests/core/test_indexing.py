"""Indexing a TensorDict like a tensor, writing at an index, and lazy preallocation.

References index each plain tensor with the same index over its batch dims.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorStack, TensorDict


def _data():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, 5, generator=g)
    b = torch.randn(3, 4, generator=g)
    c = torch.randint(0, 10, (3, 4, 2, 2), generator=g)
    return a, b, c


def _td():
    a, b, c = _data()
    return TensorDict({"a": a, "n": {"b": b, "c": c}}, batch_size=[3, 4]), (a, b, c)


INDICES = [
    0,
    -1,
    slice(1, None),
    slice(None, None, 2),
    (slice(None), 1),
    (1, slice(0, 3)),
    (Ellipsis, 2),
    (Ellipsis, slice(None, 2)),
    (0, Ellipsis),
    None,
    (None, 1),
    (slice(None), None, 2),
    torch.tensor([2, 0]),
    torch.tensor([True, False, True]),
    torch.ones(3, 4, dtype=torch.bool),
    (slice(None), torch.tensor([3, 3, 0])),
    (torch.tensor([0, 2]), torch.tensor([1, 3])),
    [0, 2],
    (),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_getitem_matches_each_tensor(index):
    td, (a, b, c) = _td()
    out = td[index]
    reference_size = torch.zeros(3, 4)[index].shape
    expected_b = b[index]
    assert out.batch_size == reference_size == expected_b.shape
    explicit = index
    if isinstance(index, tuple) and Ellipsis in index:
        position = index.index(Ellipsis)
        used = len(index) - 1
        explicit = index[:position] + (slice(None),) * (2 - used) + index[position + 1 :]
    assert torch.equal(out["a"], a[explicit])
    assert torch.equal(out["n", "b"], expected_b)
    assert torch.equal(out["n", "c"], c[explicit])
    assert out["n"].batch_size == reference_size


def test_int_and_slice_share_storage():
    td, (a, _, _) = _td()
    td[0]["a"].fill_(7.0)
    assert (a[0] == 7).all()
    td[1:]["n", "b"].zero_()
    assert td["n", "b"][1:].sum() == 0


def test_ellipsis_indexes_batch_dims_not_features():
    data = TensorDict(
        {"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
        batch_size=[3, 4],
    )
    sub = data[..., :2]
    assert sub.shape == torch.Size([3, 2])
    assert sub["key 1"].shape == torch.Size([3, 2, 5])


def test_index_nested_with_longer_batch():
    inner = TensorDict({"x": torch.arange(24.0).reshape(2, 3, 4)}, [2, 3])
    td = TensorDict({"inner": inner}, [2])
    out = td[1]
    assert out["inner"].batch_size == torch.Size([3])
    assert torch.equal(out["inner", "x"], inner["x"][1])
    out = td[torch.tensor([1, 1, 0])]
    assert out["inner"].batch_size == torch.Size([3, 3])


def test_index_empty_tensordict_uses_batch_shape_only():
    td = TensorDict({}, [4, 3])
    assert td[torch.tensor([0, 1])].batch_size == torch.Size([2, 3])
    assert td[:, torch.tensor([True, False, True])].batch_size == torch.Size([4, 2])
    assert td[None, 1].batch_size == torch.Size([1, 3])


def test_mask_select_like_the_seed():
    label = torch.tensor([1, 0, 1, 2])
    td = TensorDict({"label": label, "image": torch.randn(4, 2)}, [4])
    out = td[td["label"] == 1]
    assert out.batch_size == torch.Size([2])
    assert torch.equal(out["image"], td["image"][label == 1])


def test_index_names_follow():
    td = TensorDict({"x": torch.zeros(2, 3, 4)}, [2, 3], names=["a", "b"])
    assert td[0].names == ["b"]
    assert td[:, 1].names == ["a"]
    assert td[None].names == [None, "a", "b"]
    assert td[1:].names == ["a", "b"]
    # one tensor index takes the place of the dim it indexes, which keeps its name
    assert td[torch.tensor([0, 1])].names == ["a", "b"]
    assert td[:, torch.tensor([[0, 1], [2, 0]])].names == ["a", "b", "b"]
    assert td[torch.tensor([True, False])].names == ["a", "b"]
    assert td[[0, 1], [1, 2]].names == [None]  # two tensor indices: no names


# ---------------------------------------------------------------- __setitem__
@pytest.mark.parametrize(
    "index",
    [0, -1, slice(0, 2), (slice(None), 1), torch.tensor([2, 0]), torch.tensor([True, False, True])],
    ids=repr,
)
def test_setitem_with_tensordict_writes_in_place(index):
    td, (a, b, c) = _td()
    a0, b0, c0 = a.clone(), b.clone(), c.clone()
    target = torch.zeros(3, 4)[index].shape
    value = TensorDict(
        {
            "a": torch.full((*target, 5), -1.0),
            "n": {"b": torch.full(target, -2.0), "c": torch.full((*target, 2, 2), -3)},
        },
        batch_size=target,
    )
    td[index] = value
    assert td["a"] is a  # storage kept
    a0[index] = -1.0
    b0[index] = -2.0
    c0[index] = -3
    assert torch.equal(a, a0) and torch.equal(b, b0) and torch.equal(c, c0)


def test_setitem_with_dict_and_scalar_and_tensor():
    td, (a, b, c) = _td()
    td[0] = {"a": torch.zeros(4, 5)}
    assert (a[0] == 0).all()
    td[1] = 3
    assert (a[1] == 3).all() and (b[1] == 3).all() and (c[1] == 3).all()
    td[2, 1:] = torch.tensor(9.0)
    assert (b[2, 1:] == 9).all() and (b[2, 0] != 9)


def test_setitem_broadcasts_a_smaller_batch():
    td = TensorDict({"a": torch.zeros(3, 2)}, [3])
    td[0:2] = TensorDict({"a": torch.ones(2), "n": torch.ones(2)}, [])
    assert td["a"].tolist() == [[1, 1], [1, 1], [0, 0]]
    assert td["n"].tolist() == [[1, 1], [1, 1], [0, 0]]


def test_setitem_non_tensor_at_index_makes_a_stack():
    td = TensorDict({"x": torch.zeros(3), "s": "a"}, [3])
    td[1] = TensorDict({"s": "b"}, [])
    assert td["s"] == ["a", "b", "a"]
    assert isinstance(td._get_leaf("s"), NonTensorStack)
    td[1] = TensorDict({"s": "a"}, [])
    assert td["s"] == ["a", "a", "a"]


# ---------------------------------------------------------------- lazy preallocation
def foo():
    data = TensorDict({}, batch_size=[])
    data["a"] = torch.randn(3)
    data["b"] = TensorDict({"c": torch.zeros(2)}, batch_size=[])
    return data


@pytest.mark.parametrize("order", ["ordered", "shuffled"])
def test_lazy_preallocation_matches_stack(order):
    n = 10
    items = [foo() for _ in range(n)]
    data = TensorDict({}, batch_size=[n])
    positions = list(range(n)) if order == "ordered" else torch.randperm(n).tolist()
    for i in positions:
        data[i] = items[i]
    assert data.batch_size == torch.Size([n])
    assert data["a"].shape == torch.Size([n, 3])
    assert data["b"].batch_size == torch.Size([n])
    assert data["b", "c"].shape == torch.Size([n, 2])
    reference = torch.stack([item["a"] for item in items])
    assert torch.equal(data["a"], reference)


def test_lazy_preallocation_allocates_once_then_writes_in_place():
    data = TensorDict({}, batch_size=[4])
    data[2] = TensorDict({"x": torch.ones(3, dtype=torch.int32)}, [])
    x = data["x"]
    assert x.dtype == torch.int32 and x.tolist() == [[0] * 3, [0] * 3, [1] * 3, [0] * 3]
    data[0] = TensorDict({"x": torch.full((3,), 5, dtype=torch.int32)}, [])
    assert data["x"] is x and x[0].tolist() == [5, 5, 5]


def test_lazy_preallocation_with_slices_strings_and_device():
    data = TensorDict({}, batch_size=[4, 2], device="meta")
    data[1:3] = TensorDict({"y": torch.ones(2, 2, 5), "s": "hello"}, [2, 2])
    assert data["y"].shape == torch.Size([4, 2, 5])
    assert data["y"].device.type == "meta"
    assert data["s"] == "hello"


def test_lazy_preallocation_nested_with_longer_batch():
    data = TensorDict({}, batch_size=[3])
    item = TensorDict({"n": TensorDict({"z": torch.ones(4, 2)}, [4])}, [])
    data[1] = item
    assert data["n"].batch_size == torch.Size([3, 4])
    assert data["n", "z"].shape == torch.Size([3, 4, 2])
    assert data["n", "z"][1].sum() == 8 and data["n", "z"].sum() == 8


def test_lazy_preallocation_of_different_strings():
    data = TensorDict({}, batch_size=[3])
    for i in [2, 0, 1]:
        data[i] = TensorDict({"s": f"item {i}", "x": torch.tensor(float(i))}, [])
    assert data["s"] == ["item 0", "item 1", "item 2"]
    assert data["x"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("index", [["a", "b"], [0, "a"]])
def test_list_of_keys_is_a_clear_error(index):
    td = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)}, [2])
    with pytest.raises(TypeError, match=r"list of keys.*td\.select\(\*keys\)"):
        td[index]
    with pytest.raises(TypeError, match="list of keys"):
        td[index] = 0
    assert td.select("a", "b").keys() == td.keys()  # what the hint offers


# A bool (``True``, a 0-dim mask) consumes no batch dim and a nested list or numpy
# array of bools spans as many dims as it has: the ellipsis is filled accordingly.
# Each case: (index, the same index written out for a leaf with feature dims).
_MASK = torch.arange(12).reshape(3, 4) % 3 == 0
_ALL = slice(None)
BOOL_INDICES = [
    ((Ellipsis, True), (_ALL, _ALL, True)),
    ((True, Ellipsis, 0), (True, _ALL, 0)),
    ((Ellipsis, torch.tensor(False)), (_ALL, _ALL, torch.tensor(False))),
    ((None, True, Ellipsis, -1), (None, True, _ALL, -1)),
    ((_MASK.numpy(), Ellipsis), (_MASK,)),
    ((_MASK.tolist(),), (_MASK,)),
    ((0, [True, False, True, False], Ellipsis), (0, torch.tensor([True, False, True, False]))),
]


@pytest.mark.parametrize(("index", "explicit"), BOOL_INDICES, ids=repr)
def test_bool_items_consume_dims_as_in_torch(index, explicit):
    td, leaves = _td()
    expected_size = torch.zeros(3, 4)[explicit].shape
    out = td[index]
    assert out.batch_size == expected_size
    for got, leaf in zip((out["a"], out["n", "b"], out["n", "c"]), leaves):
        assert torch.equal(got, leaf[explicit])
    td[index] = 0  # a write through the same index reaches the same elements
    for got, leaf in zip((td["a"], td["n", "b"], td["n", "c"]), leaves):
        ref = leaf.clone()
        ref[explicit] = 0
        assert torch.equal(got, ref)


@pytest.mark.parametrize("mask", [_MASK.numpy(), _MASK.tolist()], ids=["numpy", "list"])
def test_nd_bool_mask_as_list_or_array_then_int_is_too_many_indices(mask):
    # the mask spans both batch dims: a further int would index a feature dim
    td, _ = _td()
    with pytest.raises(IndexError, match="too many indices"):
        td[mask, 0]


@pytest.mark.parametrize(
    "index",
    [0, slice(0, 2), torch.tensor([0, 2]), [2, 0], torch.tensor([True, False, True])],
    ids=repr,
)
@pytest.mark.parametrize("value", [0.1, 3, True, 2**40 + 1], ids=repr)
def test_number_written_at_an_index_is_written_as_torch_writes_it(index, value):
    # a Python number reaches each leaf exactly in its dtype (0.1 in a float64 leaf
    # is not rounded to float32), also at a tensor or mask index
    leaves = {
        "f64": torch.zeros(3, 2, dtype=torch.float64),
        "f32": torch.zeros(3),
        "i64": torch.zeros(3, dtype=torch.long),
    }
    td = TensorDict({"f64": leaves["f64"].clone(), "n": {"f32": leaves["f32"].clone()}}, [3])
    td["i64"] = leaves["i64"].clone()
    td[index] = value
    for key, ref in leaves.items():
        ref[index] = value
        got = td["n", key] if key == "f32" else td[key]
        assert got.dtype == ref.dtype and torch.equal(got, ref), key


def test_tensor_written_at_a_tensor_index_is_cast_like_at_an_int():
    # torch's index_put_ refuses another dtype; a write at an int casts (copy_):
    # a tensor index gives the same result, and no entry is written before a refusal
    td = TensorDict({"f": torch.zeros(3), "i": torch.zeros(3, dtype=torch.long)}, [3])
    at_int, at_tensor = td.clone(), td.clone()
    value = TensorDict({"f": torch.tensor(7), "i": torch.tensor(2.0)}, [])
    at_int[1] = value
    at_tensor[torch.tensor([1])] = value.unsqueeze(0)
    assert torch.equal(at_tensor["f"], at_int["f"]) and torch.equal(at_tensor["i"], at_int["i"])
    assert at_tensor["f"].dtype == torch.float32 and at_tensor["i"].dtype == torch.long
