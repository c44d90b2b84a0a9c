"""Batched parameter-free layers that act on each sample alone (planners, see ``registry``).

Pooling, padding, upsampling, channel shuffles, ``LocalResponseNorm``,
``Fold``/``Unfold``: these layers read dim 0 of their input as the batch, so the
members fold into it (``[N, B, ...]`` runs as ``[N * B, ...]``). Pixel shuffles and
constant padding take any number of leading dims: the member dim is one more.

Two layouts are cheaper or needed:

- A layer that acts on each channel alone (pooling, padding, upsampling), given a
  batched sample per member in the layout a convolution step leaves
  (``[B, N, C, ...]`` in memory, a transposed view), folds the members into the
  channels instead: ``[B, N * C, ...]`` is then a view, not a copy, and so is its
  output for the next convolution.
- A layer that also takes one unbatched sample (``[C, *spatial]``) is given the
  member dim as the batch when each member's input is a single sample: folding
  the members into dim 0 there would mix their channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import BatchContext, register_planner

# type -> the rank of a member's batched input [B, C, *spatial]; None: any rank
# (interpolation reads the first two dims as batch and channel at every rank)
_CHANNELWISE = {
    **dict.fromkeys(
        [nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d, nn.LPPool1d,
         nn.ReflectionPad1d, nn.ReplicationPad1d, nn.CircularPad1d],
        3,
    ),
    **dict.fromkeys(
        [nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.LPPool2d,
         nn.ReflectionPad2d, nn.ReplicationPad2d, nn.CircularPad2d],
        4,
    ),
    **dict.fromkeys(
        [nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool3d, nn.LPPool3d,
         nn.ReflectionPad3d, nn.ReplicationPad3d, nn.CircularPad3d],
        5,
    ),
    **dict.fromkeys([nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d], None),
}  # fmt: skip

# type -> the rank of a batched input, for layers that mix channels (None: the layer
# reads dim 0 as the batch at every rank, so folding into it is always right)
_PER_SAMPLE = {
    nn.LocalResponseNorm: None,
    nn.ChannelShuffle: None,
    nn.Fold: 3,
    nn.Unfold: 4,
}


def _folded_into_batch(module: nn.Module, x: torch.Tensor, rank: int | None):
    if rank is not None and x.dim() == rank:  # one sample per member: members are the batch
        return module(x)
    out = module(x.flatten(0, 1))
    if isinstance(out, tuple):  # (values, indices), both per sample
        return tuple(o.unflatten(0, x.shape[:2]) for o in out)
    return out.unflatten(0, x.shape[:2])


@register_planner(*_CHANNELWISE)
def _channelwise(module: nn.Module, slots: dict, context: BatchContext):
    rank = _CHANNELWISE[type(module)]

    def step(leaves, x):
        if (x.dim() >= 4 if rank is None else x.dim() == rank + 1) and x.transpose(
            0, 1
        ).is_contiguous():
            n = x.shape[0]
            out = module(x.transpose(0, 1).flatten(1, 2))
            if isinstance(out, tuple):
                return tuple(o.unflatten(1, (n, -1)).transpose(0, 1) for o in out)
            return out.unflatten(1, (n, -1)).transpose(0, 1)
        return _folded_into_batch(module, x, rank)

    return step


@register_planner(*_PER_SAMPLE)
def _per_sample(module: nn.Module, slots: dict, context: BatchContext):
    rank = _PER_SAMPLE[type(module)]
    return lambda leaves, x: _folded_into_batch(module, x, rank)


@register_planner(
    nn.PixelShuffle, nn.PixelUnshuffle, nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d,
    nn.ConstantPad1d, nn.ConstantPad2d, nn.ConstantPad3d,
)  # fmt: skip
def _leading_dims(module: nn.Module, slots: dict, context: BatchContext):
    # [*, C, H, W] (pixel shuffles) or trailing dims padded with a constant, any
    # leading dims: the member dim is one more of them
    return lambda leaves, x: module(x)


@register_planner(nn.Softmax2d)
def _softmax2d(module: nn.Module, slots: dict, context: BatchContext):
    def step(leaves, x):
        if x.dim() not in (4, 5):
            module(x[0])  # torch's own error for a member's input of the wrong rank
        return F.softmax(x, -3)

    return step
