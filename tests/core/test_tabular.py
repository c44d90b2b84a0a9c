"""Tables in and out of containers: pandas DataFrames, CSV, JSON and Parquet files.

The reference is the table itself, read column by column with pandas and numpy.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import tdfunc
from tdfunc import NonTensorStack, TensorClass, TensorDict


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "obs.x": rng.standard_normal(5),
            "obs.y": rng.standard_normal(5).astype(np.float32),
            "action": rng.integers(0, 4, 5),
            "done": [False, True, False, False, True],
            "name": list("abcde"),
        }
    )


def test_from_pandas_matches_the_columns():
    frame = _frame()
    td = TensorDict.from_pandas(frame)
    assert td.batch_size == (5,)
    assert list(td.keys()) == list(frame.columns)
    for column in ["obs.x", "obs.y", "action", "done"]:
        want = torch.tensor(frame[column].to_numpy())
        assert td[column].dtype == want.dtype
        assert torch.equal(td[column], want)
    assert isinstance(td.get("name"), NonTensorStack)
    assert list(td["name"]) == list(frame["name"])
    # the tensors are copies: writing them leaves the frame alone
    td["action"].add_(100)
    assert (frame["action"] < 100).all()


def test_separator_nests_and_joins():
    frame = _frame()
    td = TensorDict.from_pandas(frame, separator=".")
    assert set(td.keys()) == {"obs", "action", "done", "name"}
    assert td["obs"].batch_size == (5,)
    assert torch.equal(td["obs", "x"], torch.tensor(frame["obs.x"].to_numpy()))
    back = td.to_pandas(separator=".")
    assert sorted(back.columns) == sorted(frame.columns)
    for column in frame.columns:
        assert back[column].tolist() == frame[column].tolist()
        assert back[column].dtype == frame[column].dtype


def test_separator_conflicts_are_refused():
    frame = pd.DataFrame({"obs": [1, 2], "obs.x": [3, 4]})
    with pytest.raises(ValueError, match="prefix"):
        TensorDict.from_pandas(frame, separator=".")
    with pytest.raises(ValueError, match="prefix"):
        TensorDict.from_pandas(frame[["obs.x", "obs"]], separator=".")


def test_dtype_casts_quantities_not_dates_or_codes():
    frame = pd.DataFrame(
        {
            "a": [1, 2, 3],
            "b": [0.5, 1.5, 2.5],
            "when": pd.to_datetime(["2020-01-01 00:00", "2021-06-15 12:00", "1969-12-31 23:59"]),
            "kind": pd.Categorical(["x", "y", "x"]),
        }
    )
    td = TensorDict.from_pandas(frame, dtype=torch.float32)
    assert td["a"].dtype == td["b"].dtype == torch.float32
    assert td["a"].tolist() == [1.0, 2.0, 3.0]
    want = frame["when"].to_numpy(dtype="datetime64[ns]").view(np.int64).tolist()
    assert td["when"].dtype == torch.int64 and td["when"].tolist() == want
    assert td["kind"].tolist() == frame["kind"].cat.codes.tolist()


def test_time_zones_and_durations_become_utc_nanoseconds():
    when = pd.Series(pd.to_datetime(["2020-01-01 00:00"]).tz_localize("Europe/Paris"))
    frame = pd.DataFrame({"when": when, "took": pd.to_timedelta(["1s"])})
    td = TensorDict.from_pandas(frame)
    utc = pd.Timestamp("2019-12-31 23:00").value  # midnight in Paris, in UTC
    assert td["when"].tolist() == [utc]
    assert td["took"].tolist() == [10**9]


def test_missing_values():
    frame = pd.DataFrame(
        {
            "f": pd.array([1.5, None], dtype="Float64"),
            "i": pd.array([1, None], dtype="Int64"),
            "j": pd.array([1, 2], dtype="Int64"),
            "s": ["a", None],
        }
    )
    td = TensorDict.from_pandas(frame)
    assert td["f"][0].item() == 1.5 and torch.isnan(td["f"][1])
    assert list(td["i"]) == [1, None]  # no integer stands for a missing one: kept as values
    assert td["j"].dtype == torch.int64 and td["j"].tolist() == [1, 2]
    assert list(td["s"]) == ["a", None]


def test_a_list_value_is_one_row():
    frame = pd.DataFrame({"tags": [["a", "b"], ["c", "d"]]})
    td = TensorDict.from_pandas(frame)
    assert td.batch_size == (2,) and td.get("tags").batch_size == (2,)
    assert list(td["tags"]) == [["a", "b"], ["c", "d"]]


def test_batch_size_options():
    frame = pd.DataFrame({"a": np.arange(6)})
    assert TensorDict.from_pandas(frame, batch_size=[]).batch_size == ()
    assert TensorDict.from_pandas(frame, auto_batch_size=True).batch_size == (6,)
    with pytest.raises(TypeError, match="onflicting"):
        TensorDict.from_pandas(frame, auto_batch_size=True, batch_size=[6])
    assert TensorDict.from_pandas(pd.DataFrame({"a": []})).batch_size == (0,)
    assert TensorDict.from_pandas(frame, device="cpu").device == torch.device("cpu")
    with pytest.raises(TypeError, match="DataFrame"):
        TensorDict.from_pandas({"a": [1]})


def test_duplicate_names_are_refused():
    frame = pd.DataFrame([[1, 2]], columns=[1, "1"])
    with pytest.raises(ValueError, match="both named"):
        TensorDict.from_pandas(frame)


def test_to_pandas_refusals():
    with pytest.raises(ValueError, match="separator"):
        TensorDict({"a": {"b": torch.zeros(2)}}, [2]).to_pandas()
    with pytest.raises(ValueError, match="Cannot convert tensor"):
        TensorDict({"a": torch.zeros(2, 3)}, [2]).to_pandas()
    with pytest.raises(ValueError, match="one batch dim"):
        TensorDict({"a": torch.zeros(2, 3)}, [2, 3]).to_pandas()


def test_to_pandas_values():
    td = TensorDict({"a": torch.arange(3), "h": torch.ones(3, dtype=torch.bfloat16)}, [3])
    td.set_non_tensor("label", "train")
    td["names"] = NonTensorStack.from_list(["x", "y", "z"])
    frame = td.to_pandas()
    assert frame["a"].tolist() == [0, 1, 2] and frame["a"].dtype == np.int64
    assert frame["h"].tolist() == [1.0, 1.0, 1.0]
    assert frame["label"].tolist() == ["train"] * 3
    assert frame["names"].tolist() == ["x", "y", "z"]


def test_csv_round_trip(tmp_path):
    frame = _frame()
    path = tmp_path / "data.csv"
    TensorDict.from_pandas(frame, separator=".").to_csv(path, separator=".")
    reread = pd.read_csv(path)
    assert list(reread.columns) == list(frame.columns)
    back = TensorDict.from_csv(path, separator=".")
    assert torch.allclose(back["obs", "x"], torch.tensor(frame["obs.x"].to_numpy()))
    assert torch.equal(back["action"], torch.tensor(frame["action"].to_numpy()))
    assert list(back["name"]) == list(frame["name"])
    # keyword arguments reach pandas
    assert list(TensorDict.from_csv(path, usecols=["action"]).keys()) == ["action"]


def test_json_round_trip(tmp_path):
    td = TensorDict({"a": torch.arange(3), "b": torch.tensor([0.5, 1.5, 2.5])}, [3])
    for lines in (False, True):
        path = tmp_path / f"data{lines}.json"
        td.to_json(path, lines=lines)
        text = path.read_text()
        records = [json.loads(line) for line in text.splitlines()] if lines else json.loads(text)
        assert records == [{"a": 0, "b": 0.5}, {"a": 1, "b": 1.5}, {"a": 2, "b": 2.5}]
        back = TensorDict.from_json(path, lines=lines)
        assert torch.equal(back["a"], td["a"]) and torch.equal(back["b"], td["b"].double())


def test_parquet_round_trip(tmp_path):
    frame = _frame()
    path = tmp_path / "data.parquet"
    TensorDict.from_pandas(frame).to_parquet(path)
    back = TensorDict.from_parquet(path)
    for column in ["obs.x", "obs.y", "action", "done"]:
        assert torch.equal(back[column], torch.tensor(frame[column].to_numpy()))
    assert list(back["name"]) == list(frame["name"])
    picked = TensorDict.from_parquet(path, columns=["action", "name"])
    assert list(picked.keys()) == ["action", "name"]


class _Row(TensorClass):
    x: torch.Tensor
    y: torch.Tensor
    tag: str


def test_tensorclass_builds_its_own_class(tmp_path):
    frame = pd.DataFrame({"x": [1, 2], "y": [0.5, 1.5], "tag": ["u", "v"]})
    row = _Row.from_pandas(frame)
    assert type(row) is _Row and row.batch_size == (2,)
    assert row.x.tolist() == [1, 2] and list(row.tag) == ["u", "v"]
    assert row.to_pandas().to_dict("list") == frame.to_dict("list")


def test_module_level_functions_and_from_any(tmp_path):
    frame = pd.DataFrame({"x": [1, 2, 3]})
    assert torch.equal(tdfunc.from_pandas(frame)["x"], torch.tensor([1, 2, 3]))
    assert tdfunc.from_any(frame).batch_size == (3,)
    path = tmp_path / "x.csv"
    frame.to_csv(path, index=False)
    assert tdfunc.from_csv(path)["x"].tolist() == [1, 2, 3]
    nested = {"a": torch.zeros(2), "b": {"c": torch.ones(2)}}
    assert tdfunc.from_dict(nested, auto_batch_size=True).batch_size == (2,)
    assert tdfunc.from_tuple((torch.zeros(2),))["0"].shape == (2,)
    model = torch.nn.Linear(2, 3)
    assert tdfunc.from_module(model)["weight"] is model.weight
    # tensordict's function locks its result; the method does not
    assert tdfunc.from_module(model).is_locked
    assert not tdfunc.from_module(model, lock=False).is_locked
    assert not TensorDict.from_module(model).is_locked


def test_multiindex_columns_are_nested_keys():
    frame = pd.DataFrame([[1.0, 3, 0], [2.0, 4, 1]])
    frame.columns = pd.MultiIndex.from_tuples([("obs", "x"), ("obs", "y"), ("act", "")])
    td = TensorDict.from_pandas(frame)
    assert set(td.keys(True, True)) == {("obs", "x"), ("obs", "y"), "act"}
    assert td["obs", "y"].tolist() == [3, 4] and td["act"].tolist() == [0, 1]


def test_numbers_held_as_objects_become_tensors():
    frame = pd.concat([pd.DataFrame({"a": [1, 2]}), pd.DataFrame({"a": ["x"]})]).iloc[:2]
    assert frame["a"].dtype == object
    td = TensorDict.from_pandas(frame)
    assert td["a"].dtype == torch.int64 and td["a"].tolist() == [1, 2]
    empty = TensorDict.from_pandas(pd.DataFrame({"s": pd.Series([], dtype=object)}))
    assert empty.batch_size == (0,) and list(empty["s"]) == []
