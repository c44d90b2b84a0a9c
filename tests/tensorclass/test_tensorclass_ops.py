"""TensorDict machinery on TensorClass instances, checked against plain tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdfunc import NonTensorData, TensorClass, TensorDict


class Data(TensorClass):
    x: torch.Tensor
    y: torch.Tensor
    label: Any = "lab"
    missing: Any = None


def make(batch=(4, 3), seed: int = 0) -> tuple[Data, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, 5, generator=generator)
    y = torch.randn(*batch, generator=generator)
    return Data(x, y, batch_size=list(batch)), x, y


def check(result, x, y, batch):
    assert type(result) is Data
    assert result.batch_size == torch.Size(batch)
    torch.testing.assert_close(result.x, x)
    torch.testing.assert_close(result.y, y)
    # one value, or one per element when stacking made a NonTensorStack (tensordict's rule)
    label = result.label
    while isinstance(label, list):
        assert all(item == label[0] for item in label)
        label = label[0]
    assert label == "lab" and result.missing is None


# ---------------------------------------------------------------------- indexing
@pytest.mark.parametrize(
    ("index", "leaf_index"),
    [
        (0, 0),
        (-1, -1),
        (slice(1, 3), slice(1, 3)),
        ((slice(None), 1), (slice(None), 1)),
        ((..., 0), (slice(None), 0)),  # the ellipsis covers batch dims only
        ((None, 1), (None, 1)),
        ([0, 2], [0, 2]),
        ((slice(None), [0, 2]), (slice(None), [0, 2])),
    ],
)
def test_indexing_matches_tensors(index, leaf_index):
    data, x, y = make()
    expected_y = y[leaf_index]
    check(data[index], x[leaf_index], expected_y, expected_y.shape)


def test_bool_mask_indexing():
    data, x, y = make()
    mask = y > 0
    check(data[mask], x[mask], y[mask], y[mask].shape)
    row_mask = torch.tensor([True, False, True, True])
    check(data[row_mask], x[row_mask], y[row_mask], y[row_mask].shape)


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(-4, 4),
    stop=st.integers(-4, 4),
    step=st.integers(1, 3),
    column=st.integers(-3, 2),
)
def test_indexing_hypothesis(start, stop, step, column):
    data, x, y = make()
    index = (slice(start, stop, step), column)
    check(data[index], x[index], y[index], y[index].shape)


def test_setitem_at_index_writes_in_place():
    data, x, y = make()
    other, x2, y2 = make(batch=(3,), seed=1)
    data[1] = other
    expected_x, expected_y = x.clone(), y.clone()
    expected_x[1], expected_y[1] = x2, y2
    torch.testing.assert_close(data.x, expected_x)
    torch.testing.assert_close(data.y, expected_y)
    assert data.x is x  # written in place


# ---------------------------------------------------------------------- shape operations
SHAPE_OPS = [
    ("reshape", lambda t, nd: t.reshape(12, *t.shape[nd:]), lambda d: d.reshape(12), (12,)),
    ("view", lambda t, nd: t.view(2, 6, *t.shape[nd:]), lambda d: d.view(2, 6), (2, 6)),
    ("flatten", lambda t, nd: t.flatten(0, 1), lambda d: d.flatten(0, 1), (12,)),
    (
        "unflatten",
        lambda t, nd: t.unflatten(0, (2, 2)),
        lambda d: d.unflatten(0, (2, 2)),
        (2, 2, 3),
    ),
    ("unsqueeze", lambda t, nd: t.unsqueeze(1), lambda d: d.unsqueeze(1), (4, 1, 3)),
    (
        "permute",
        lambda t, nd: t.permute(1, 0, *range(2, t.dim())),
        lambda d: d.permute(1, 0),
        (3, 4),
    ),
    ("transpose", lambda t, nd: t.transpose(0, 1), lambda d: d.transpose(0, 1), (3, 4)),
    (
        "expand",
        lambda t, nd: t.expand(2, *t.shape),
        lambda d: d.expand(2, 4, 3),
        (2, 4, 3),
    ),
]


@pytest.mark.parametrize(
    ("name", "tensor_op", "op", "batch"), SHAPE_OPS, ids=[s[0] for s in SHAPE_OPS]
)
def test_shape_ops_match_tensors(name, tensor_op, op, batch):
    data, x, y = make()
    check(op(data), tensor_op(x, 2), tensor_op(y, 2), batch)


def test_squeeze():
    data, x, y = make(batch=(4, 1))
    check(data.squeeze(1), x.squeeze(1), y.squeeze(1), (4,))
    check(data.squeeze(), x.squeeze(1), y.squeeze(1), (4,))


def test_unbind_split_chunk_share_storage():
    data, x, y = make()
    pieces = data.unbind(1)
    assert len(pieces) == 3
    for i, piece in enumerate(pieces):
        check(piece, x[:, i], y[:, i], (4,))
    pieces[0].x.zero_()
    assert torch.equal(x[:, 0], torch.zeros(4, 5))
    split = data.split([1, 3], 0)
    check(split[1], x[1:], y[1:], (3, 3))
    chunks = data.chunk(2, 0)
    check(chunks[0], x[:2], y[:2], (2, 3))
    for i, row in enumerate(data):
        check(row, x[i], y[i], (3,))
    assert len(data) == 4


def test_torch_stack_and_cat_return_the_class():
    items = [make(batch=(3,), seed=s) for s in range(4)]
    stacked = torch.stack([d for d, _, _ in items], 1)
    check(
        stacked,
        torch.stack([x for _, x, _ in items], 1),
        torch.stack([y for _, _, y in items], 1),
        (3, 4),
    )
    catted = torch.cat([d for d, _, _ in items], 0)
    check(catted, torch.cat([x for _, x, _ in items]), torch.cat([y for _, _, y in items]), (12,))
    unbound = torch.unbind(stacked, 1)
    check(unbound[2], items[2][1], items[2][2], (3,))


def test_stack_different_non_tensor_values():
    first = Data(torch.zeros(2), torch.zeros(2), label="a")
    second = Data(torch.zeros(2), torch.zeros(2), label="b")
    stacked = torch.stack([first, second])
    assert stacked.label == ["a", "b"]
    assert stacked[1].label == "b"


# ---------------------------------------------------------------------- apply / to / clone
def test_apply_named_apply_and_others():
    data, x, y = make()
    check(data.apply(lambda t: t * 2), x * 2, y * 2, (4, 3))
    other, x2, y2 = make(seed=3)
    check(data.apply(lambda a, b: a - b, other), x - x2, y - y2, (4, 3))
    reduced = data.apply(lambda t: t.sum(0), batch_size=[3])
    check(reduced, x.sum(0), y.sum(0), (3,))
    named = data.named_apply(lambda key, t: t + (1 if key == "x" else 0))
    check(named, x + 1, y, (4, 3))
    dropped = data.apply(lambda t: t if t.dim() == 3 else None)
    assert dropped.y is None and torch.equal(dropped.x, x)


def test_apply_in_place():
    data, x, y = make()
    expected_x, expected_y = x * 3, y * 3
    assert data.apply_(lambda t: t * 3) is data
    check(data, expected_x, expected_y, (4, 3))
    data.apply(lambda t: t + 1, inplace=True)
    check(data, expected_x + 1, expected_y + 1, (4, 3))


def test_to_clone_detach_and_dtype_helpers():
    data, x, y = make()
    double = data.to(torch.float64)
    assert type(double) is Data and double.x.dtype == torch.float64
    torch.testing.assert_close(double.x, x.double())
    assert data.to() is data
    moved = data.to("cpu")
    assert moved.device == torch.device("cpu") and moved.label == "lab"
    assert data.double().y.dtype == torch.float64 and data.half().x.dtype == torch.float16
    clone = data.clone()
    check(clone, x, y, (4, 3))
    assert clone.x is not x and clone.x.data_ptr() != x.data_ptr()
    shallow = data.clone(recurse=False)
    assert shallow.x is x and shallow._td is not data._td
    grad_data = Data(x.clone().requires_grad_(), y, batch_size=[4, 3])
    assert not grad_data.detach().x.requires_grad


def test_equality_and_arithmetic():
    data, x, y = make()
    same = data.clone()
    equal = data == same
    assert type(equal) is Data and equal.all()
    assert torch.equal(equal.x, torch.ones_like(x, dtype=torch.bool))
    different = data.apply(lambda t: t + 1)
    unequal = data == different
    assert not unequal.x.any() and not unequal.y.any()
    assert unequal.label.all()  # equal non-tensor values compare True everywhere
    assert (data != different).x.all()
    check(data + 1, x + 1, y + 1, (4, 3))
    check(2 * data, 2 * x, 2 * y, (4, 3))
    check(data - data, x - x, y - y, (4, 3))
    check(-data, -x, -y, (4, 3))
    check(data / 2, x / 2, y / 2, (4, 3))
    lt = data < 0
    assert torch.equal(lt.x, x < 0)
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(data)


def test_in_place_arithmetic_on_mutable_instances():
    data, x, y = make()
    data += 1
    check(data, x, y, (4, 3))  # x and y were updated in place
    expected = x.clone() * 2
    data.mul_(2)
    torch.testing.assert_close(data.x, expected)


# ---------------------------------------------------------------------- get / set / update
def test_get_with_default_and_nested():
    class Inner(TensorClass):
        z: torch.Tensor

    class Outer(TensorClass):
        inner: Inner
        note: Any = None

    out = Outer(Inner(torch.ones(2), batch_size=[2]), batch_size=[2])
    assert torch.equal(out.get(("inner", "z")), torch.ones(2))
    assert out.get("note") is None
    assert out.get("nope", 5) == 5
    assert out.get("nte") is None  # as tensordict; indexing names the close field
    with pytest.raises(KeyError, match="Did you mean 'note'"):
        out["nte"]
    assert torch.equal(out["inner", "z"], torch.ones(2))


def test_set_inplace_and_nested():
    data, x, y = make()
    new_x = torch.ones_like(x)
    assert data.set("x", new_x) is data and data.x is new_x
    storage = data.y
    data.set("y", torch.full_like(y, 2.0), inplace=True)
    assert data.y is storage and torch.equal(storage, torch.full_like(y, 2.0))
    data.set("label", "other")
    assert data.label == "other"
    with pytest.raises(AttributeError, match="'z' is not a field"):
        data.set("z", torch.zeros(4, 3))

    class Outer(TensorClass):
        inner: Data

    outer = Outer(make()[0], batch_size=[4])
    outer.set(("inner", "y"), torch.zeros(4, 3))
    assert torch.equal(outer.inner.y, torch.zeros(4, 3))
    data.set_("y", torch.ones(4, 3))
    assert data.y is storage and torch.equal(storage, torch.ones(4, 3))


def test_rename_key_to_a_name_that_is_not_a_field_is_refused_like_set():
    # it made an entry no attribute reads (data.z raised) that keys() listed
    data, x, y = make()
    with pytest.raises(AttributeError, match=r"rename_key_: 'z' is not a field"):
        data.rename_key_("x", "z")
    assert data.x is x and data.y is y and list(data.keys()) == ["x", "y", "label"]
    data.rename_key_("x", "y")  # onto another field: as set("y", ...) followed by del x
    assert data.y is x and data.x is None


def test_a_nested_tensorclass_takes_only_its_fields_through_its_parent():
    # set, update, rename_key_ and index writes through a parent TensorDict added a
    # key the nested instance has no field for
    td = TensorDict({"a": torch.zeros(4, 3), "d": make()[0]}, [4, 3])
    before = list(td.keys(True))
    writes = [
        lambda: td.set(("d", "z"), torch.zeros(4, 3)),
        lambda: td.update({"d": {"z": torch.zeros(4, 3)}}),
        lambda: td.rename_key_("a", ("d", "z")),
    ]
    for write in writes:
        with pytest.raises(AttributeError, match=r"'z' is not a field of Data"):
            write()
        assert list(td.keys(True)) == before
    with pytest.raises(ValueError, match=r"\['z'\], which are not fields of Data"):
        td[0] = TensorDict({"d": TensorDict({"z": torch.zeros(3)}, [3])}, [3])
    assert list(td.keys(True)) == before
    td.set(("d", "x"), torch.ones(4, 3, 5))  # a field: written
    assert torch.equal(td["d"].x, torch.ones(4, 3, 5))


def test_update_casts_fields():
    class Casting(TensorClass["autocast"]):
        count: int
        x: torch.Tensor

    c = Casting(count=1, x=torch.zeros(2), batch_size=[2])
    c.update({"count": torch.tensor(5), "x": torch.ones(2)})
    assert type(c.count) is int and c.count == 5 and torch.equal(c.x, torch.ones(2))
    c.update(TensorDict({"x": torch.full((2,), 3.0)}, [2]))
    assert torch.equal(c.x, torch.full((2,), 3.0))


def test_keys_select_exclude():
    data, x, y = make()
    assert set(data.keys()) == {"x", "y", "label"}
    selected = data.select("x")
    assert type(selected) is Data and selected.y is None and selected.x is x
    excluded = data.exclude("x")
    assert excluded.x is None and excluded.y is y
    assert "x" in data and "missing" not in data


# ---------------------------------------------------------------------- conversion
def test_to_tensordict_and_back():
    data, x, y = make()
    td = data.to_tensordict()
    assert type(td) is TensorDict and td.batch_size == data.batch_size
    assert torch.equal(td["x"], x) and td["x"] is not x
    assert td["label"] == "lab" and "missing" in td and td["missing"] is None
    td_no_none = data.to_tensordict(retain_none=False)
    assert "missing" not in td_no_none
    back = Data.from_tensordict(td_no_none)
    check(back, x, y, (4, 3))
    assert back._td is td_no_none  # wrapped, not copied


def test_from_tensordict_non_tensordict_and_safe():
    td = TensorDict({"x": torch.zeros(2, 5), "y": torch.zeros(2)}, [2])
    data = Data.from_tensordict(td, {"label": "given", "missing": 3})
    assert data.label == "given" and data.missing == 3  # a number cannot carry batch dims
    default = Data.from_tensordict(TensorDict({"x": torch.zeros(2, 5)}, [2]))
    assert default.label == "lab" and default.y is None
    with pytest.raises(TypeError, match="expected a TensorDict"):
        Data.from_tensordict({"x": torch.zeros(2)})
    with pytest.raises(AttributeError, match="not a field"):
        Data.from_tensordict(td, {"nope": 1})


def test_nested_tensorclass_in_tensordict():
    data, x, _ = make()
    td = TensorDict({"data": data, "other": torch.zeros(4)}, [4])
    assert td["data", "x"] is x
    sub = td[1:3]
    assert type(sub["data"]) is Data and torch.equal(sub["data"].x, x[1:3])
    stacked = torch.stack([td, td])
    assert type(stacked["data"]) is Data and stacked["data"].batch_size == torch.Size([2, 4, 3])
    doubled = td.apply(lambda t: t * 2)
    assert type(doubled["data"]) is Data and torch.equal(doubled["data"].x, 2 * x)
    assert td.to_tensordict()["data"].__class__ is TensorDict


def test_state_dict_roundtrip():
    class Inner(TensorClass):
        z: torch.Tensor
        tag: str = "t"

    class Outer(TensorClass):
        inner: Inner
        w: torch.Tensor
        name: str
        nothing: Any = None

    source = Outer(Inner(torch.randn(2, 3), batch_size=[2]), torch.randn(2), "src", batch_size=[2])
    sd = source.state_dict()
    assert set(sd) == {"inner.z", "w"}
    meta = sd._metadata[""]
    assert meta["type"].endswith("Outer") and meta["types"]["inner"].endswith("Inner")
    assert set(meta["non_tensor"]) == {"inner.tag", "name"}
    assert meta["none_fields"] == ["nothing"]
    target = Outer(Inner(torch.zeros(2, 3), batch_size=[2]), torch.zeros(2), "dst", batch_size=[2])
    storage = target.w
    assert target.load_state_dict(sd) is target
    assert torch.equal(target.w, source.w) and target.w is storage
    assert torch.equal(target.inner.z, source.inner.z)
    assert target.name == "src" and target.nothing is None
    with pytest.raises(RuntimeError, match="missing keys"):
        target.load_state_dict({"w": torch.zeros(2)})
    target.load_state_dict({"w": torch.ones(2)}, strict=False)
    assert torch.equal(target.w, torch.ones(2))
    assigned = torch.full((2,), 7.0)
    target.load_state_dict({"w": assigned}, strict=False, assign=True)
    assert target.w is assigned
    nested = source.state_dict(flatten=False)
    assert set(nested) == {"inner", "w"} and set(nested["inner"]) == {"z"}
    fresh = Outer(Inner(torch.zeros(2, 3), batch_size=[2]), torch.zeros(2), "x", batch_size=[2])
    fresh.load_state_dict(nested)
    assert torch.equal(fresh.inner.z, source.inner.z)
    keep_vars = Outer(
        Inner(torch.zeros(2, 3, requires_grad=True), batch_size=[2]),
        torch.zeros(2),
        "k",
        batch_size=[2],
    )
    assert keep_vars.state_dict(keep_vars=True)["inner.z"].requires_grad
    assert not keep_vars.state_dict()["inner.z"].requires_grad


def test_non_tensor_leaf_is_stored_as_nontensordata():
    data, _, _ = make()
    assert isinstance(data._td._data["label"], NonTensorData)
    assert data[0].label == "lab" and data.reshape(-1).label == "lab"
    # unsqueeze lays the value over a new batch: one element each, as tensordict does
    expected = np.full((1, *data.batch_size), "lab", dtype=object).tolist()
    assert data.unsqueeze(0).label == expected
