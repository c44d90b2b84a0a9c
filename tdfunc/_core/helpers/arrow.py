"""Arrow tables in and out of containers: ``from_arrow`` and ``to_arrow`` (pyarrow 15 or
later: its arrays export DLPack).

Numeric columns view the Arrow buffers through DLPack where they can; lists become jagged
nested tensors, fixed-size lists and fixed-shape tensors become tensors with trailing dims,
structs become nested containers, and every other column a ``NonTensorStack`` of its
Python values. ``to_arrow`` is the reverse.

Example:
    >>> import pyarrow as pa
    >>> td = from_arrow(pa.table({"x": pa.array([1.0, 2.0]), "text": pa.array(["a", "b"])}))
    >>> td["x"], td.get("text").tolist()
    (tensor([1., 2.], dtype=torch.float64), ['a', 'b'])
    >>> to_arrow(td).column_names
    ['x', 'text']
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch

from .hooks import HOOKS
from .leafwise import is_collection
from .nested_keys import key_parts
from .nontensor import NonTensorData, NonTensorStack

_NULLS = ("raise", "fill", "mask")


def _pyarrow(api: str) -> Any:
    try:
        return importlib.import_module("pyarrow")
    except ImportError as error:
        raise ImportError(
            f"tdfunc.{api} needs pyarrow, which is not installed: pip install pyarrow"
        ) from error


def from_arrow(
    table: Any,
    *,
    copy: bool | None = None,
    nulls: str = "raise",
    mask_key: Any = None,
    device: Any = None,
) -> Any:
    """A TensorDict of an Arrow table's columns, batch size ``[num_rows]``.

    Integer and floating-point columns view the Arrow data (DLPack); boolean columns are
    copied (Arrow packs them as bits). ``list`` / ``large_list`` columns of numbers become
    jagged nested tensors, ``fixed_size_list`` and ``arrow.fixed_shape_tensor`` columns
    tensors with trailing dims, ``struct`` columns nested TensorDicts, and the others
    (strings, dates, lists of strings, ...) a ``NonTensorStack`` of their Python values.
    A column of several chunks is combined first (a copy).

    Args:
        table: a ``pyarrow.Table`` or ``RecordBatch``; anything else goes through
            ``pyarrow.table`` first (a Polars DataFrame, an ``__arrow_c_stream__`` object).
        copy: ``None`` views the buffers Arrow marks mutable and copies the others (a
            memory-mapped file's); ``True`` copies every column; ``False`` views every
            column it can (a write into a view of an immutable buffer then crashes the
            process: torch has no read-only tensors).
        nulls: ``"raise"`` (a ``ValueError`` naming the column), ``"fill"`` (``NaN`` in
            floating-point tensors, ``0`` / ``False`` in the others, an empty list in a
            jagged tensor, ``None`` in a ``NonTensorStack``) or ``"mask"`` (as
            ``"fill"``, plus a boolean entry ``(*mask_key, *key)``, ``True`` where the
            row is not null, for each entry with nulls). A null inside a list or a
            null row of a fixed-size list or fixed-shape tensor column has no value to
            fill with: an error in every mode.
        mask_key: where ``nulls="mask"`` puts the masks (default ``"_mask"``).
        device: the device of the result (default: the tensors stay on the CPU).

    Example:
        >>> import pyarrow as pa
        >>> td = from_arrow(pa.table({"y": pa.array([1.0, None])}), nulls="mask")
        >>> td["y"], td["_mask", "y"]
        (tensor([1., nan], dtype=torch.float64), tensor([ True, False]))
    """
    api = "from_arrow"
    pa = _pyarrow(api)
    if nulls not in _NULLS:
        raise ValueError(f"tdfunc.{api}: nulls must be one of {list(_NULLS)}, got {nulls!r}.")
    if mask_key is not None and nulls != "mask":
        raise ValueError(f"tdfunc.{api}: mask_key is for nulls='mask', got nulls={nulls!r}.")
    if copy not in (None, True, False):
        raise TypeError(f"tdfunc.{api}: copy must be None, True or False, got {copy!r}.")
    if not isinstance(table, (pa.Table, pa.RecordBatch)):
        try:
            table = pa.table(table)
        except (TypeError, ValueError, pa.ArrowInvalid) as error:
            raise TypeError(
                f"tdfunc.{api}: expected a pyarrow Table or RecordBatch (or what "
                f"pyarrow.table converts), got {type(table).__name__}."
            ) from error
    reader = _Reader(pa, copy, nulls, {})
    _no_repeated_names(table.column_names, "the table", "column")
    data = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        if isinstance(column, pa.ChunkedArray):
            # combine_chunks copies even one chunk: a single chunk is viewed as it is
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        data[name] = reader.convert(column, (name,))
    rows = table.num_rows
    out = HOOKS.tensordict(data, batch_size=[rows])
    if nulls == "mask" and reader.masks:
        prefix = key_parts("_mask" if mask_key is None else mask_key, api)
        if prefix[0] in data:
            raise ValueError(
                f"tdfunc.{api}: nulls='mask' writes the masks under {_shown(prefix)}, "
                f"where the table has a column {prefix[0]!r}; pass another mask_key."
            )
        for key, mask in reader.masks.items():
            out.set((*prefix, *key), mask)
    return out if device is None else out.to(device)


class _Reader:
    def __init__(self, pa: Any, copy: bool | None, nulls: str, masks: dict) -> None:
        self.pa, self.copy, self.nulls, self.masks = pa, copy, nulls, masks

    def convert(self, array: Any, key: tuple) -> Any:
        pa, types = self.pa, self.pa.types
        kind = array.type
        if (
            isinstance(kind, pa.BaseExtensionType)
            and kind.extension_name == "arrow.fixed_shape_tensor"
        ):
            if array.null_count:
                # pyarrow reads no tensor of such a column, whatever nulls= asks
                raise ValueError(
                    f"tdfunc.from_arrow: the fixed-shape tensor column {_shown(key)} has "
                    f"{array.null_count} null row(s), which have no values to fill a "
                    f"tensor with."
                )
            return torch.from_numpy(np.array(array.to_numpy_ndarray()))
        if types.is_struct(kind):
            return self._struct(array, key)
        if array.null_count:
            if self.nulls == "raise":
                raise ValueError(
                    f"tdfunc.from_arrow: the column {_shown(key)} has {array.null_count} null "
                    f"row(s); pass nulls='fill' or nulls='mask'."
                )
            if self.nulls == "mask":
                self.masks[key] = torch.from_numpy(
                    array.is_valid().to_numpy(zero_copy_only=False).copy()
                )
        if types.is_integer(kind) or types.is_floating(kind):
            return self._numbers(array, key)
        if types.is_boolean(kind):
            values = array.fill_null(False) if array.null_count else array
            return torch.from_numpy(values.to_numpy(zero_copy_only=False).copy())
        if (types.is_list(kind) or types.is_large_list(kind)) and _numeric(types, kind.value_type):
            return self._jagged(array, key)
        if types.is_fixed_size_list(kind) and _numeric_or_fixed(types, kind.value_type):
            return self._fixed(array, key)
        # one Python value per row (None where null); a row's list is one value, so the
        # batch size is given rather than read from the nesting
        values = array.to_pylist()
        return NonTensorStack(values, batch_size=[len(values)])

    def _numbers(self, array: Any, key: tuple) -> torch.Tensor:
        pa = self.pa
        if array.null_count:
            fill = float("nan") if pa.types.is_floating(array.type) else 0
            array = array.fill_null(pa.scalar(fill, type=array.type))
            return torch.from_numpy(array.to_numpy(zero_copy_only=False).copy())
        data = array.buffers()[1]
        view = self.copy is False or (self.copy is None and data is not None and data.is_mutable)
        tensor = torch.from_dlpack(array)
        return tensor if view else tensor.clone()

    def _jagged(self, array: Any, key: tuple) -> torch.Tensor:
        pa = self.pa
        if array.null_count:
            # a null row is an empty list (nulls "fill" and "mask"; "raise" raised above)
            array = pa.compute.if_else(array.is_valid(), array, pa.scalar([], type=array.type))
        offsets = array.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        child = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if child.null_count:
            raise ValueError(
                f"tdfunc.from_arrow: the column {_shown(key)} holds null values inside its "
                f"lists; a tensor has no null."
            )
        values = self._numbers(child, key)
        start = torch.from_numpy(offsets - offsets[0])
        return torch.nested.nested_tensor_from_jagged(values, start)

    def _fixed(self, array: Any, key: tuple) -> torch.Tensor:
        rows, size = len(array), array.type.list_size
        if array.null_count:
            raise ValueError(
                f"tdfunc.from_arrow: the fixed-size list column {_shown(key)} has null rows, "
                f"which have no values to fill a tensor with."
            )
        child = array.flatten()
        if child.null_count:
            # a null inside a row is not a null row: no mask or fill stands for it
            raise ValueError(
                f"tdfunc.from_arrow: the fixed-size list column {_shown(key)} holds null "
                f"values inside its lists; a tensor has no null."
            )
        inner = self._fixed(child, key) if self.pa.types.is_fixed_size_list(child.type) else None
        values = inner if inner is not None else self._numbers(child, key)
        return values.reshape(rows, size, *values.shape[1:])

    def _struct(self, array: Any, key: tuple) -> Any:
        if array.null_count and self.nulls == "raise":
            raise ValueError(
                f"tdfunc.from_arrow: the struct column {_shown(key)} has {array.null_count} "
                f"null row(s); pass nulls='fill' or nulls='mask'."
            )
        _no_repeated_names(
            [field.name for field in array.type], f"the struct column {_shown(key)}", "field"
        )
        # flatten() gives each field the nulls of the struct rows too
        children = array.flatten()
        data = {
            field.name: self.convert(child, (*key, field.name))
            for field, child in zip(array.type, children, strict=True)
        }
        return HOOKS.tensordict(data, batch_size=[len(array)])


def _no_repeated_names(names: list, owner: str, what: str) -> None:
    # Arrow allows repeated names; as keys of one container all but the last would be lost
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"tdfunc.from_arrow: {owner} has more than one {what} named "
            f"{', '.join(map(repr, repeated))}; a container holds one entry per key. "
            f"Rename them first."
        )


def _numeric(types: Any, kind: Any) -> bool:
    return types.is_integer(kind) or types.is_floating(kind)


def _numeric_or_fixed(types: Any, kind: Any) -> bool:
    if types.is_fixed_size_list(kind):
        return _numeric_or_fixed(types, kind.value_type)
    return _numeric(types, kind)


def to_arrow(td: Any) -> Any:
    """An Arrow table of a container with one batch dim, one column per entry.

    1-d tensors become primitive columns (contiguous CPU numbers view their data, booleans
    are copied), tensors with more dims ``arrow.fixed_shape_tensor`` columns, jagged
    nested tensors with the ragged dim at position 1 ``large_list`` columns, nested
    containers ``struct`` columns, and non-tensor entries columns of the type
    ``pyarrow.array`` infers from their values.

    Example:
        >>> td = TensorDict(x=torch.tensor([1.0, 2.0]), image=torch.zeros(2, 3, 4), batch_size=[2])
        >>> table = to_arrow(td)
        >>> table.num_rows, table.schema.names, str(table.schema.field("x").type)
        (2, ['x', 'image'], 'float')
    """
    api = "to_arrow"
    pa = _pyarrow(api)
    if not is_collection(td):
        raise TypeError(
            f"tdfunc.{api}: expected a TensorDict or a TensorClass instance, got "
            f"{type(td).__name__}."
        )
    if len(td.batch_size) != 1:
        raise ValueError(
            f"tdfunc.{api}: a table has one batch dim (its rows); the batch size is "
            f"{list(td.batch_size)}. Flatten it first (td.reshape(-1))."
        )
    view = td._to_tensordict_view()
    if not view._data:
        return pa.table({})
    names, columns = _columns(pa, view, ())
    return pa.Table.from_arrays(columns, names=names)


def _columns(pa: Any, view: Any, prefix: tuple) -> tuple[list, list]:
    names, columns = [], []
    for key, value in view._data.items():
        if value is None:  # an unset TensorClass field
            continue
        names.append(key)
        columns.append(_to_column(pa, value, (*prefix, key)))
    return names, columns


def _to_column(pa: Any, value: Any, key: tuple) -> Any:
    if isinstance(value, torch.Tensor):
        return _tensor_column(pa, value, key)
    if is_collection(value):
        names, columns = _columns(pa, value._to_tensordict_view(), key)
        if not names:
            return pa.array([{}] * value.batch_size[0], type=pa.struct([]))
        return pa.StructArray.from_arrays(columns, names=names)
    if isinstance(value, NonTensorData):
        values = value.tolist()
        return pa.array(values)
    raise TypeError(
        f"tdfunc.to_arrow: cannot convert the entry {_shown(key)} ({type(value).__name__})."
    )


def _tensor_column(pa: Any, tensor: torch.Tensor, key: tuple) -> Any:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.is_nested:
        if tensor.layout is not torch.jagged:
            raise TypeError(
                f"tdfunc.to_arrow: the nested tensor at {_shown(key)} has the layout "
                f"{tensor.layout}; a list column is read from torch.jagged nested tensors "
                f"(torch.nested.nested_tensor(..., layout=torch.jagged))."
            )
        if tensor._ragged_idx != 1:  # type: ignore[attr-defined]
            raise ValueError(
                f"tdfunc.to_arrow: the nested tensor at {_shown(key)} is ragged along dim "
                f"{tensor._ragged_idx}; a list column is ragged along dim 1."  # type: ignore[attr-defined]
            )
        offsets, values = _rows(tensor)
        values = _numpy(values, key)
        if values.ndim > 1:
            raise ValueError(
                f"tdfunc.to_arrow: the nested tensor at {_shown(key)} has dims after the "
                f"ragged one; a list column holds numbers."
            )
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    array = _numpy(tensor, key)
    if array.ndim == 1:
        return pa.array(array)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(array))


def _rows(tensor: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """The offsets and values of a jagged tensor's rows, with no gap between rows."""
    offsets = tensor.offsets().to(torch.int64)
    values = tensor.values()
    lengths = tensor.lengths()
    if lengths is not None:
        # a row ends before the next one starts (a narrowed tensor): an Arrow list
        # has no such gap, so the rows are gathered
        lengths = lengths.to(torch.int64)
        starts = offsets[:-1]
        within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(
            torch.cumsum(lengths, 0) - lengths, lengths
        )
        values = values[torch.repeat_interleave(starts, lengths) + within]
        offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    return offsets.numpy(), values


def _numpy(tensor: torch.Tensor, key: tuple) -> np.ndarray:
    if tensor.dtype is torch.bfloat16:
        raise TypeError(
            f"tdfunc.to_arrow: the tensor at {_shown(key)} is bfloat16, which Arrow has no "
            f"type for; cast it first (td.float())."
        )
    if tensor.is_complex():
        raise TypeError(
            f"tdfunc.to_arrow: the tensor at {_shown(key)} is complex, which Arrow has no "
            f"type for; store its real and imaginary parts."
        )
    return tensor.numpy()


def _shown(key: tuple) -> str:
    return repr(key[0] if len(key) == 1 else key)
