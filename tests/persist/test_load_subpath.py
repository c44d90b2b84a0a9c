"""``load_memmap(subpath=..., mode=...)``: loading one nested container of a checkpoint."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict


class Layer(TensorClass):
    weight: torch.Tensor


def _plain() -> dict:
    return {
        "Encoder": {"layers": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}},
        "head": torch.zeros(4),
    }


@pytest.mark.parametrize("layout", ["tdfunc", "tensordict"])
@pytest.mark.parametrize("subpath", ["Encoder/layers", ("Encoder", "layers"), "Encoder/layers/"])
def test_subpath_loads_the_nested_container(tmp_path, layout, subpath):
    plain = _plain()
    TensorDict(plain, []).memmap(tmp_path, format=layout)
    sub = TensorDict.load_memmap(tmp_path, subpath=subpath)
    assert set(sub.keys()) == {"w", "b"}
    for key in ("w", "b"):
        assert torch.equal(sub[key], plain["Encoder"]["layers"][key])


def test_subpath_is_write_through_in_both_modes(tmp_path):
    TensorDict(_plain(), []).memmap(tmp_path)
    for mode in ("r", "r+"):
        TensorDict.load_memmap(tmp_path, subpath="Encoder/layers", mode=mode)["b"].add_(1)
    whole = TensorDict.load_memmap(tmp_path)
    assert torch.equal(whole["Encoder", "layers", "b"], torch.full((2,), 3.0))


def test_subpath_keeps_the_saved_class(tmp_path):
    TensorDict({"block": {"layer": Layer(weight=torch.ones(2, 2), batch_size=[2])}}, []).memmap(
        tmp_path
    )
    layer = TensorDict.load_memmap(tmp_path, subpath="block/layer")
    assert isinstance(layer, Layer) and torch.equal(layer.weight, torch.ones(2, 2))


def test_subpath_and_mode_errors(tmp_path):
    TensorDict(_plain(), []).memmap(tmp_path)
    with pytest.raises(KeyError, match=r"nested containers at that level are \['layers'\]"):
        TensorDict.load_memmap(tmp_path, subpath=("Encoder", "missing"))
    with pytest.raises(KeyError, match="no nested container"):  # a tensor is not a container
        TensorDict.load_memmap(tmp_path, subpath="head")
    with pytest.raises(KeyError, match="no nested container"):
        TensorDict.load_memmap(tmp_path, subpath="Encoder/../Encoder")
    with pytest.raises(ValueError, match="mode must be 'r' or 'r\\+'"):
        TensorDict.load_memmap(tmp_path, mode="w")
