"""``from_arrow`` / ``to_arrow``: columns compared with pyarrow's own reading of the table
(``to_pylist``, ``to_numpy``), round trips, tensordict 0.15.3 run in its own process where
that process has pyarrow, and the errors."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorDict, from_arrow, tensorclass, to_arrow

pa = pytest.importorskip(
    "pyarrow", reason="from_arrow / to_arrow need pyarrow (pip install pyarrow)"
)

PROBE = r"""
import torch, warnings
warnings.simplefilter("ignore")
import pyarrow as pa
from LIB import TensorDict, from_arrow, to_arrow
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
def d(td):
    out = []
    for k, v in td.items(True, True):
        out.append((str(k), str(v.dtype), [t.tolist() for t in v.unbind()] if v.is_nested else v.tolist()))
    return list(td.batch_size), sorted(out, key=str)
table = pa.table({"x": pa.array([1.0, 2.0, 3.0]), "i": pa.array([1, 2, 3], type=pa.int32()), "b": pa.array([True, False, True]), "ids": pa.array([[1, 2], [3], []]), "text": pa.array(["a", "b", "c"]),
  "fx": pa.array([[1, 2], [3, 4], [5, 6]], type=pa.list_(pa.int64(), 2)), "st": pa.array([{"u": 1, "v": 0.5}, {"u": 2, "v": 1.5}, {"u": 3, "v": 2.5}]), "h": pa.array([1.5, 2.5, 3.5], type=pa.float32()),
  "t": pa.FixedShapeTensorArray.from_numpy_ndarray(torch.arange(12.).view(3, 2, 2).numpy())})
print(d(from_arrow(table)), from_arrow(table).get("text").tolist())
print(d(from_arrow(table.to_batches()[0])), d(from_arrow(table, copy=True)), d(from_arrow(table, copy=False)))
nt = pa.table({"y": pa.array([1.0, None]), "k": pa.array([1, None]), "l": pa.array([[1], None]), "st": pa.array([{"u": 1.0}, None])})
print(run(lambda: from_arrow(nt)), d(from_arrow(nt, nulls="fill")), d(from_arrow(nt, nulls="mask")), d(from_arrow(nt, nulls="mask", mask_key=("m", "k"))))
print(run(lambda: from_arrow(nt, mask_key="m")), run(lambda: from_arrow(nt, nulls="drop")), d(from_arrow(pa.table({"x": pa.chunked_array([[1.0], [2.0, 3.0]])}))))
td = TensorDict(x=torch.tensor([1.0, 2.0]), image=torch.arange(24.).view(2, 3, 4), obs=TensorDict(y=torch.tensor([3, 4]), batch_size=[2]), s=["a", "b"], flag=torch.tensor([True, False]), batch_size=[2])
print(to_arrow(td).schema)
print(to_arrow(td).to_pylist()[1]["obs"], to_arrow(td).column("s").to_pylist(), d(from_arrow(to_arrow(td))))
nt2 = torch.nested.nested_tensor([torch.arange(2), torch.arange(3)], layout=torch.jagged)
print(to_arrow(TensorDict(j=nt2, batch_size=[2])).schema, to_arrow(TensorDict(j=nt2, batch_size=[2])).to_pylist())
print(run(lambda: to_arrow(TensorDict(a=torch.zeros(2, 2), batch_size=[2, 2]))), to_arrow(TensorDict(batch_size=[3])).num_rows)
"""


@pytest.mark.slow  # a tensordict process
def test_arrow_as_tensordict():
    if tensordict_peer.run("import pyarrow").returncode != 0:
        pytest.skip("the interpreter that runs tensordict has no pyarrow")
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _table():
    return pa.table(
        {
            "x": pa.array([1.0, 2.0, 3.0]),
            "i": pa.array([1, 2, 3], type=pa.int16()),
            "ids": pa.array([[1, 2], [3], []]),
            "fx": pa.array([[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]], type=pa.list_(pa.float32(), 2)),
            "st": pa.array([{"u": 1, "w": "p"}, {"u": 2, "w": "q"}, {"u": 3, "w": "r"}]),
            "text": pa.array(["a", None, "c"]),
        }
    )


def test_every_column_equals_pyarrow_s_own_reading():
    table = _table()
    td = from_arrow(table, nulls="fill")
    assert td.batch_size == torch.Size([3])
    assert td["x"].tolist() == table.column("x").to_pylist() and td["x"].dtype == torch.float64
    assert td["i"].tolist() == table.column("i").to_pylist() and td["i"].dtype == torch.int16
    assert [t.tolist() for t in td["ids"].unbind()] == table.column("ids").to_pylist()
    assert td["fx"].tolist() == table.column("fx").to_pylist() and td["fx"].dtype == torch.float32
    assert td["st", "u"].tolist() == [row["u"] for row in table.column("st").to_pylist()]
    assert td["st"].get("w").tolist() == ["p", "q", "r"]
    assert td.get("text").tolist() == ["a", None, "c"]
    # a column of lists of lists: one value per row, whatever the nesting
    nested = pa.table({"ll": pa.array([[[1], [2]], [[3]]])})
    assert from_arrow(nested).get("ll").tolist() == nested.column("ll").to_pylist()
    # a slice of a table reads its own rows
    part = table.slice(1, 2)
    sliced = from_arrow(part, nulls="fill")
    assert sliced["x"].tolist() == part.column("x").to_pylist()
    assert [t.tolist() for t in sliced["ids"].unbind()] == part.column("ids").to_pylist()
    assert sliced["st", "u"].tolist() == [row["u"] for row in part.column("st").to_pylist()]


def test_views_and_copies():
    table = pa.table({"x": pa.array([1.0, 2.0, 3.0])})
    address = table.column("x").chunks[0].buffers()[1].address
    assert from_arrow(table)["x"].data_ptr() == address  # a mutable buffer is viewed
    assert from_arrow(table, copy=True)["x"].data_ptr() != address
    # an immutable buffer (bytes) is copied unless copy=False
    frozen = pa.py_buffer(torch.arange(3.0, dtype=torch.float64).numpy().tobytes())
    assert not frozen.is_mutable
    table = pa.table({"x": pa.Array.from_buffers(pa.float64(), 3, [None, frozen])})
    assert from_arrow(table)["x"].data_ptr() != frozen.address
    assert from_arrow(table, copy=False)["x"].data_ptr() == frozen.address
    assert from_arrow(table)["x"].tolist() == [0.0, 1.0, 2.0]


def test_nulls_raise_fill_or_mask():
    table = pa.table(
        {"y": pa.array([1.0, None]), "k": pa.array([None, 4]), "l": pa.array([[1], None])}
    )
    with pytest.raises(ValueError, match=r"tdfunc.from_arrow: the column 'y' has 1 null row\(s\)"):
        from_arrow(table)
    filled = from_arrow(table, nulls="fill")
    assert torch.isnan(filled["y"][1]) and filled["k"].tolist() == [0, 4]
    assert [t.tolist() for t in filled["l"].unbind()] == [[1], []]
    masked = from_arrow(table, nulls="mask", mask_key="valid")
    assert masked["valid", "y"].tolist() == [True, False] and masked["valid", "k"].tolist() == [
        False,
        True,
    ]
    assert masked["valid", "l"].tolist() == [True, False]


@tensorclass
class _Row:
    x: torch.Tensor
    label: str = None


def test_round_trips():
    td = TensorDict(
        x=torch.randn(4),
        img=torch.randn(4, 2, 3),
        n={"y": torch.arange(4), "deep": {"z": torch.rand(4)}},
        s=["a", "b", "c", "d"],
        flag=torch.tensor([True, False, True, False]),
        batch_size=[4],
    )
    back = from_arrow(to_arrow(td))
    for key in ("x", "img", ("n", "y"), ("n", "deep", "z"), "flag"):
        assert torch.equal(back[key], td[key]), key
    assert back.get("s").tolist() == ["a", "b", "c", "d"]
    jagged = torch.nested.nested_tensor([torch.arange(2.0), torch.arange(3.0)], layout=torch.jagged)
    table = to_arrow(TensorDict(j=jagged, batch_size=[2]))
    assert table.column("j").to_pylist() == [[0.0, 1.0], [0.0, 1.0, 2.0]]
    row = _Row(x=torch.arange(3.0), label="r", batch_size=[3])
    assert to_arrow(row).to_pylist() == [
        {"x": 0.0, "label": "r"},
        {"x": 1.0, "label": "r"},
        {"x": 2.0, "label": "r"},
    ]
    assert to_arrow(TensorDict(batch_size=[3])).num_rows == 0


def test_errors_name_the_function_and_the_problem():
    with pytest.raises(
        ValueError, match=r"nulls must be one of \['raise', 'fill', 'mask'\], got 'drop'"
    ):
        from_arrow(_table(), nulls="drop")
    with pytest.raises(ValueError, match="mask_key is for nulls='mask'"):
        from_arrow(_table(), mask_key="m")
    with pytest.raises(TypeError, match="copy must be None, True or False"):
        from_arrow(_table(), copy="yes")
    with pytest.raises(TypeError, match="expected a pyarrow Table or RecordBatch"):
        from_arrow(42)
    with pytest.raises(
        ValueError, match=r"a table has one batch dim \(its rows\); the batch size is \[2, 2\]"
    ):
        to_arrow(TensorDict(a=torch.zeros(2, 2), batch_size=[2, 2]))
    with pytest.raises(
        TypeError, match="expected a TensorDict or a TensorClass instance, got Tensor"
    ):
        to_arrow(torch.zeros(2))
    with pytest.raises(TypeError, match="is bfloat16, which Arrow has no type for"):
        to_arrow(TensorDict(a=torch.zeros(2, dtype=torch.bfloat16), batch_size=[2]))
    clash = pa.table({"_mask": pa.array([1.0, 2.0]), "y": pa.array([1.0, None])})
    with pytest.raises(
        ValueError, match=r"writes the masks under '_mask', where the table has a column '_mask'"
    ):
        from_arrow(clash, nulls="mask")
    assert from_arrow(clash, nulls="mask", mask_key="valid")["valid", "y"].tolist() == [True, False]
    with pytest.raises(ValueError, match="holds null values inside its lists"):
        from_arrow(pa.table({"l": pa.array([[1, None]])}), nulls="fill")


@pytest.mark.parametrize("nulls", ["raise", "fill", "mask"])
def test_nulls_with_no_value_to_fill_are_refused_in_every_mode(nulls):
    # a null inside a fixed-size row was read as 0 (no mask, even with nulls="raise")
    inner = pa.table({"a": pa.array([[1, None], [3, 4]], pa.list_(pa.int64(), 2))})
    with pytest.raises(ValueError, match="fixed-size list column 'a' holds null values"):
        from_arrow(inner, nulls=nulls)
    rows = pa.array([[1, 2], None], pa.list_(pa.int32(), 2))
    tensor = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int32(), [2]), rows)
    with pytest.raises(ValueError, match=r"fixed-shape tensor column 't' has 1 null row\(s\)"):
        from_arrow(pa.table({"t": tensor}), nulls=nulls)


def test_repeated_names_are_refused():
    # Arrow allows them; as keys all but the last column or field were dropped silently
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])
    assert table.column_names == ["a", "a"]
    with pytest.raises(ValueError, match="the table has more than one column named 'a'"):
        from_arrow(table)
    struct = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    with pytest.raises(ValueError, match="struct column 's' has more than one field named 'x'"):
        from_arrow(pa.table({"s": struct}))


def test_jagged_rows_with_gaps_give_their_own_values():
    # a jagged tensor with lengths (rows that end before the next starts) gave each
    # row the values up to the next row's start
    values = torch.arange(10.0)
    offsets, lengths = torch.tensor([0, 3, 7, 10]), torch.tensor([2, 0, 3])
    ragged = torch.nested.nested_tensor_from_jagged(values, offsets, lengths=lengths)
    expected = [values[o : o + n].tolist() for o, n in zip(offsets.tolist(), lengths.tolist())]
    table = to_arrow(TensorDict(j=ragged, batch_size=[3]))
    assert table.column("j").to_pylist() == expected == [[0.0, 1.0], [], [7.0, 8.0, 9.0]]
    back = from_arrow(table)["j"]
    assert [row.tolist() for row in back.unbind()] == expected
    shifted = torch.nested.nested_tensor_from_jagged(values, torch.tensor([2, 4, 7]))
    assert to_arrow(TensorDict(j=shifted, batch_size=[2])).column("j").to_pylist() == [
        [2.0, 3.0],
        [4.0, 5.0, 6.0],
    ]


def test_strided_nested_tensor_is_refused_with_the_layout_to_use():
    strided = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(TypeError, match=r"has the layout torch.strided; .* torch.jagged"):
        to_arrow(TensorDict(j=strided, batch_size=[2]))
