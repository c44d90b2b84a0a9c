"""``unpad_sequence``: the samples of a batch that ``pad_sequence`` padded, back apart.

Each row of the padded batch keeps, in every entry, the positions its mask marks along
``pad_dim``: one contiguous run per row (left or right padding alike). The lengths are
read on the host, once per entry, so this is for post-processing, not compiled code.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .leafwise import is_collection
from .nontensor import NonTensorData

API = "tdfunc.unpad_sequence"
_MASKS = "masks"


def unpad_sequence(padded: Any, mask: Any = None, *, pad_dim: int = 0) -> list:
    """Split a batch padded by :func:`pad_sequence` back into its samples.

    ``mask`` marks the valid positions: a TensorDict with one mask per entry (as
    ``pad_sequence(..., return_mask=True)`` stores under ``"masks"``), or one boolean
    tensor of shape ``[len(padded), max_len]`` for every entry. With ``mask=None`` the
    masks are read from the ``"masks"`` entry of ``padded``, which the samples do not
    get. ``pad_dim`` is the one given to ``pad_sequence``. Non-tensor entries are kept
    as they are, except along a padded batch dim, where they lose their pad slots too.

    Returns:
        A list with one container per row of ``padded`` (tdfunc has no lazy stacks:
        the samples' shapes differ), each with the sample's batch size; its tensors are
        views of ``padded``'s.

    Example:
        >>> samples = [
        ...     TensorDict(a=torch.arange(3), batch_size=[3]),
        ...     TensorDict(a=torch.arange(5), batch_size=[5]),
        ... ]
        >>> padded = pad_sequence(samples, return_mask=True, padding_side="left")
        >>> padded["a"].tolist()
        [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
        >>> out = unpad_sequence(padded)
        >>> out[0]["a"].tolist(), [sample.batch_size for sample in out]
        ([0, 1, 2], [torch.Size([3]), torch.Size([5])])
    """
    if not is_collection(padded):
        raise TypeError(
            f"{API}: expected the TensorDict or TensorClass that pad_sequence returned, "
            f"got {type(padded).__name__}."
        )
    if not isinstance(pad_dim, int) or isinstance(pad_dim, bool):
        raise TypeError(f"{API}: pad_dim must be an int, got {type(pad_dim).__name__}.")
    view = padded._to_tensordict_view()
    if not view.batch_size:
        raise ValueError(
            f"{API}: the samples lie along the first batch dim of padded, which has none "
            f"(batch size {list(view.batch_size)})."
        )
    skip = None
    if mask is None:
        found = view._data.get(_MASKS)
        if not is_collection(found):
            what = "no" if found is None else f"a {type(found).__name__} as its"
            raise ValueError(
                f"{API}: padded has {what} {_MASKS!r} entry, where the masks are read "
                f"from; pass mask=..., or pad with pad_sequence(..., return_mask=True)."
            )
        mask, skip = found._to_tensordict_view(), _MASKS
    elif is_collection(mask):
        mask = mask._to_tensordict_view()
    elif isinstance(mask, torch.Tensor):
        if mask.dtype is not torch.bool:
            raise TypeError(f"{API}: a tensor mask must be boolean, got {mask.dtype}.")
    else:
        raise TypeError(
            f"{API}: mask must be None, a TensorDict of masks or a boolean tensor, got "
            f"{type(mask).__name__}."
        )
    plan = _unpad_level(view, mask, pad_dim, skip, ())
    return [padded._like(*_row(plan, i), None) for i in range(view.batch_size[0])]


def _unpad_level(view: Any, mask: Any, pad_dim: int, skip: str | None, prefix: tuple):
    """How to cut every row of one level: ``(batch size rest, entries, batch runs)``.

    ``entries`` maps each key to ``("tensor", leaf, dim, starts, lengths)``, ``("level",
    sub-plan)`` or ``("value", leaf)``; ``batch runs`` are the runs along a padded batch
    dim (``None`` when ``pad_dim`` is not one), which the level's batch size takes.
    """
    rest = list(view.batch_size[1:])
    along_batch = 0 <= pad_dim < len(rest)
    entries: dict[str, tuple] = {}
    runs = None
    for key, leaf in view._data.items():
        if key == skip:
            continue
        path = (*prefix, key)
        if isinstance(leaf, torch.Tensor):
            dim = _leaf_dim(pad_dim, leaf, path, len(rest))
            starts, lengths = _runs(_mask_for(mask, key, path), leaf, dim, path)
            entries[key] = ("tensor", leaf, dim, starts, lengths)
            if along_batch:
                runs = _agree(runs, (starts, lengths), path)
        elif is_collection(leaf):
            sub_mask = mask if isinstance(mask, torch.Tensor) else _mask_for(mask, key, path)
            sub = _unpad_level(leaf._to_tensordict_view(), sub_mask, pad_dim, None, path)
            entries[key] = ("level", leaf, sub)
            if along_batch and sub[2] is not None:
                runs = _agree(runs, sub[2], path)
        else:
            entries[key] = ("value", leaf)
    if along_batch and runs is None and isinstance(mask, torch.Tensor):
        runs = _runs(mask, None, pad_dim + 1, prefix)
    if along_batch and runs is None:
        raise ValueError(
            f"{API}: the level at {prefix!r} pads batch dim {pad_dim} but holds no "
            f"tensor whose mask gives the samples' lengths."
        )
    return rest, entries, runs if along_batch else None, pad_dim


def _row(plan: tuple, i: int) -> tuple[dict, torch.Size]:
    rest, entries, runs, pad_dim = plan
    size = list(rest)
    if runs is not None:
        start, length = runs[0][i], runs[1][i]
        size[pad_dim] = length
    data: dict[str, Any] = {}
    for key, entry in entries.items():
        if entry[0] == "tensor":
            _, leaf, dim, starts, lengths = entry
            data[key] = leaf[i].narrow(dim, starts[i], lengths[i])
        elif entry[0] == "level":
            sub_data, sub_size = _row(entry[2], i)
            data[key] = entry[1]._like(sub_data, sub_size, None)
        else:
            value = entry[1][i]
            if runs is not None:
                index = (slice(None),) * pad_dim + (slice(start, start + length),)
                value = value[index]
            data[key] = value
    return data, torch.Size(size)


def _leaf_dim(pad_dim: int, leaf: torch.Tensor, path: tuple, batch_ndim: int) -> int:
    ndim = leaf.ndim - 1  # the sample's dims
    dim = pad_dim + ndim if pad_dim < 0 else pad_dim
    if not 0 <= dim < ndim:
        raise ValueError(
            f"{API}: pad_dim={pad_dim} is out of range for the entry {_shown(path)}, whose "
            f"samples have {ndim} dims."
        )
    if pad_dim < 0 and dim < batch_ndim:
        raise ValueError(
            f"{API}: pad_dim={pad_dim} falls on a batch dim of the entry {_shown(path)}; "
            f"pass it counted from the first dim (pad_dim={dim})."
        )
    return dim


def _mask_for(mask: Any, key: str, path: tuple) -> Any:
    if isinstance(mask, torch.Tensor):
        return mask
    found = mask._data.get(key)
    if found is None or isinstance(found, NonTensorData):
        raise KeyError(f"{API}: the mask has no entry for the key {_shown(path)} of padded.")
    if is_collection(found):
        return found._to_tensordict_view()
    if found.dtype is not torch.bool:
        raise TypeError(
            f"{API}: the mask of the key {_shown(path)} must be boolean, got {found.dtype}."
        )
    return found


def _runs(mask: Any, leaf: torch.Tensor | None, dim: int, path: tuple) -> tuple[list, list]:
    """The start and length of each row's marked run along the padded dim of ``leaf``.

    ``mask`` is the entry's own (the first dims of the leaf's shape, the padded one
    included, as ``pad_sequence`` stores) or one mask of every entry (the rows, the
    padded length).
    """
    if is_collection(mask):
        raise TypeError(
            f"{API}: the mask of the key {_shown(path)} is a TensorDict, but the entry is a tensor."
        )
    if leaf is not None:
        shared = (leaf.shape[0], leaf.shape[dim + 1])
        own = mask.ndim >= dim + 2 and tuple(mask.shape) == tuple(leaf.shape[: mask.ndim])
        if not own and tuple(mask.shape) != shared:
            raise ValueError(
                f"{API}: the mask of the key {_shown(path)} must have shape "
                f"[len(padded), max_len] = {list(shared)}, or the first dims of the "
                f"entry's shape {list(leaf.shape)} up to pad_dim; got {list(mask.shape)}."
            )
        if own and mask.ndim > 2:
            mask = mask.movedim(dim + 1, -1)
    elif mask.ndim != 2:
        raise ValueError(
            f"{API}: a tensor mask must have shape [len(padded), max_len], got {list(mask.shape)}."
        )
    flat = mask.reshape(mask.shape[0], math.prod(mask.shape[1:-1]), mask.shape[-1])
    if flat.shape[1] == 0:
        rows = torch.zeros(flat.shape[0], flat.shape[2], dtype=torch.bool, device=mask.device)
    else:
        if not bool((flat == flat[:, :1]).all()):
            raise ValueError(
                f"{API}: the mask of the key {_shown(path)} marks different positions in "
                f"the other dims; each row needs one run along pad_dim."
            )
        rows = flat[:, 0]
    counts = rows.sum(-1)
    zero = torch.zeros_like(counts)
    starts = torch.where(counts > 0, rows.int().argmax(-1), zero)
    ends = rows.shape[-1] - rows.flip(-1).int().argmax(-1)
    if not bool((torch.where(counts > 0, ends - starts, zero) == counts).all()):
        raise ValueError(
            f"{API}: the mask of the key {_shown(path)} marks positions that are not "
            f"contiguous in some row; unpad_sequence keeps one contiguous run per row."
        )
    return starts.tolist(), counts.tolist()


def _agree(runs: Any, found: tuple, path: tuple) -> tuple:
    if runs is not None and (runs[0] != found[0] or runs[1] != found[1]):
        raise ValueError(
            f"{API}: the masks give the entry {_shown(path)} other lengths along the padded "
            f"batch dim than the entries before it; a batch dim has one length per sample."
        )
    return found


def _shown(path: tuple) -> str:
    return repr(path[0] if len(path) == 1 else path)
