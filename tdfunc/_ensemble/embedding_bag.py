"""Batched ``nn.EmbeddingBag`` (a planner, see ``registry``).

The members' tables are merged into one (``[N * rows, dim]``) and each member's
indices are moved to its own table, as for ``nn.Embedding`` in ``layers``; the
bags of all members then go through one ``F.embedding_bag`` call.

With one flat input and ``offsets``, member ``m``'s indices occupy positions
``m * T`` to ``(m + 1) * T`` of the merged input. Each member's offsets are
followed by its end (``T``): the bag this opens ends where the next member's
first bag starts, and its output is dropped. So every bag holds exactly the
indices it holds for the member alone, whatever the offsets say.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import merged_indices
from .registry import BatchContext, register_planner


@register_planner(
    nn.EmbeddingBag,
    falls_back="`padding_idx`, `max_norm`, `sparse=True`, `scale_grad_by_freq=True`, "
    "`include_last_offset=True`",
)
def _embedding_bag(module: nn.Module, slots: dict, context: BatchContext):
    if module.max_norm is not None or module.sparse or module.padding_idx is not None:
        # in-place renormalisation, sparse gradients, one padding row per member:
        # none can be said of the merged table, so vmap runs them
        return None
    if module.scale_grad_by_freq:
        return None  # torch's counts in the backward go wrong for a merged table's rows
    if module.include_last_offset:
        # where the last offset falls short of the input, torch reads the last bag in
        # ways that differ by mode and between forward and backward (to the end of the
        # input, or a sum and a count that disagree): only its per-member call gives that
        return None
    w = slots["weight"]
    mode = module.mode

    def step(leaves, indices, offsets=None, per_sample_weights=None):
        weight = leaves[w]
        n, rows = weight.shape[0], weight.shape[1]
        if indices.dim() not in (2, 3):
            raise ValueError(
                f"EmbeddingBag: input has to be 1D or 2D Tensor, but got Tensor of dimension "
                f"{indices.dim() - 1} for a member"
            )
        member = torch.arange(n, device=indices.device).view(n, *(1,) * (indices.dim() - 1))
        shifted = merged_indices(indices, n, rows)
        table = weight.flatten(0, 1)
        if per_sample_weights is not None and per_sample_weights.dim() < indices.dim():
            per_sample_weights = per_sample_weights.expand(indices.shape)  # shared by members
        if indices.dim() == 3:  # fixed-length bags [N, B, L]: torch takes [N * B, L] as they are
            if offsets is not None:
                raise ValueError(
                    "EmbeddingBag: if input is 2D, then offsets has to be None, as input is "
                    "treated is a mini-batch of fixed length sequences."
                )
            flat_weights = None if per_sample_weights is None else per_sample_weights.flatten(0, 1)
            out = F.embedding_bag(
                shifted.flatten(0, 1), table, None, None, 2.0, False, mode, False, flat_weights
            )
            return out.view(n, indices.shape[1], -1)
        if offsets is None:
            raise ValueError("EmbeddingBag: offsets has to be a 1D Tensor but got None")
        if offsets.dim() == 1:
            offsets = offsets.expand(n, offsets.shape[0])  # shared by the members
        length = indices.shape[1]
        starts = offsets + member * length
        # each member's end closes its last bag
        ends = torch.full((n, 1), length, dtype=offsets.dtype, device=offsets.device)
        starts = torch.cat([starts, ends + member * length], dim=1)
        bags = starts.shape[1] - 1  # per member
        out = F.embedding_bag(
            shifted.reshape(-1),
            table,
            starts.reshape(-1),
            None,
            2.0,
            False,
            mode,
            False,
            None if per_sample_weights is None else per_sample_weights.reshape(-1),
            False,
        )
        return out.view(n, bags + 1, -1)[:, :bags]

    return step
