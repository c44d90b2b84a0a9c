"""Padding: ``pad`` over the batch dims of a container, and ``pad_sequence``.

Tensor leaves are padded with ``torch.nn.functional.pad``. Non-tensor leaves have no
numeric fill: their new slots hold ``None`` (a ``NonTensorData`` that gains slots
becomes a ``NonTensorStack``), as tensordict documents.

Example:
    >>> td = TensorDict({"a": torch.ones(2), "s": NonTensorStack("x", "y")}, [2])
    >>> out = pad(td, [1, 0])
    >>> out["a"].tolist(), out.get("s").tolist()
    ([0.0, 1.0, 1.0], [None, 'x', 'y'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from .leafwise import is_collection
from .nested_keys import key_parts, unravel_key
from .nontensor import NonTensorData, NonTensorStack, from_array, padded
from .reshape import _become
from .rewrap import rewrap
from .sizes import pad_plan

_Tensor = torch.Tensor


def pad(
    tensordict: Any,
    pad_size: Sequence[int],
    value: float = 0.0,
    inplace: bool = False,
    safe: bool = True,
) -> Any:
    """Pad the batch dims of ``tensordict`` with ``value`` (see ``TensorDict.pad``).

    ``pad_size`` reads ``(dim0_left, dim0_right, dim1_left, ...)``; negative sizes
    crop. Non-tensor entries hold ``None`` in the new slots. ``tensordict`` may also be
    a ``NonTensorData`` / ``NonTensorStack``. With ``inplace=True`` the result is
    ``tensordict`` itself.

    Example:
        >>> td = TensorDict({"a": torch.ones(3, 4, 1)}, [3, 4])
        >>> pad(td, [0, 1, 0, 2])["a"].shape
        torch.Size([4, 6, 1])
    """
    if not (is_collection(tensordict) or isinstance(tensordict, NonTensorData)):
        raise TypeError(
            f"tdfunc.pad: expected a TensorDict, a TensorClass or a non-tensor leaf, got "
            f"{type(tensordict).__name__}. Hint: pad a tensor with torch.nn.functional.pad."
        )
    return tensordict.pad(pad_size, value, inplace=inplace, safe=safe)


def pad_container(self: Any, pad_size: Sequence[int], value: float, inplace: bool) -> Any:
    """``TensorDict.pad``: every leaf padded over the batch dims (the new batch size is
    checked before any leaf is touched)."""
    pairs, size = pad_plan(self._batch_size, pad_size, "TensorDict.pad")
    out = _padded_level(self, pairs, size, value)
    if not inplace:
        return out
    # A NonTensorStack entry keeps its identity, as a nested container does: found and
    # checked before anything changes, given the padded values once ``self`` has changed.
    self._check_writable("pad", list(self._data))
    stacks = _stacks(self, ())
    for stack in stacks.values():
        stack._check_resizable("TensorDict.pad")
    _become(self, out, "pad")
    for path, stack in stacks.items():
        level = self
        for key in path[:-1]:
            level = level._data[key]._to_tensordict_view()
        new = level._data[path[-1]]
        stack.data, stack.batch_size = new.data, new.batch_size
        level._data[path[-1]] = stack
    return self


def _padded_level(self: Any, pairs: list, size: torch.Size, value: float) -> Any:
    ndim = len(self._batch_size)
    out: dict[str, Any] = {}
    for key, leaf in self._data.items():
        if isinstance(leaf, _Tensor):
            flat = [0, 0] * (leaf.dim() - len(pairs))
            for left, right in reversed(pairs):
                flat += (left, right)
            out[key] = F.pad(leaf, flat, value=value)
        elif is_collection(leaf):
            view = leaf._to_tensordict_view()
            sub = _padded_level(view, pairs, size + view._batch_size[ndim:], value)
            out[key] = rewrap(leaf, sub)
        elif isinstance(leaf, NonTensorData) and leaf.batch_size:
            out[key] = padded(leaf, pairs, size + leaf.batch_size[ndim:])
        else:
            out[key] = leaf
    return self._like(out, size, self._names)


def _stacks(self: Any, prefix: tuple) -> dict:
    found: dict = {}
    for key, leaf in self._data.items():
        if type(leaf) is NonTensorStack:
            found[prefix + (key,)] = leaf
        elif is_collection(leaf):
            found.update(_stacks(leaf._to_tensordict_view(), prefix + (key,)))
    return found


def pad_sequence(
    list_of_tensordicts: Sequence[Any],
    pad_dim: int = 0,
    padding_value: float = 0.0,
    out: Any = None,
    device: Any = None,
    return_mask: bool | str | tuple = False,
    padding_side: str = "right",
) -> Any:
    """Pad the leaves of containers to a common length along ``pad_dim``, then stack them.

    ``pad_dim`` is a dim of each leaf (negative: counted from the leaf's last dim).
    When it is a batch dim, the stacked batch size takes the longest length there.
    Non-tensor entries are stacked into a ``NonTensorStack`` (``None`` where padded).
    With ``return_mask`` (``True``, or the key to use instead of ``"masks"``), a
    TensorDict of boolean masks of the valid values is stored too: one per tensor
    leaf, over the stacked batch dims and the leaf's dims up to ``pad_dim``.
    ``padding_value`` may map keys to values (the entries it does not name get ``0``; a
    key that names no entry is a ``KeyError``); ``padding_side="left"`` pads before the
    data.

    Example:
        >>> tds = [TensorDict({"a": torch.ones(n, 8)}, []) for n in (3, 5)]
        >>> out = pad_sequence(tds, return_mask=True)
        >>> out["a"].shape, out["masks", "a"][0].tolist()
        (torch.Size([2, 5, 8]), [True, True, True, False, False])
    """
    api = "tdfunc.pad_sequence"
    items = list(list_of_tensordicts)
    if not items:
        raise ValueError(f"{api}: expected a non-empty list of TensorDicts.")
    for position, item in enumerate(items):
        if not is_collection(item):
            raise TypeError(
                f"{api}: expected TensorDicts or TensorClasses, got {type(item).__name__} "
                f"at position {position}."
            )
    mask_key = None
    if return_mask is not False:
        mask_key = "masks" if return_mask is True else unravel_key(return_mask)
        if not getattr(type(items[0]), "_is_tensordict", False):
            raise TypeError(
                f"{api}: return_mask needs TensorDicts, got {type(items[0]).__name__}, which "
                f"has no entry for the masks. Hint: pass [x.to_tensordict() for x in items]."
            )
        if mask_key in items[0].keys(True):
            raise KeyError(
                f"{api}: {mask_key!r} is already an entry of the TensorDicts; pass another "
                f"key as return_mask=..."
            )
    if padding_side not in ("left", "right"):
        raise ValueError(f"{api}: padding_side must be 'left' or 'right', got {padding_side!r}.")
    how = _Padding(_values_by_path(padding_value, api), padding_side == "left", set())
    views = [item._to_tensordict_view() for item in items]
    data, masks, size = _pad_views(views, pad_dim, how, mask_key is not None, ())
    if isinstance(how.value, dict) and how.value.keys() - how.used:
        unknown = sorted(how.value.keys() - how.used)
        raise KeyError(f"{api}: padding_value names keys that are no tensor entry: {unknown}.")
    result = items[0]._like(data, size, None)
    if mask_key is not None:
        result.set(mask_key, views[0]._like(masks, size, None))
    if device is not None:
        result = result.to(device)
    if out is not None:
        out.update(result)
        return out
    return result


class _Padding(NamedTuple):
    value: Any  # one value, or {key path: value}
    left: bool
    used: set  # the key paths of ``value`` that named an entry


def _values_by_path(padding_value: Any, api: str) -> Any:
    if not isinstance(padding_value, Mapping):
        return padding_value
    return {key_parts(key, api): value for key, value in padding_value.items()}


def _pad_views(views: list, pad_dim: int, how: _Padding, masks: bool, prefix: tuple):
    """``(data, mask data, batch size)`` of the padded stack of ``views`` (one level)."""
    api = "tdfunc.pad_sequence"
    size = _padded_batch(views, pad_dim, prefix)
    ndim = len(size) - 1
    keys = list(views[0]._data)
    for position, view in enumerate(views[1:], 1):
        if view._data.keys() != views[0]._data.keys():
            diff = sorted(set(view._data) ^ set(keys))
            raise KeyError(
                f"{api}: every TensorDict must have the same keys; at {prefix or 'the root'}, "
                f"the TensorDict at position {position} differs from the first in {diff}."
            )
    data: dict = {}
    mask_data: dict = {}
    for key in keys:
        path = prefix + (key,)
        values = [view._data[key] for view in views]
        if all(isinstance(v, _Tensor) for v in values):
            data[key], mask = _pad_tensors(values, pad_dim, how, ndim, masks, path)
            if masks:
                mask_data[key] = mask
        elif all(is_collection(v) for v in values):
            inner = [v._to_tensordict_view() for v in values]
            sub, sub_masks, sub_size = _pad_views(inner, pad_dim, how, masks, path)
            data[key] = rewrap(values[0], inner[0]._like(sub, sub_size, None))
            if masks:
                mask_data[key] = inner[0]._like(sub_masks, sub_size, None)
        elif all(isinstance(v, NonTensorData) for v in values):
            data[key] = _stack_non_tensor(values, size, ndim, path, how.left)
        else:
            kinds = sorted({type(v).__name__ for v in values})
            raise TypeError(f"{api}: the entries at {path} are of different kinds: {kinds}.")
    return data, mask_data, size


def _padded_batch(views: list, pad_dim: int, prefix: tuple) -> torch.Size:
    """The stacked batch size: ``[len(views), *longest]``; elements may differ only along
    the padded dim (a non-negative ``pad_dim``; a negative one is resolved per leaf)."""
    sizes = [view._batch_size for view in views]
    if len({len(s) for s in sizes}) > 1:
        raise ValueError(
            f"tdfunc.pad_sequence: the TensorDicts at {prefix or 'the root'} have batch "
            f"sizes with different numbers of dims: {[list(s) for s in sizes]}."
        )
    longest = [max(dims) for dims in zip(*sizes)]
    for d, dims in enumerate(zip(*sizes)):
        if len(set(dims)) > 1 and 0 <= pad_dim != d:
            raise ValueError(
                f"tdfunc.pad_sequence: the TensorDicts at {prefix or 'the root'} differ in "
                f"batch dim {d} ({[list(s) for s in sizes]}), which pad_dim={pad_dim} does not "
                f"pad."
            )
    return torch.Size([len(views), *longest])


def _pad_tensors(values: list, pad_dim: int, how: _Padding, ndim: int, masks: bool, path):
    """The stacked padded leaves, and their mask (or None)."""
    value = how.value
    if isinstance(value, dict):
        if path in value:
            how.used.add(path)
        value = value.get(path, 0)
    dims = {v.dim() for v in values}
    if len(dims) > 1:
        raise ValueError(
            f"tdfunc.pad_sequence: the leaves at {path} have different numbers of dims: "
            f"{[list(v.shape) for v in values]}."
        )
    count = dims.pop()
    dim = pad_dim + count if pad_dim < 0 else pad_dim
    if not 0 <= dim < count:
        raise ValueError(
            f"tdfunc.pad_sequence: pad_dim={pad_dim} is not a dim of the leaves at {path} "
            f"(of {count} dim(s); a 0-dim leaf cannot be padded)."
        )
    length = max(v.shape[dim] for v in values)
    try:
        stacked = torch.stack([_pad_to(v, dim, length, value, how.left) for v in values])
    except RuntimeError as error:
        raise RuntimeError(
            f"tdfunc.pad_sequence: cannot stack the leaves at {path} after padding dim {dim}: "
            f"their shapes {[list(v.shape) for v in values]} differ elsewhere."
        ) from error
    if not masks:
        return stacked, None
    lead = max(ndim, dim + 1)  # the batch dims, and the leaf's dims up to the padded one
    valid = [torch.ones(v.shape[:lead], dtype=torch.bool, device=v.device) for v in values]
    return stacked, torch.stack([_pad_to(m, dim, length, False, how.left) for m in valid])


def _pad_to(leaf: torch.Tensor, dim: int, length: int, value: Any, left: bool) -> torch.Tensor:
    missing = length - leaf.shape[dim]
    if not missing:
        return leaf
    sides = [missing, 0] if left else [0, missing]
    return F.pad(leaf, [0, 0] * (leaf.dim() - 1 - dim) + sides, value=value)


def _stack_non_tensor(values: list, size: torch.Size, ndim: int, path, left: bool):
    """The non-tensor leaves padded with ``None`` to the stacked batch size, one stack."""
    arrays = []
    for leaf in values:
        target = torch.Size([*size[1:], *leaf.batch_size[ndim:]])
        pairs = [(t - s, 0) if left else (0, t - s) for t, s in zip(target[:ndim], leaf.batch_size)]
        arrays.append(padded(leaf, pairs, target)._array())
    try:
        stacked = np.stack(arrays)
    except ValueError:
        raise ValueError(
            f"tdfunc.pad_sequence: the non-tensor leaves at {path} have batch sizes that "
            f"differ beyond their TensorDicts': {[list(v.batch_size) for v in values]}."
        ) from None
    return from_array(stacked, values[0].device)
