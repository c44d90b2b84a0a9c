"""A TensorClass field given a ``NonTensorStack`` (``_tensorclass/fields.py``) and pickling a
consolidated TensorClass, checked against the Python lists they hold."""

import pathlib

import pytest
import torch

from tdfunc import NonTensorStack, TensorClass, tensorclass


class Tagged(TensorClass):
    tag: str = None


@tensorclass(autocast=True)
class TaggedCast:
    tag: str = None


@pytest.mark.parametrize("cls", [Tagged, TaggedCast])
def test_a_stack_field_keeps_one_value_per_element(cls):
    values = ["a", "b", "c"]
    obj = cls(batch_size=3)
    obj.tag = NonTensorStack.from_list(values)
    assert [obj[i].tag for i in range(3)] == values
    obj = cls(tag=NonTensorStack(*values), batch_size=3)
    assert [obj[i].tag for i in range(3)] == values
    with pytest.raises(ValueError, match="does not start with"):
        cls(tag=NonTensorStack("a", "b"), batch_size=3)


@tensorclass
class Record:
    x: torch.Tensor
    y: torch.Tensor
    z: str


@pytest.mark.parametrize("to_file", [False, True])
def test_torch_save_of_a_consolidated_tensorclass(tmp_path: pathlib.Path, to_file):
    data = Record(torch.arange(2.0), torch.ones(2, 3, dtype=torch.int64), "note", batch_size=[2])
    packed = data.consolidate(filename=tmp_path / "c.mmap" if to_file else None)
    torch.save(packed, tmp_path / "d.pt")
    loaded = torch.load(tmp_path / "d.pt", weights_only=False)
    assert isinstance(loaded, Record) and loaded.z == "note"
    assert torch.equal(loaded.x, torch.arange(2.0))
    assert torch.equal(loaded.y, torch.ones(2, 3, dtype=torch.int64))
    assert loaded.batch_size == torch.Size([2])
