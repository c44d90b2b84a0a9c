"""Top-level functions on containers: ``pad``, ``pad_sequence``, ``merge_tensordicts``,
``cat`` and ``stack``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..apply import rewrap
from ..math.leafwise import is_collection
from ..nontensor import is_non_tensor
from ..torch_function import cat as _cat
from ..torch_function import stack as _stack


def pad(tensordict: Any, pad_size: Sequence[int], value: float = 0.0) -> Any:
    """Pad the batch dims of ``tensordict`` with ``value`` (see ``TensorDict.pad``).

    Example:
        >>> td = TensorDict({"a": torch.ones(3, 4, 1)}, [3, 4])
        >>> pad(td, [0, 1, 0, 2])["a"].shape
        torch.Size([4, 6, 1])
    """
    return tensordict.pad(pad_size, value)


def cat(items: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Concatenate containers along batch dim ``dim`` (``torch.cat``).

    Example:
        >>> tds = [TensorDict({"a": torch.zeros(3)}, [3])] * 2
        >>> cat(tds).batch_size
        torch.Size([6])
    """
    return _cat(items, dim, out=out)


def stack(items: Sequence[Any], dim: int = 0, *, out: Any = None) -> Any:
    """Stack containers along a new batch dim ``dim`` (``torch.stack``).

    Example:
        >>> tds = [TensorDict({"a": torch.zeros(3)}, [3])] * 2
        >>> stack(tds, 1).batch_size
        torch.Size([3, 2])
    """
    return _stack(items, dim, out=out)


def _pad_to(leaf: torch.Tensor, dim: int, length: int, value: float) -> torch.Tensor:
    missing = length - leaf.shape[dim]
    if not missing:
        return leaf
    flat = [0, 0] * (leaf.dim() - 1 - dim) + [0, missing]
    return F.pad(leaf, flat, value=value)


def _valid_mask(leaf: torch.Tensor, dim: int, batch_ndim: int) -> torch.Tensor:
    """Ones over the top-level batch dims of ``leaf``, plus the padded dim when it lies
    past them: the shape of one element's mask before padding."""
    shape = list(leaf.shape[:batch_ndim])
    if dim >= batch_ndim:
        shape.append(leaf.shape[dim])
    return torch.ones(shape, dtype=torch.bool, device=leaf.device)


def _pad_views(views: list, pad_dim: int, value: float, batch_ndim: int, masks: bool, api: str):
    """Pad the leaves of ``views`` (TensorDicts with the same keys) to a common length and
    stack them: ``(data, mask data)`` dicts.

    A mask spans the batch dims of the top-level containers (``batch_ndim``), plus the
    padded dim when it is a feature dim: it marks valid elements, not valid numbers, so
    every mask of one call shares the top-level batch and indexes any leaf's leading dims.
    """
    first = views[0]
    data: dict = {}
    mask_data: dict = {}
    for key, value0 in first._data.items():
        try:
            values = [view._data[key] for view in views]
        except KeyError:
            raise KeyError(
                f"{api}: every TensorDict must have the same keys; {key!r} is missing from one."
            ) from None
        if isinstance(value0, torch.Tensor):
            dim = pad_dim if pad_dim >= 0 else value0.dim() + pad_dim
            length = max(v.shape[dim] for v in values)
            data[key] = torch.stack([_pad_to(v, dim, length, value) for v in values])
            if masks:
                mask_dim = min(dim, batch_ndim)
                valid = [_valid_mask(v, dim, batch_ndim) for v in values]
                mask_data[key] = torch.stack([_pad_to(m, mask_dim, length, False) for m in valid])
        elif is_collection(value0):
            inner = [v._to_tensordict_view() for v in values]
            sub, sub_masks = _pad_views(inner, pad_dim, value, batch_ndim, masks, api)
            size = _stacked_size(inner, pad_dim)
            data[key] = rewrap(value0, inner[0]._like(sub, size, None))
            if masks:
                mask_data[key] = sub_masks
        elif is_non_tensor(value0):  # one value per container: stacked, never padded
            try:
                data[key] = torch.stack(values)
            except (RuntimeError, ValueError, TypeError) as error:
                raise ValueError(
                    f"{api}: the non-tensor values at {key!r} cannot be stacked ({error}); "
                    f"non-tensor data is not padded, so it needs the same batch size in every "
                    f"container."
                ) from None
        else:
            data[key] = value0
    return data, mask_data


def _mask_tree(like: Any, mask_data: dict, size: torch.Size) -> Any:
    """Nested mask dicts as plain containers, every level with the top-level ``size``."""
    data = {
        key: _mask_tree(like, value, size) if isinstance(value, dict) else value
        for key, value in mask_data.items()
    }
    return like._like(data, size, None)


def _stacked_size(views: list, pad_dim: int) -> torch.Size:
    sizes = [list(view._batch_size) for view in views]
    size = sizes[0]
    ndim = len(size)
    if ndim and (0 <= pad_dim < ndim or -ndim <= pad_dim < 0):
        size = list(size)
        size[pad_dim] = max(s[pad_dim] for s in sizes)
    return torch.Size([len(views), *size])


def pad_sequence(
    list_of_tensordicts: Sequence[Any],
    pad_dim: int = 0,
    padding_value: float = 0.0,
    out: Any = None,
    device: Any = None,
    return_mask: bool | str | tuple = False,
) -> Any:
    """Pad the leaves of containers to a common length along ``pad_dim``, then stack them.

    With ``return_mask``, a container of boolean masks of the valid (not padded)
    elements is written under ``"masks"`` (or the key given). Each mask has the batch
    dims of the result, followed by the padded dim when ``pad_dim`` is past the batch
    dims: ``out["a"][out["masks", "a"]]`` are the original rows.

    Example:
        >>> tds = [TensorDict({"a": torch.ones(n, 8)}, []) for n in (3, 5)]
        >>> out = pad_sequence(tds, return_mask=True)
        >>> out["a"].shape, out["masks", "a"].shape, out["masks", "a"][0].tolist()
        (torch.Size([2, 5, 8]), torch.Size([2, 5]), [True, True, True, False, False])
    """
    api = "tdfunc.pad_sequence"
    items = list(list_of_tensordicts)
    if not items:
        raise ValueError(f"{api}: expected a non-empty list of TensorDicts.")
    views = [item._to_tensordict_view() for item in items]
    batch_ndim = len(views[0]._batch_size)
    data, mask_data = _pad_views(views, pad_dim, padding_value, batch_ndim, bool(return_mask), api)
    size = _stacked_size(views, pad_dim)
    result = items[0]._like(data, size, None)
    if return_mask:
        key = "masks" if return_mask is True else return_mask
        result.set(key, _mask_tree(views[0], mask_data, size))
    if device is not None:
        result = result.to(device)
    if out is not None:
        out.update(result)
        return out
    return result


def merge_tensordicts(*tensordicts: Any, callback_exist: Callable | dict | None = None) -> Any:
    """Merge containers; with ``callback_exist``, an entry present in every one of them is
    ``callback_exist(*values)``, otherwise the first value wins.

    Example:
        >>> td0 = TensorDict({"a": {"b0": 0}, "common": 0})
        >>> td1 = TensorDict({"a": {"b1": 1}, "common": 1})
        >>> td = merge_tensordicts(td0, td1, callback_exist=lambda *v: torch.stack(list(v)))
        >>> list(td.keys(True, True)), td["common"].tolist()
        ([('a', 'b0'), ('a', 'b1'), 'common'], [0, 1])
    """
    if not tensordicts:
        raise ValueError("tdfunc.merge_tensordicts: expected at least one TensorDict.")
    views = [td._to_tensordict_view() for td in tensordicts]
    data = _merge(views, callback_exist, (), len(views))
    return tensordicts[0]._like(data)


def _merge(views: list, callback: Any, prefix: tuple, total: int) -> dict:
    """Merge one level; ``total`` counts every container merged, so an entry is "in every
    one" only when no container lacks it at any level above."""
    keys: dict = {}
    for view in views:
        for key in view._data:
            keys.setdefault(key, None)
    data: dict = {}
    for key in keys:
        values = [view._data[key] for view in views if key in view._data]
        full = prefix + (key,)
        if all(is_collection(v) for v in values) and len(values) > 1:
            inner = [v._to_tensordict_view() for v in values]
            data[key] = inner[0]._like(_merge(inner, callback, full, total))
            continue
        fn = (
            callback.get(full if len(full) > 1 else key) if isinstance(callback, dict) else callback
        )
        if fn is not None and len(values) == total:
            data[key] = fn(*values)
        else:
            data[key] = values[0]
    return data
