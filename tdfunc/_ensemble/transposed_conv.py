"""Batched transposed convolutions (planners, see ``registry``).

As for the forward convolutions in ``layers``, the members fold into the
channel dim and into the groups: a transposed convolution with ``N * groups``
groups maps each member's input channels through that member's weight only, so
one call computes every member's output.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from .registry import BatchContext, register_planner

_FUNCTIONS = {
    nn.ConvTranspose1d: F.conv_transpose1d,
    nn.ConvTranspose2d: F.conv_transpose2d,
    nn.ConvTranspose3d: F.conv_transpose3d,
}


@register_planner(*_FUNCTIONS, falls_back="`padding_mode` other than zeros (torch refuses it)")
def _conv_transpose(module: nn.Module, slots: dict, context: BatchContext):
    if module.padding_mode != "zeros":
        return None  # torch refuses it at call time: vmap gives the same error
    w, b = slots["weight"], slots.get("bias")
    function = _FUNCTIONS[type(module)]
    spatial = len(module.kernel_size)
    groups, stride, padding, dilation = (
        module.groups,
        module.stride,
        module.padding,
        module.dilation,
    )
    kernel_size, fixed_padding = module.kernel_size, module.output_padding

    def step(leaves, x, output_size=None):
        weight = leaves[w]  # [N, in_channels, out_channels / groups, *kernel]
        n = weight.shape[0]
        unbatched = x.dim() == spatial + 2  # one [C, *spatial] sample per member
        if unbatched:
            x = x.unsqueeze(1)
        if output_size is None:
            output_padding = fixed_padding
        else:
            # the padding that reaches the requested size depends only on one member's
            # input shape, so torch's own rule answers it for every member
            output_padding = module._output_padding(
                x[0], output_size, stride, padding, kernel_size, spatial, dilation
            )
        batch = x.shape[1]
        h = x.transpose(0, 1).reshape(batch, n * x.shape[2], *x.shape[3:])
        bias = None if b is None else leaves[b].reshape(-1)
        out = function(
            h, weight.flatten(0, 1), bias, stride, padding, output_padding, groups * n, dilation
        )
        # the channels by the weight, not by -1: an empty batch leaves -1 ambiguous
        out = out.view(batch, n, weight.shape[2] * groups, *out.shape[2:]).transpose(0, 1)
        return out.squeeze(1) if unbatched else out

    return step
