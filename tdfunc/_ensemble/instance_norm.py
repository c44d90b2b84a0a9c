"""Batched instance normalisation (planners, see ``registry``).

Each (sample, channel) plane is normalised on its own, and running statistics
are averaged over the batch per channel: the members fold into the channel dim
(as batch norm does in ``layers``), so that each member's statistics move with
its own batch only. After a convolution step the folded input is a view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import BatchContext, register_planner


@register_planner(nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def _instance_norm(module: nn.Module, slots: dict, context: BatchContext):
    w, b = slots.get("weight"), slots.get("bias")
    mean, var = slots.get("running_mean"), slots.get("running_var")
    unbatched_rank = module._get_no_batch_dim()  # a member's [C, *spatial]
    eps, affine, features = module.eps, module.affine, module.num_features

    def step(leaves, x):
        if x.dim() not in (unbatched_rank + 1, unbatched_rank + 2):
            module._check_input_dim(x[0])  # torch's own error for a member's input
        unbatched = x.dim() == unbatched_rank + 1
        if unbatched:
            x = x.unsqueeze(1)
        n, batch, channels = x.shape[0], x.shape[1], x.shape[2]
        if affine and channels != features:
            raise ValueError(
                f"expected input's size at dim={x.dim() - 1 - unbatched_rank} to match "
                f"num_features ({features}), but got: {channels}."
            )
        momentum = module.momentum if module.momentum is not None else 0.0
        use_input_stats = module.training or not module.track_running_stats
        # members into channels: a view when a convolution step left [B, N, C, ...] in memory
        h = x.transpose(0, 1).reshape(batch, n * channels, *x.shape[3:])
        running = [None if p is None else leaves[p] for p in (mean, var)]
        flat = [None if r is None else _flat(r) for r in running]
        out = F.instance_norm(
            h,
            flat[0],
            flat[1],
            None if w is None else leaves[w].reshape(-1),
            None if b is None else leaves[b].reshape(-1),
            use_input_stats,
            momentum,
            eps,
        )
        for stacked, row in zip(running, flat):
            if stacked is not None and not stacked.is_contiguous():
                stacked.copy_(row.view(stacked.shape))  # the update went to a copy
        out = out.view(batch, n, *x.shape[2:]).transpose(0, 1)
        return out.squeeze(1) if unbatched else out

    return step


def _flat(buffer: torch.Tensor) -> torch.Tensor:
    """A stacked running statistic as one row: a view, or a copy for strided members."""
    return buffer.view(-1) if buffer.is_contiguous() else buffer.reshape(-1)
