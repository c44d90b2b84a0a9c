"""``consolidate(filename=...)`` / ``from_consolidated`` with non-tensor values: a value
JSON reads back as another one (a tuple, a dict with int keys) makes the file refuse
to load instead of loading a changed value; exact values and every dtype round-trip.

References are plain Python values and tensors.
"""

from __future__ import annotations

import pickle

import pytest
import torch

from tdfunc import NonTensorData, NonTensorStack, TensorDict


@pytest.mark.parametrize("value", [("x", 1), {1: "a"}, {"k": ("t",)}])
def test_value_json_would_change_is_refused_on_load(tmp_path, value):
    td = TensorDict({"a": torch.ones(2), "v": NonTensorData(value)}, [2])
    path = tmp_path / "c.bin"
    packed = td.consolidate(path)
    # the container consolidate returned keeps the value as it was
    assert packed["v"] == value and type(packed["v"]) is type(value)
    with pytest.raises(ValueError, match="JSON cannot describe exactly"):
        TensorDict.from_consolidated(path)
    # pickling does not go through JSON: the value survives
    assert pickle.loads(pickle.dumps(packed))["v"] == value


def test_exact_values_and_every_dtype_round_trip(tmp_path):
    base = torch.arange(6.0).reshape(2, 3)
    tensors = {
        "f": base,
        "view": base[:, 1],
        "t": base.t().contiguous().t(),
        "b": torch.tensor([True, False]),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "bf": torch.tensor([1.5, 2.5], dtype=torch.bfloat16),
        "c": torch.tensor([1 + 2j, 3 - 1j]),
        "empty": torch.empty(2, 0),
    }
    values = {"s": "hello", "d": {"a": [1, None, 2.5, True]}}
    td = TensorDict(
        {
            **tensors,
            "s": "hello",
            "d": NonTensorData(values["d"]),
            "st": NonTensorStack(["p", "q"], batch_size=[2]),
        },
        [2],
    )
    path = tmp_path / "c.bin"
    td.consolidate(path)
    loaded = TensorDict.from_consolidated(path)
    for key, expected in tensors.items():
        got = loaded[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)
    for key, expected in values.items():
        assert loaded[key] == expected
    assert list(loaded["st"]) == ["p", "q"]
