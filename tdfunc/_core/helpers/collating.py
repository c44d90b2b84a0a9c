"""``collate``: a ``collate_fn`` for a ``DataLoader`` whose samples hold containers.

A ``DataLoader``'s default ``collate_fn`` already stacks containers; this one adds
keywords for entries whose length varies from sample to sample: padded and stacked with
a mask (``pad_keys``, ``mask_key``), or stacked into jagged nested tensors
(``nested_keys``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence as _pad_tensors
from torch.utils.data import default_collate

from .leafwise import is_collection
from .nested_keys import key_parts

API = "tdfunc.collate"


def collate(
    batch: Any,
    *,
    pad_keys: Mapping[Any, float] | None = None,
    nested_keys: Sequence[Any] | None = None,
    mask_key: Any = None,
) -> Any:
    """Collate a list of samples into a batch: pass it as a ``DataLoader``'s ``collate_fn``.

    The first sample's type decides: containers are stacked (a TensorClass keeps its
    class), tensors go through ``torch.stack``, mappings give a ``dict`` and tuples a
    tuple (a named tuple keeps its class) with each entry collated across the samples,
    and anything else goes through ``torch.utils.data.default_collate``. Anything other
    than a non-empty list (the container a batch sampler reads in one index) is returned
    as it is.

    The keywords, given with :func:`functools.partial`, batch the entries of the
    containers whose length varies (the others must stack as they are):

    - ``pad_keys`` maps entries to their padding value: each is padded along its first
      dim to the longest sample and stacked. The samples must have an empty batch size.
    - ``mask_key`` names where to store a container of masks, ``True`` at the valid
      positions of each ``pad_keys`` entry (a TensorClass needs a field of that name).
    - ``nested_keys`` lists entries stacked into nested tensors of ``torch.jagged``
      layout, whose first dim is ragged.

    tdfunc has no lazy stacks: samples whose other entries differ in shape are refused,
    with a hint to name those entries.

    Example:
        >>> from functools import partial
        >>> from torch.utils.data import DataLoader
        >>> samples = [TensorDict(ids=torch.ones(n, dtype=torch.long)) for n in (2, 3)]
        >>> collate_fn = partial(collate, pad_keys={"ids": 0}, mask_key="mask")
        >>> batch = next(iter(DataLoader(samples, batch_size=2, collate_fn=collate_fn)))
        >>> batch["ids"].tolist(), batch["mask", "ids"].tolist()
        ([[1, 1, 0], [1, 1, 1]], [[True, True, False], [True, True, True]])
    """
    options = _Options(pad_keys, nested_keys, mask_key)
    return _collate(batch, options)


class _Options:
    def __init__(self, pad_keys: Any, nested_keys: Any, mask_key: Any) -> None:
        if pad_keys is not None and not isinstance(pad_keys, Mapping):
            raise TypeError(
                f"{API}: pad_keys must map each entry to its padding value, got "
                f"{type(pad_keys).__name__}."
            )
        if isinstance(nested_keys, (str, tuple)):
            nested_keys = [nested_keys]  # one key, not a sequence of its letters
        self.pad = {key_parts(k, API): v for k, v in (pad_keys or {}).items()}
        self.nested = [key_parts(k, API) for k in (nested_keys or ())]
        self.mask = None if mask_key is None else key_parts(mask_key, API)
        if self.mask is not None and not self.pad:
            raise ValueError(f"{API}: mask_key={mask_key!r} needs pad_keys, the entries to mask.")
        both = sorted(set(self.pad) & set(self.nested))
        if both:
            shown = [k[0] if len(k) == 1 else k for k in both]
            raise ValueError(f"{API}: the keys {shown} are in both pad_keys and nested_keys.")

    def __bool__(self) -> bool:
        return bool(self.pad or self.nested)


def _collate(batch: Any, options: _Options) -> Any:
    if not isinstance(batch, list) or not batch:
        return batch
    first = batch[0]
    if is_collection(first):
        return _collate_containers(batch, options)
    if isinstance(first, torch.Tensor):
        return torch.stack(batch)
    if isinstance(first, Mapping):
        return {key: _collate([sample[key] for sample in batch], options) for key in first}
    if isinstance(first, tuple):
        columns = [_collate(list(column), options) for column in zip(*batch, strict=True)]
        return type(first)(*columns) if hasattr(first, "_fields") else tuple(columns)
    return default_collate(batch)


def _collate_containers(batch: list, options: _Options) -> Any:
    if not options:
        return _stack(batch)
    first = batch[0]
    if options.pad and first.batch_size:
        raise ValueError(
            f"{API}: pad_keys pads the first dim of each entry, which is a batch dim of "
            f"these samples (batch size {list(first.batch_size)}); give the samples an "
            f"empty batch size."
        )
    if options.mask is not None and options.mask in _key_set(first):
        raise ValueError(
            f"{API}: mask_key={_shown(options.mask)} is an entry of the samples; pass a "
            f"key the samples do not have."
        )
    named = [*options.pad, *options.nested]
    columns = {key: [_entry(sample, key, position) for position, sample in enumerate(batch)]
               for key in named}  # fmt: skip
    # built as a TensorDict, then given the samples' class: a frozen TensorClass
    # refuses the writes below
    cls = type(first)
    out = _stack([sample._to_tensordict_view().exclude(*named) for sample in batch])
    masks = {}
    for key, value in options.pad.items():
        padded, mask = _padded(columns[key], value, key)
        _put(out, key, padded)
        masks[key] = mask
    for key in options.nested:
        _put(out, key, _nested(columns[key], key))
    is_plain = getattr(cls, "_is_tensordict", False)
    if options.mask is not None:
        if not is_plain and options.mask[0] not in getattr(cls, "_tc_field_names", ()):
            raise ValueError(
                f"{API}: mask_key={_shown(options.mask)} names no field of "
                f"{cls.__name__}; add a field of that name to hold the masks."
            )
        # an empty TensorDict of the batch's size, asked of the batch (no import upward)
        holder = out._like({}, out.batch_size, None)
        for key, mask in masks.items():
            holder.set(key, mask)
        out.set(options.mask, holder)
    if is_plain:
        return out
    return cls._from_pytree(out._data, out.batch_size, out._device, None)


def _put(container: Any, key: tuple, value: Any) -> Any:
    """``container.set(key, value)`` through nested TensorClass levels, each rebuilt with
    the new entry (a frozen one refuses the write)."""
    head, rest = key[0], key[1:]
    if rest:
        value = _put(container.get(head), rest, value)
    if getattr(type(container), "_is_tensordict", False):
        container.set(head, value)
        return container
    view = container._to_tensordict_view()
    data = {**view._data, head: value}
    return type(container)._from_pytree(data, view.batch_size, view._device, None)


def _stack(batch: list) -> Any:
    try:
        return torch.stack(batch)
    except RuntimeError as error:
        raise RuntimeError(
            f"{API}: {error} tdfunc has no lazy stacks: name the entries whose length "
            f"varies in pad_keys or nested_keys (functools.partial(collate, ...))."
        ) from error


def _key_set(sample: Any) -> set:
    return {k if isinstance(k, tuple) else (k,) for k in sample.keys(True)}


def _entry(sample: Any, key: tuple, position: int) -> torch.Tensor:
    if key not in _key_set(sample):
        raise KeyError(
            f"{API}: the sample at position {position} has no entry {_shown(key)}, which "
            f"pad_keys or nested_keys names."
        )
    value = sample.get(key)
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"{API}: the entry {_shown(key)} is a {type(value).__name__}; pad_keys and "
            f"nested_keys name tensor entries."
        )
    return value


def _padded(values: list, value: float, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    if any(v.ndim == 0 for v in values):
        raise ValueError(f"{API}: the entry {_shown(key)} is 0-d: it has no length to pad.")
    try:
        padded = _pad_tensors(values, batch_first=True, padding_value=value)
    except RuntimeError as error:
        raise RuntimeError(
            f"{API}: the entry {_shown(key)} (shapes {[list(v.shape) for v in values]}) "
            f"cannot be padded along its first dim: {error}"
        ) from error
    lengths = torch.tensor([len(v) for v in values], device=padded.device)
    mask = torch.arange(padded.shape[1], device=padded.device) < lengths.unsqueeze(-1)
    return padded, mask


def _nested(values: list, key: tuple) -> torch.Tensor:
    try:
        return torch.nested.as_nested_tensor(values, layout=torch.jagged)
    except (RuntimeError, ValueError) as error:
        raise RuntimeError(
            f"{API}: the entry {_shown(key)} (shapes {[list(v.shape) for v in values]}) "
            f"cannot be a jagged nested tensor: {error}"
        ) from error


def _shown(key: tuple) -> str:
    return repr(key[0] if len(key) == 1 else key)
