"""``consolidate``: one storage for every leaf (jagged tensors included), its
``_consolidated`` record, the end of a consolidation on ``unlock_``, moves and pickles.

References are the unconsolidated tensors and plain Python values.
"""

from __future__ import annotations

import io
import pickle
import warnings

import torch

from tdfunc import TensorClass, TensorDict
from tdfunc.utils import TensorDictFuture


class Pair(TensorClass):
    x: torch.Tensor
    y: torch.Tensor


def _jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor(rows, layout=torch.jagged)


def _mixed() -> tuple[TensorDict, dict]:
    plain = {
        "a": torch.arange(3.0),
        ("b", "c"): torch.arange(6, dtype=torch.float16).reshape(3, 2),
        "g": torch.full((3, 2), 2.0, dtype=torch.float64),
        "i": torch.arange(3, dtype=torch.int32),
    }
    td = TensorDict({"a": plain["a"], "b": {"c": plain["b", "c"]}, "g": plain["g"]}, [3])
    td["i"] = plain["i"]
    td["s"] = "text"
    return td, plain


def _rows() -> list[list[torch.Tensor]]:
    return [
        [torch.arange(1.0), torch.arange(2.0) + 1],
        [
            torch.full((1, 3), 2.0, dtype=torch.float64),
            torch.full((2, 3), 3.0, dtype=torch.float64),
        ],
    ]


def _jagged_td() -> TensorDict:
    rows_a, rows_g = _rows()
    return TensorDict({"a": _jagged(rows_a), "e": {"g": _jagged(rows_g)}, "s": "x"}, [2])


def _assert_rows(td: TensorDict) -> None:
    rows_a, rows_g = _rows()
    for key, rows in (("a", rows_a), (("e", "g"), rows_g)):
        got = list(td[key].unbind(0))
        assert len(got) == len(rows)
        for value, row in zip(got, rows):
            assert torch.equal(value, row)


def test_storage_record_is_the_one_buffer_every_leaf_views():
    td, plain = _mixed()
    out = td.consolidate()
    record = out._consolidated
    storage = record["storage"]
    assert storage.dtype == torch.uint8 and storage.dim() == 1
    assert record["metadata"]["root"]["entries"]["s"]["value"] == "text"
    for key, value in plain.items():
        assert torch.equal(out[key], value)
    storage.mul_(0)
    for key, value in plain.items():
        assert torch.equal(out[key], torch.zeros_like(value))
    assert out["s"] == "text"
    assert torch.equal(td["a"], plain["a"])  # the source is untouched
    assert not hasattr(td, "_consolidated")


def test_tensorclass_has_the_record_too():
    pair = Pair(x=torch.ones(2, 3), y=torch.arange(2.0), batch_size=[2]).consolidate()
    assert pair.is_consolidated()
    pair._consolidated["storage"].zero_()
    assert torch.equal(pair.x, torch.zeros(2, 3)) and torch.equal(pair.y, torch.zeros(2))


def test_equal_containers_give_equal_bytes():
    td = TensorDict({f"k{i}": torch.full((i % 3 + 1,), i, dtype=torch.float16) for i in range(9)})
    first, second = td.consolidate(), td.consolidate()
    assert torch.equal(first._consolidated["storage"], second._consolidated["storage"])


def test_unlock_ends_the_consolidation():
    out = _mixed()[0].consolidate()
    with out.unlock_():
        assert not out.is_consolidated() and not hasattr(out, "_consolidated")
        out["new"] = torch.zeros(3)
    assert out.is_locked and not out.is_consolidated()


def test_move_keeps_it_consolidated_and_pickles_rebuild_it():
    td, plain = _mixed()
    out = td.consolidate()
    moved = out.to("cpu")
    assert moved.is_consolidated() and moved.is_locked
    for copy in (pickle.loads(pickle.dumps(out)), _torch_roundtrip(out)):
        assert copy.is_consolidated() and copy.is_locked and copy["s"] == "text"
        for key, value in plain.items():
            assert torch.equal(copy[key], value) and copy[key].dtype == value.dtype


def _torch_roundtrip(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_jagged_leaves_are_packed_and_rebuilt():
    td = _jagged_td()
    out = td.consolidate(metadata=True)
    _assert_rows(out)
    pointer = out._consolidated["storage"].untyped_storage().data_ptr()
    for key in ("a", ("e", "g")):
        assert out[key].values().untyped_storage().data_ptr() == pointer
        assert out[key].offsets().untyped_storage().data_ptr() == pointer
        assert torch.equal(out[key].offsets(), td[key].offsets())
    _assert_rows(_torch_roundtrip(out))
    _assert_rows(pickle.loads(pickle.dumps(out)))
    out._consolidated["storage"].zero_()
    assert not out["a"].values().any() and not out["e", "g"].offsets().any()


def test_jagged_leaves_through_a_file(tmp_path):
    path = tmp_path / "td.bin"
    _jagged_td().consolidate(filename=path)
    loaded = TensorDict.from_consolidated(path)
    assert loaded.is_consolidated() and loaded["s"] == "x"
    _assert_rows(loaded)


def test_return_early_gives_a_future():
    td, plain = _mixed()
    future = td.consolidate(return_early=True)
    assert isinstance(future, TensorDictFuture)
    out = future.result()
    assert out.is_consolidated() and torch.equal(out["a"], plain["a"])
