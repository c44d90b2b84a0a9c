"""``TabularMixin``: tables in and out of a container (pandas DataFrames, CSV, JSON, Parquet).

A table is a container with one batch dim, its rows, and one entry per column:

- integer, float, complex and boolean columns become tensors of the same dtype
  (``dtype=`` casts them all);
- dates and durations become ``int64`` nanoseconds (since the epoch, in UTC);
- categorical columns become their integer codes (``-1`` for a missing value);
- anything else (strings, mixed objects, integers with missing values) becomes a
  ``NonTensorStack`` with one value per row.

``separator`` splits column names into nested keys (``"obs.x"`` becomes
``("obs", "x")``) and joins them again on the way out. The files are read and
written by pandas (Parquet also needs pyarrow), imported only when one of these
methods is called.

Example:
    >>> import pandas as pd
    >>> frame = pd.DataFrame({"obs.x": [1.0, 2.0], "action": [0, 1], "name": ["a", "b"]})
    >>> td = TensorDict.from_pandas(frame, separator=".")
    >>> td["obs", "x"].tolist(), td["action"].dtype, list(td["name"]), td.batch_size
    ([1.0, 2.0], torch.int64, ['a', 'b'], torch.Size([2]))
    >>> list(td.to_pandas(separator=".").columns)
    ['obs.x', 'action', 'name']
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch

from ..helpers.build import _build
from ..helpers.leafwise import is_collection
from ..helpers.mixin import ContainerMixin
from ..helpers.nontensor import NonTensorData, NonTensorStack

_NUMERIC_KINDS = frozenset("iufcb")  # numpy kinds that become tensors


def _require(module: str, api: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"TensorDict.{api} needs {package}, which is not installed: pip install {package}"
        ) from error


# ---------------------------------------------------------------- table -> container
def _column(series: Any, pandas: Any) -> Any:
    """One column's entry: a tensor, or a ``NonTensorStack`` of one value per row."""
    dtype = series.dtype
    if isinstance(dtype, pandas.CategoricalDtype):
        return torch.from_numpy(series.cat.codes.to_numpy().copy())
    if pandas.api.types.is_datetime64_any_dtype(dtype):
        if getattr(dtype, "tz", None) is not None:
            series = series.dt.tz_convert("UTC").dt.tz_localize(None)
        return _nanoseconds(series.to_numpy(dtype="datetime64[ns]"))
    if pandas.api.types.is_timedelta64_dtype(dtype):
        return _nanoseconds(series.to_numpy(dtype="timedelta64[ns]"))
    numpy_dtype = getattr(dtype, "numpy_dtype", None)  # pandas' nullable Int64, boolean, ...
    if numpy_dtype is not None and numpy_dtype.kind in _NUMERIC_KINDS:
        if not series.hasnans:
            return torch.from_numpy(series.to_numpy(dtype=numpy_dtype))
        if numpy_dtype.kind == "f":  # a missing float is NaN
            return torch.from_numpy(series.to_numpy(dtype=numpy_dtype, na_value=np.nan))
    elif isinstance(dtype, np.dtype) and dtype.kind in _NUMERIC_KINDS:
        return torch.from_numpy(series.to_numpy().copy())  # a copy: pandas may share or lock it
    elif isinstance(dtype, np.dtype) and dtype.kind == "O" and len(series):
        inferred = series.infer_objects()  # numbers held as objects (after a concat, ...)
        if inferred.dtype.kind in _NUMERIC_KINDS:
            return torch.from_numpy(inferred.to_numpy().copy())
    # a missing value (None, NaN, NA or NaT, as the column's dtype spells it) is None
    values = [None if gone else value for value, gone in zip(series.tolist(), series.isna())]
    return NonTensorStack.from_list(values, batch_size=[len(values)])  # a list value is one row


def _nanoseconds(values: np.ndarray) -> torch.Tensor:
    """Dates or durations as int64 nanoseconds (missing values: the smallest int64)."""
    return torch.from_numpy(values.view(np.int64).copy())


def _nested(columns: dict, separator: str | None, api: str) -> dict:
    """The columns as a nested dict, names split at ``separator``."""
    if separator is None and not any(isinstance(name, tuple) for name in columns):
        return columns
    out: dict = {}
    for name, value in columns.items():
        if isinstance(name, tuple):
            *parents, last = name
        elif separator is None:
            *parents, last = (name,)
        else:
            *parents, last = name.split(separator)
        level = out
        for depth, part in enumerate(parents):
            level = level.setdefault(part, {})
            if not isinstance(level, dict):
                raise ValueError(
                    f"TensorDict.{api}: the column {parents[: depth + 1]} is also the prefix of "
                    f"the column {name!r} (separator {separator!r}); a key cannot be both a "
                    f"value and a nested level. Rename one of them, or pass separator=None."
                )
        if last in level:
            raise ValueError(
                f"TensorDict.{api}: the column {name!r} is also the prefix of other columns, "
                f"or named twice (separator {separator!r}); rename one of them, or pass "
                f"separator=None."
            )
        level[last] = value
    return out


def _options(auto_batch_size, batch_dims, device, batch_size, separator, dtype) -> dict:
    """The keyword arguments every table reader shares, for :func:`_from_frame`."""
    return {
        "auto_batch_size": auto_batch_size,
        "batch_dims": batch_dims,
        "device": device,
        "batch_size": batch_size,
        "separator": separator,
        "dtype": dtype,
    }


def _from_frame(cls: Any, frame: Any, api: str, options: dict) -> Any:
    pandas = _require("pandas", api, "pandas")
    if not isinstance(frame, pandas.DataFrame):
        raise TypeError(
            f"TensorDict.{api}: expected a pandas DataFrame, got {type(frame).__name__}."
        )
    columns: dict = {}
    dtype = options["dtype"]
    for name, series in frame.items():
        key = _key(name)
        if key in columns:
            raise ValueError(
                f"TensorDict.{api}: two columns are both named {key!r} (as strings); "
                f"rename one of them first."
            )
        value = _column(series, pandas)
        # dates and category codes are identifiers, not quantities: dtype leaves them be
        if (
            dtype is not None
            and isinstance(value, torch.Tensor)
            and _is_quantity(series.dtype, pandas)
        ):
            value = value.to(dtype)
        columns[key] = value
    batch_size, auto = options["batch_size"], options["auto_batch_size"]
    if auto and batch_size is not None:
        raise TypeError(
            f"TensorDict.{api}: conflicting batch sizes: auto_batch_size=True infers the batch "
            f"size, and batch_size={list(batch_size)} was given too. Pass one of them."
        )
    data = _nested(columns, options["separator"], api)
    rows = [len(frame)] if batch_size is None else batch_size
    out = _build(cls, data, rows, options["device"], False, None)
    if auto:
        out.auto_batch_size_(options["batch_dims"])
    return out


def _key(name: Any) -> Any:
    """A column's key: its name as a string; a nested key for a column of a MultiIndex
    (a tuple, whose shorter names pandas pads with empty strings)."""
    if not isinstance(name, tuple):
        return str(name)
    parts = [str(part) for part in name]
    while len(parts) > 1 and not parts[-1]:
        parts.pop()
    return parts[0] if len(parts) == 1 else tuple(parts)


def _is_quantity(dtype: Any, pandas: Any) -> bool:
    if isinstance(dtype, pandas.CategoricalDtype):
        return False
    api = pandas.api.types
    return not (api.is_datetime64_any_dtype(dtype) or api.is_timedelta64_dtype(dtype))


# ---------------------------------------------------------------- container -> table
def _flat_columns(view: Any, separator: str | None, rows: int, prefix: str, out: dict) -> None:
    for key, value in view._data.items():
        name = f"{prefix}{key}"
        if name in out and value is not None:
            # a key that holds the separator joins to a nested entry's name: one of the
            # two columns would be lost
            raise ValueError(
                f"TensorDict.to_pandas: two entries give the column name {name!r} (the "
                f"separator {separator!r} joins nested keys, and a key holds it); rename "
                f"one, or pick a separator that no key holds."
            )
        if isinstance(value, torch.Tensor):
            if value.dim() != 1:
                raise ValueError(
                    f"Cannot convert tensor with shape {list(value.shape)} at key {name!r} to "
                    f"one table column: a column holds one value per row, so it needs exactly "
                    f"one dim. Flatten or split it first (e.g. td.apply(lambda x: x.flatten(1)) "
                    f"then one key per feature)."
                )
            value = value.detach().cpu()
            if value.dtype is torch.bfloat16:  # numpy has no bfloat16
                value = value.float()
            out[name] = value.numpy()
        elif isinstance(value, NonTensorStack):
            out[name] = value.tolist()
        elif isinstance(value, NonTensorData):
            out[name] = [value.data] * rows
        elif value is None:  # an unset field of a TensorClass
            continue
        elif is_collection(value) and _object_column(value, separator):
            # a TensorClass that cannot be split into columns: one column of its rows (an
            # object array: a column of no rows keeps the object dtype)
            column = np.empty(rows, dtype=object)
            for i in range(rows):
                column[i] = value[i]
            out[name] = column
        elif is_collection(value):
            if separator is None:
                raise ValueError(
                    f"TensorDict.to_pandas: the entry {name!r} is a nested container; pass a "
                    f"separator to name its columns by joined keys, e.g. to_pandas(separator='.')."
                )
            _flat_columns(value._to_tensordict_view(), separator, rows, name + separator, out)
        else:
            out[name] = value


def _object_column(value: Any, separator: str | None) -> bool:
    """Whether a nested TensorClass is one column of objects: without a separator, or
    with no leaf, or with a leaf that is not one value per row."""
    if getattr(type(value), "_is_tensordict", False):
        return False
    if separator is None:
        return True
    leaves = [leaf for _, leaf in value.items(True, True) if isinstance(leaf, torch.Tensor)]
    return not leaves or any(leaf.dim() != 1 for leaf in leaves)


def _to_frame(container: Any, separator: str | None, api: str) -> Any:
    pandas = _require("pandas", api, "pandas")
    view = container._to_tensordict_view()
    batch_size = view._batch_size
    if len(batch_size) != 1:
        raise ValueError(
            f"TensorDict.{api}: a table has one batch dim (its rows); this container has "
            f"batch_size={list(batch_size)}. Give it one batch dim first (reshape(-1), or "
            f"auto_batch_size_(1))."
        )
    columns: dict = {}
    _flat_columns(view, separator, batch_size[0], "", columns)
    return pandas.DataFrame(columns, index=pandas.RangeIndex(batch_size[0]))


class TabularMixin(ContainerMixin):
    """pandas DataFrames, CSV, JSON and Parquet files in and out of a container."""

    __slots__ = ()

    @classmethod
    def from_pandas(
        cls,
        dataframe: Any,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device=None,
        batch_size=None,
        separator: str | None = None,
        dtype: torch.dtype | None = None,
    ):
        """A container of the DataFrame's columns, batch size ``[rows]`` (see the module docs).

        Example:
            >>> import pandas as pd
            >>> td = TensorDict.from_pandas(pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]}))
            >>> td["a"].tolist(), td["b"].dtype
            ([1, 2], torch.float64)
        """
        options = _options(auto_batch_size, batch_dims, device, batch_size, separator, dtype)
        return _from_frame(cls, dataframe, "from_pandas", options)

    def to_pandas(self, *, separator: str | None = None):
        """A DataFrame with one row per batch element and one column per leaf.

        Each tensor leaf must have exactly one dim (the rows); a ``NonTensorData``
        fills its column with its value. Nested containers need ``separator``, except a
        nested TensorClass: without ``separator`` (or when it has no leaf, or a leaf of
        more than one dim) it is one column of objects, the TensorClass of each row.

        Example:
            >>> td = TensorDict({"a": torch.arange(2), "b": {"c": torch.zeros(2)}}, [2])
            >>> td.to_pandas(separator="/").to_dict("list")
            {'a': [0, 1], 'b/c': [0.0, 0.0]}
            >>> @tensorclass
            ... class Point:
            ...     x: torch.Tensor
            >>> points = Point(x=torch.arange(2.0), batch_size=[2])
            >>> df = TensorDict(p=points, batch_size=[2]).to_pandas()
            >>> type(df["p"][1]).__name__, df["p"][1].x
            ('Point', tensor(1.))
        """
        return _to_frame(self, separator, "to_pandas")

    @classmethod
    def from_csv(
        cls,
        path,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device=None,
        batch_size=None,
        separator: str | None = None,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ):
        """A container of a CSV file's columns (``pandas.read_csv``, given ``kwargs``).

        Example:
            >>> import tempfile, pathlib
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.csv"
            >>> _ = path.write_text("obs.x,reward\\n1.0,0\\n2.0,1\\n")
            >>> TensorDict.from_csv(path, separator=".")["obs", "x"].tolist()
            [1.0, 2.0]
        """
        pandas = _require("pandas", "from_csv", "pandas")
        frame = pandas.read_csv(path, **kwargs)
        options = _options(auto_batch_size, batch_dims, device, batch_size, separator, dtype)
        return _from_frame(cls, frame, "from_csv", options)

    def to_csv(self, path, *, separator: str | None = None, **kwargs: Any) -> None:
        """Write the table of :meth:`to_pandas` to a CSV file (without pandas' index).

        Example:
            >>> import tempfile, pathlib
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.csv"
            >>> TensorDict({"a": torch.arange(2)}, [2]).to_csv(path)
            >>> path.read_text().split()
            ['a', '0', '1']
        """
        kwargs.setdefault("index", False)
        _to_frame(self, separator, "to_csv").to_csv(path, **kwargs)

    @classmethod
    def from_json(
        cls,
        path,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device=None,
        batch_size=None,
        separator: str | None = None,
        dtype: torch.dtype | None = None,
        lines: bool = False,
        **kwargs: Any,
    ):
        """A container of a JSON file of records, one per row (``lines=True``: JSON Lines).

        Example:
            >>> import tempfile, pathlib
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.jsonl"
            >>> _ = path.write_text('{"a": 1, "b": "x"}\\n{"a": 2, "b": "y"}\\n')
            >>> td = TensorDict.from_json(path, lines=True)
            >>> td["a"].tolist(), list(td["b"])
            ([1, 2], ['x', 'y'])
        """
        pandas = _require("pandas", "from_json", "pandas")
        frame = pandas.read_json(path, lines=lines, **kwargs)
        options = _options(auto_batch_size, batch_dims, device, batch_size, separator, dtype)
        return _from_frame(cls, frame, "from_json", options)

    def to_json(
        self, path, *, separator: str | None = None, lines: bool = False, **kwargs: Any
    ) -> None:
        """Write the rows as JSON records (``lines=True``: one record per line).

        Example:
            >>> import json, tempfile, pathlib
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.json"
            >>> TensorDict({"a": torch.arange(2)}, [2]).to_json(path)
            >>> json.loads(path.read_text())
            [{'a': 0}, {'a': 1}]
        """
        kwargs.setdefault("orient", "records")
        _to_frame(self, separator, "to_json").to_json(path, lines=lines, **kwargs)

    @classmethod
    def from_parquet(
        cls,
        path,
        *,
        auto_batch_size: bool = False,
        batch_dims: int | None = None,
        device=None,
        batch_size=None,
        separator: str | None = None,
        dtype: torch.dtype | None = None,
        columns: list | None = None,
        **kwargs: Any,
    ):
        """A container of a Parquet file's columns (``columns``: only these).

        Example:
            >>> import tempfile, pathlib
            >>> path = pathlib.Path(tempfile.mkdtemp()) / "data.parquet"
            >>> TensorDict({"a": torch.arange(2), "b": torch.ones(2)}, [2]).to_parquet(path)
            >>> list(TensorDict.from_parquet(path, columns=["b"]).keys())
            ['b']
        """
        pandas = _require("pandas", "from_parquet", "pandas")
        _require("pyarrow", "from_parquet", "pyarrow")
        frame = pandas.read_parquet(path, columns=columns, **kwargs)
        options = _options(auto_batch_size, batch_dims, device, batch_size, separator, dtype)
        return _from_frame(cls, frame, "from_parquet", options)

    def to_parquet(self, path, *, separator: str | None = None, **kwargs: Any) -> None:
        """Write the table of :meth:`to_pandas` to a Parquet file (needs pyarrow)."""
        _require("pyarrow", "to_parquet", "pyarrow")
        kwargs.setdefault("index", False)
        _to_frame(self, separator, "to_parquet").to_parquet(path, **kwargs)
