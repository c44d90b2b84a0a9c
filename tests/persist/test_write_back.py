"""A memory-mapped non-tensor leaf's in-place update is written to its directory.

References are the plain Python values written.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorData, TensorDict

VALUES = [("x", "y"), (0, 1), (0.5, 1.5), ([0, "s", 2], [9, "t", 11]), ({"k": 1, 2: 3}, {"k": 4})]


@pytest.mark.parametrize("values", VALUES)
def test_update_of_a_memmapped_leaf_reaches_the_files(tmp_path, values):
    before, after = values
    td = TensorDict({"val": NonTensorData(before), "n": {"s": NonTensorData(before)}}, [])
    td.memmap_(tmp_path)
    assert td._is_memmap and td.is_locked
    for key in ("val", ("n", "s")):
        leaf = td.get(key)
        assert leaf._is_memmap and leaf._tensordict._is_memmap
        with pytest.raises(RuntimeError, match="lock"):
            leaf.update(NonTensorData(after))
        leaf.update_(NonTensorData(after))
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded["val"] == after and loaded["n", "s"] == after
    # a loaded leaf is mapped too: its updates reach the files
    loaded.get("val").update_(NonTensorData(before))
    assert TensorDict.load_memmap(tmp_path)["val"] == before
    assert not TensorDict({"val": NonTensorData(before)}, [])._is_memmap


def test_update_inside_a_tensorclass_reaches_the_files(tmp_path):
    from tdfunc import TensorClass

    class Item(TensorClass):
        x: torch.Tensor
        label: str

    td = TensorDict({"item": Item(x=torch.zeros(2), label="a", batch_size=[2])}, [2])
    td.memmap_(tmp_path)
    stored = td.get(("item", "label"))
    assert isinstance(stored, NonTensorData)
    stored.update_(NonTensorData("b", batch_size=[2]))
    assert TensorDict.load_memmap(tmp_path)["item"].label == "b"
