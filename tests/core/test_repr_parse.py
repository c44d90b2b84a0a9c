"""``parse_tensor_dict_string``: a printed container read back, every tensor zero-filled."""

from __future__ import annotations

import pytest
import torch
from corpus import CORPUS, plain_leaves, raw_sample

from tdfunc import TensorDict, parse_tensor_dict_string


def _structure(td) -> list:
    """Every level's key path and batch size, and every leaf's path, shape and dtype."""
    out = []
    for key, value in td.items(True):
        path = key if isinstance(key, tuple) else (key,)
        if isinstance(value, torch.Tensor):
            out.append((path, "tensor", tuple(value.shape), value.dtype))
        else:
            out.append((path, "level", tuple(value.batch_size), value.names))
    return sorted(out, key=repr)


@pytest.mark.parametrize("name", [n for n in CORPUS if n != "non_tensor"])
def test_round_trip_over_the_corpus(name):
    td = CORPUS[name]()
    again = parse_tensor_dict_string(str(td))
    assert type(again) is TensorDict
    assert again.batch_size == td.batch_size and again.names == td.names
    assert again.device == td.device
    assert _structure(again) == _structure(td)
    for _, leaf in again.items(True, True):
        assert not leaf.any()  # the repr holds no values: zeros stand in


def test_keys_with_spaces_devices_and_a_tensorclass():
    plain = {"the key": torch.ones(2, 3, dtype=torch.float16), "n": {"m": torch.ones(2)}}
    td = TensorDict(plain, [2], device="cpu")
    again = parse_tensor_dict_string(str(td))
    assert again.device == torch.device("cpu")
    assert again["the key"].dtype == torch.float16 and again["n", "m"].shape == (2,)
    raw, batch_size = raw_sample()
    raw = {k: v for k, v in raw.items() if k != "label"}
    from corpus import Sample

    sample = Sample(raw["obs"], raw["reward"], TensorDict(raw["extra"], batch_size), None)
    sample.batch_size = batch_size
    fields = parse_tensor_dict_string(str(sample))  # a TensorClass: a TensorDict of its fields
    expected = plain_leaves(raw)
    assert {k if isinstance(k, tuple) else (k,) for k in fields.keys(True, True)} == set(expected)
    for path, tensor in expected.items():
        assert fields[path].shape == tensor.shape and fields[path].dtype == tensor.dtype


def test_errors():
    with pytest.raises(ValueError, match=r"non-tensor value at key \('meta', 'tag'\)"):
        parse_tensor_dict_string(str(CORPUS["non_tensor"]()))
    with pytest.raises(ValueError, match="cannot read"):
        parse_tensor_dict_string("not a repr")
    with pytest.raises(TypeError, match="expected the printed text"):
        parse_tensor_dict_string(TensorDict())
