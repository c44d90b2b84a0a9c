"""Batched parameter-free layers that act on each sample alone (planners, see ``registry``).

Beside the pooling, padding and upsampling layers of ``layers``: these layers
treat dim 0 of their input as the batch, so the members fold into it
(``[N, B, ...]`` runs as ``[N * B, ...]``). A layer that also takes one unbatched
sample (``[C, *spatial]``) is given the member dim as the batch instead when each
member's input is a single sample: folding it there would mix the members'
channels.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from .registry import BatchContext, register_planner

# type -> the rank of a batched input, for layers that also take an unbatched one
# (None: the layer reads dim 0 as the batch at every rank)
_BATCHED_RANK = {
    nn.LocalResponseNorm: None,
    nn.ChannelShuffle: None,
    nn.ReflectionPad3d: 5,
    nn.ReplicationPad3d: 5,
    nn.CircularPad1d: 3,
    nn.CircularPad2d: 4,
    nn.CircularPad3d: 5,
    nn.LPPool3d: 5,
    nn.Fold: 3,
    nn.Unfold: 4,
}


@register_planner(*_BATCHED_RANK)
def _sample_layer(module: nn.Module, slots: dict, context: BatchContext):
    rank = _BATCHED_RANK[type(module)]

    def step(leaves, x):
        if rank is not None and x.dim() == rank:  # one sample per member: members are the batch
            return module(x)
        return module(x.flatten(0, 1)).unflatten(0, x.shape[:2])

    return step


@register_planner(nn.Softmax2d)
def _softmax2d(module: nn.Module, slots: dict, context: BatchContext):
    def step(leaves, x):
        if x.dim() not in (4, 5):
            module(x[0])  # torch's own error for a member's input of the wrong rank
        return F.softmax(x, -3)

    return step
