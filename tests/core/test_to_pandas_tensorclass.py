"""``to_pandas`` of a container holding TensorClass instances: one column of objects (the
TensorClass of each row), or one column per leaf with a separator; the reference is the
container read row by row."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict, tensorclass

pd = pytest.importorskip("pandas", reason="to_pandas needs pandas (pip install 'tdfunc[tables]')")


@tensorclass
class _Point:
    x: torch.Tensor
    y: torch.Tensor


@tensorclass
class _Image:
    pixels: torch.Tensor
    label: torch.Tensor


@tensorclass
class _Nothing:
    pass


def _points(rows: int) -> _Point:
    return _Point(x=torch.arange(float(rows)), y=torch.arange(float(rows)) * 10, batch_size=[rows])


@pytest.mark.parametrize("rows", [0, 1, 3])
def test_without_a_separator_a_tensorclass_is_a_column_of_objects(rows):
    td = TensorDict(p=_points(rows), a=torch.arange(rows), s="tag", batch_size=[rows])
    frame = td.to_pandas()
    assert list(frame.columns) == ["p", "a", "s"] and len(frame) == rows
    assert frame["p"].dtype == object
    for i in range(rows):
        row = frame["p"][i]
        assert type(row) is _Point and row.batch_size == torch.Size([])
        assert torch.equal(row.x, td["p"].x[i]) and torch.equal(row.y, td["p"].y[i])
    assert frame["a"].tolist() == list(range(rows)) and frame["s"].tolist() == ["tag"] * rows


def test_with_a_separator_each_leaf_is_a_column():
    td = TensorDict(p=_points(3), batch_size=[3])
    frame = td.to_pandas(separator=".")
    assert list(frame.columns) == ["p.x", "p.y"]
    assert frame["p.y"].tolist() == [0.0, 10.0, 20.0]


def test_a_tensorclass_that_cannot_be_split_stays_one_column():
    images = _Image(pixels=torch.rand(2, 4, 4), label=torch.tensor([1, 0]), batch_size=[2])
    empty = _Nothing(batch_size=[2])
    td = TensorDict(img=images, none=empty, batch_size=[2])
    frame = td.to_pandas(separator="/")
    assert list(frame.columns) == ["img", "none"]
    assert torch.equal(frame["img"][1].pixels, images.pixels[1])
    assert type(frame["none"][0]) is _Nothing
    # a nested TensorDict still needs a separator
    with pytest.raises(ValueError, match="is a nested container; pass a separator"):
        TensorDict(n={"x": torch.zeros(2)}, batch_size=[2]).to_pandas()


@pytest.mark.parametrize("nested", ["tensorclass", "tensordict"])
def test_two_entries_that_join_to_one_column_name_are_refused(nested):
    # the key "p.x" and the nested entry ("p", "x") both made the column "p.x": the
    # second silently replaced the first
    inner = (
        _Point(x=torch.ones(3), y=torch.ones(3), batch_size=[3])
        if nested == "tensorclass"
        else TensorDict(x=torch.ones(3), batch_size=[3])
    )
    td = TensorDict({"p.x": torch.zeros(3), "p": inner}, batch_size=[3])
    with pytest.raises(ValueError, match=r"two entries give the column name 'p\.x'"):
        td.to_pandas(separator=".")
    frame = td.to_pandas(separator="/")
    assert frame["p.x"].tolist() == [0.0] * 3 and frame["p/x"].tolist() == [1.0] * 3
