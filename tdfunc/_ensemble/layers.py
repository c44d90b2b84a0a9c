"""Batched implementations of the standard layers (planners, see ``registry``).

Every step takes ``leaves`` (the ensemble's flat tuple of stacked tensors) and
member-leading activations ``[N, B, ...]``, and returns member-leading outputs
equal to running each member on its own slice.

None of these planners reads the module's train/eval flag (a step that depends on
it, dropout or batch norm, reads it when it runs): they are registered ``mode_free``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .registry import BatchContext, register_planner

_ELEMENTWISE = {
    nn.Identity: lambda x: x,
    nn.Tanh: torch.tanh,
    nn.Sigmoid: torch.sigmoid,
    nn.ReLU: torch.relu,
    nn.SiLU: F.silu,
    nn.Mish: F.mish,
    nn.Softsign: F.softsign,
    nn.Tanhshrink: F.tanhshrink,
    nn.LogSigmoid: F.logsigmoid,
    nn.Hardswish: F.hardswish,
    nn.Hardsigmoid: F.hardsigmoid,
    nn.SELU: F.selu,
    nn.ReLU6: F.relu6,
}


@register_planner(*_ELEMENTWISE, mode_free=True)
def _elementwise(module: nn.Module, slots: dict, context: BatchContext):
    function = _ELEMENTWISE[type(module)]

    def step(leaves, x):
        return function(x)

    step.pointwise = function  # type: ignore[attr-defined]  # a chain may call it directly
    return step


@register_planner(
    nn.GELU, nn.LeakyReLU, nn.ELU, nn.CELU, nn.Softplus, nn.Hardtanh, nn.Threshold,
    nn.Hardshrink, nn.Softshrink, falls_back="`inplace=True`", mode_free=True,
)  # fmt: skip
def _configured_elementwise(module: nn.Module, slots: dict, context: BatchContext):
    # Pointwise with hyper-parameters: the module itself is pointwise, so it runs
    # as it is on any layout (in-place variants are run out of place: an input
    # shared by the members is an expanded view that cannot be written).
    if getattr(module, "inplace", False):
        return None
    return lambda leaves, x: module(x)


def shift_dim(dim: int) -> int:
    """A per-member dim in the member-leading layout (negative dims count from the end)."""
    return dim + 1 if dim >= 0 else dim


@register_planner(
    nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.GLU, falls_back="`dim=None`", mode_free=True
)
def _softmax_like(module: nn.Module, slots: dict, context: BatchContext):
    if module.dim is None:
        return None  # the implicit dim depends on the rank: vmap decides it
    dim = shift_dim(module.dim)
    function = {nn.Softmax: F.softmax, nn.LogSoftmax: F.log_softmax, nn.Softmin: F.softmin,
                nn.GLU: F.glu}[type(module)]  # fmt: skip
    return lambda leaves, x: function(x, dim)


@register_planner(nn.Flatten, mode_free=True)
def _flatten(module: nn.Module, slots: dict, context: BatchContext):
    start, end = shift_dim(module.start_dim), shift_dim(module.end_dim)
    return lambda leaves, x: x.flatten(start, end)


@register_planner(nn.Unflatten, mode_free=True)
def _unflatten(module: nn.Module, slots: dict, context: BatchContext):
    dim, sizes = shift_dim(module.dim), tuple(module.unflattened_size)
    return lambda leaves, x: x.unflatten(dim, sizes)


def transposed(weight: torch.Tensor) -> torch.Tensor:
    return weight.mT


def row(bias: torch.Tensor) -> torch.Tensor:
    return bias.unsqueeze(1)


# Per-member input elements from which an input shared by the members (expanded,
# stride 0 along the members) goes through one matmul with every member's weight
# ([B, in] @ [in, N * out]) instead of a bmm over the expanded input, whose
# backward is several times slower at these sizes (CPU, measured). Only for a
# weight stored [N, out, in] contiguous (one whose user replaced the ensemble's
# own): the ensemble stores its Linear weights as [N, in, out] memory (layout.py),
# and on those the bmm is as fast or faster than this matmul, which would need a
# copy of the weight.
_SHARED_MATMUL_ELEMENTS = 4096


def _wide(x: torch.Tensor) -> bool:
    # With a symbolic batch (torch.export with dynamic shapes) the test must not
    # guard on the batch size: a size that is not known to be wide takes the bmm
    # path, which is right for every size. A plain bool is the answer as it is.
    wide = x.numel() >= _SHARED_MATMUL_ELEMENTS * x.shape[0]
    return wide if wide.__class__ is bool else statically_known_true(wide)


@register_planner(nn.Linear, mode_free=True)
def _linear(module: nn.Module, slots: dict, context: BatchContext):
    # y = x @ W^T + b for all members: one baddbmm on [N, rows, in] inputs, with
    # the weight's transpose and the bias as a row read from the derived leaves.
    weight, bias = slots["weight"], slots.get("bias")
    w = context.derived(transposed, weight)
    b = None if bias is None else context.derived(row, bias)

    def shared(leaves, x):
        # merged per call, not cached: the matmul it feeds dwarfs two views
        stacked = leaves[weight]
        if not stacked.is_contiguous():
            return None
        first = x[0]
        out = F.linear(
            first, stacked.flatten(0, 1), None if bias is None else leaves[bias].flatten(0, 1)
        )
        return out.unflatten(-1, (x.shape[0], -1)).movedim(-2, 0)

    if b is None:

        def step(leaves, x):
            stride = x.stride()  # no argument to parse; its length is the rank
            if stride[0] == 0 and _wide(x):
                out = shared(leaves, x)
                if out is not None:
                    return out
            if len(stride) == 3:
                return torch.bmm(x, leaves[w])
            shape = x.shape
            out = torch.bmm(x.reshape(shape[0], math.prod(shape[1:-1]), shape[-1]), leaves[w])
            return out.view(*shape[:-1], out.shape[-1])

        step.matmul_operands = (None, w, weight)  # type: ignore[attr-defined]  # plan._chain
        return step

    def step(leaves, x):
        stride = x.stride()  # no argument to parse; its length is the rank
        if stride[0] == 0 and _wide(x):
            out = shared(leaves, x)
            if out is not None:
                return out
        if len(stride) == 3:
            return torch.baddbmm(leaves[b], x, leaves[w])
        shape = x.shape
        flat = x.reshape(shape[0], math.prod(shape[1:-1]), shape[-1])
        out = torch.baddbmm(leaves[b], flat, leaves[w])
        return out.view(*shape[:-1], out.shape[-1])

    # What a chain runs inline for a [N, B, in] input (the step's own third branch):
    # positions of the bias row, the transposed weight and the stored weight (an
    # input shared by the members takes the step when that one is contiguous).
    step.matmul_operands = (b, w, weight)  # type: ignore[attr-defined]
    return step


@register_planner(nn.Conv1d, nn.Conv2d, nn.Conv3d, mode_free=True)
def _conv(module: nn.Module, slots: dict, context: BatchContext):
    # Members fold into the channel dim and into the groups: one convolution with
    # N * groups groups computes every member's output channels from its inputs.
    w, b = slots["weight"], slots.get("bias")
    spatial = len(module.kernel_size)
    conv = (F.conv1d, F.conv2d, F.conv3d)[spatial - 1]
    groups, stride, dilation = module.groups, module.stride, module.dilation
    padding: object = module.padding
    pad_mode = module.padding_mode
    if pad_mode != "zeros":
        reversed_padding = module._reversed_padding_repeated_twice
        padding = 0

    def step(leaves, x):
        weight = leaves[w]
        n = weight.shape[0]
        unbatched = x.dim() == spatial + 2  # one [C, *spatial] sample per member
        if unbatched:
            x = x.unsqueeze(1)
        batch = x.shape[1]
        h = x.transpose(0, 1).reshape(batch, n * x.shape[2], *x.shape[3:])
        if pad_mode != "zeros":
            h = F.pad(h, reversed_padding, mode=pad_mode)
        bias = None if b is None else leaves[b].reshape(-1)
        out = conv(h, weight.flatten(0, 1), bias, stride, padding, dilation, groups * n)
        out = out.view(batch, n, weight.shape[1], *out.shape[2:]).transpose(0, 1)
        return out.squeeze(1) if unbatched else out

    return step


def _affine_view(tensor: torch.Tensor, lead: int) -> torch.Tensor:
    """``[N, *shape]`` as ``[N, 1 * lead, *shape]`` to broadcast against activations."""
    return tensor.view(tensor.shape[0], *(1,) * lead, *tensor.shape[1:])


@register_planner(nn.LayerNorm, mode_free=True)
def _layer_norm(module: nn.Module, slots: dict, context: BatchContext):
    shape, eps = tuple(module.normalized_shape), module.eps
    w, b = slots.get("weight"), slots.get("bias")
    rank = len(shape)

    def step(leaves, x):
        y = F.layer_norm(x, shape, None, None, eps)
        lead = x.dim() - 1 - rank
        if w is not None:
            if b is not None:
                return torch.addcmul(
                    _affine_view(leaves[b], lead), y, _affine_view(leaves[w], lead)
                )
            return y * _affine_view(leaves[w], lead)
        return y if b is None else y + _affine_view(leaves[b], lead)

    return step


@register_planner(nn.RMSNorm, mode_free=True)
def _rms_norm(module: nn.Module, slots: dict, context: BatchContext):
    shape, eps = tuple(module.normalized_shape), module.eps
    w = slots.get("weight")
    rank = len(shape)

    def step(leaves, x):
        y = F.rms_norm(x, shape, None, eps)
        return y if w is None else y * _affine_view(leaves[w], x.dim() - 1 - rank)

    return step


@register_planner(nn.PReLU, mode_free=True)
def _prelu(module: nn.Module, slots: dict, context: BatchContext):
    w = slots["weight"]

    def step(leaves, x):
        weight = leaves[w]  # [N, parameters]
        n, parameters = weight.shape
        if parameters == 1:
            slope = weight.view(n, *(1,) * (x.dim() - 1))
        else:  # one slope per channel: dim 1 of a member's input, which has one if 2-D+
            channels = x.shape[2] if x.dim() > 2 else 1
            if channels != parameters:
                raise RuntimeError(
                    f"Mismatch of parameter numbers and input channel size. Found parameter "
                    f"numbers = {parameters} and channel size = {channels}."
                )
            slope = weight.view(n, 1, parameters, *(1,) * (x.dim() - 3))
        return torch.where(x > 0, x, slope * x)

    return step


@register_planner(nn.GroupNorm, mode_free=True)
def _group_norm(module: nn.Module, slots: dict, context: BatchContext):
    groups, eps = module.num_groups, module.eps
    w, b = slots.get("weight"), slots.get("bias")

    def step(leaves, x):
        y = F.group_norm(x.flatten(0, 1), groups, None, None, eps).view(x.shape)
        trailing = x.dim() - 3  # spatial dims after [N, B, C]
        if w is not None:
            weight = leaves[w]
            y = y * weight.view(weight.shape[0], 1, weight.shape[1], *(1,) * trailing)
        if b is not None:
            bias = leaves[b]
            y = y + bias.view(bias.shape[0], 1, bias.shape[1], *(1,) * trailing)
        return y

    return step


@register_planner(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, mode_free=True)
def _batch_norm(module: nn.Module, slots: dict, context: BatchContext):
    # Members fold into the channel dim: one batch_norm call normalises each
    # member's channels with that member's batch statistics (training) or
    # running statistics (eval), and updates the running statistics in place
    # through views of the stacked buffers.
    w, b = slots.get("weight"), slots.get("bias")
    mean, var = slots.get("running_mean"), slots.get("running_var")
    tracked = slots.get("num_batches_tracked")
    eps, momentum, track = module.eps, module.momentum, module.track_running_stats

    def step(leaves, x):
        n, batch = x.shape[0], x.shape[1]
        training = module.training
        factor = 0.0 if momentum is None else momentum
        per_member = None  # the cumulative average's factor, when the members' counts differ
        if training and track and tracked is not None:
            counter = leaves[tracked]
            counter.add_(1)
            if momentum is None:  # a cumulative average: 1 / (batches seen), per member
                if n > 1 and not bool((counter == counter[0]).all()):
                    per_member = counter
                else:
                    factor = 1.0 / float(counter[0])
        use_batch_stats = training or (mean is None and var is None)
        keep = not training or track
        running_mean = _flat_buffer(leaves[mean]) if keep and mean is not None else None
        running_var = _flat_buffer(leaves[var]) if keep and var is not None else None
        h = x.transpose(0, 1).reshape(batch, n * x.shape[2], *x.shape[3:])
        fresh = (running_mean, running_var)
        if per_member is not None:
            # momentum 1 leaves this batch's statistics in fresh tensors; each member
            # then moves its running statistics towards them by its own factor. The
            # update computes 0 * old + 1 * stats: the old values must be numbers (an
            # uninitialised NaN would survive the product), so zeros, not empty.
            fresh = tuple(None if r is None else torch.zeros_like(r) for r in fresh)
        out = F.batch_norm(
            h,
            fresh[0],
            fresh[1],
            None if w is None else leaves[w].reshape(-1),
            None if b is None else leaves[b].reshape(-1),
            use_batch_stats,
            1.0 if per_member is not None else factor,
            eps,
        )
        if per_member is not None:
            weights = (1.0 / per_member.double()).repeat_interleave(x.shape[2])
            for running, stats in zip((running_mean, running_var), fresh):
                if running is not None:
                    running.lerp_(stats, weights.to(running.dtype))
        for position, running in ((mean, running_mean), (var, running_var)):
            if running is not None and not leaves[position].is_contiguous():
                leaves[position].copy_(running.view(leaves[position].shape))  # see _flat_buffer
        return out.view(batch, n, *x.shape[2:]).transpose(0, 1)

    return step


def _flat_buffer(buffer: torch.Tensor) -> torch.Tensor:
    """A running statistic as one row for F.batch_norm: a view, or (strided members,
    ``ens[::2]``) a copy that the step writes back after the update."""
    return buffer.view(-1) if buffer.is_contiguous() else buffer.reshape(-1)


def _random_error() -> RuntimeError:
    return RuntimeError(
        "Ensemble: a random operation (dropout) ran while randomness='error'. Use "
        "randomness='different' (each member draws its own numbers) or 'same'."
    )


@register_planner(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, mode_free=True)
def _dropout(module: nn.Module, slots: dict, context: BatchContext):
    def step(leaves, x):
        if not module.training or module.p == 0:
            return x
        randomness = context.randomness
        # Masks are drawn in the elements' logical order (a mask is filled in memory
        # order, and a batched layer before this one, batch norm, can hand over a
        # transposed view), so the numbers drawn are those of vmap with the same
        # randomness, and, for one random layer, those of a loop over the members.
        if randomness == "different":
            if type(module) is nn.Dropout:
                return F.dropout(x.contiguous(), module.p, True)
            return module(x.flatten(0, 1)).unflatten(0, x.shape[:2])
        if randomness == "same":  # one mask for every member, as vmap's "same"
            return x * module(torch.ones(x.shape[1:], dtype=x.dtype, device=x.device))
        raise _random_error()

    return step


@register_planner(nn.Embedding, falls_back="`max_norm`, `sparse=True`", mode_free=True)
def _embedding(module: nn.Module, slots: dict, context: BatchContext):
    if module.max_norm is not None or module.sparse:
        return None  # in-place renormalisation, sparse gradients: left to vmap
    w = slots["weight"]
    padding_idx, by_freq = module.padding_idx, module.scale_grad_by_freq

    return lambda leaves, indices: member_embedding(indices, leaves[w], padding_idx, by_freq)


def merged_indices(indices: torch.Tensor, members: int, rows: int) -> torch.Tensor:
    """Member-leading indices ``[N, ...]`` into the members' tables merged as one
    ``[N * rows, ...]`` table."""
    offsets = torch.arange(members, device=indices.device).view(
        members, *(1,) * (indices.dim() - 1)
    )
    # An index outside [0, rows) would read a neighbouring member's row of the
    # merged table: its floor quotient by rows (0 inside) moves it by whole tables,
    # off either end, so the lookup fails as the member's own lookup would (an
    # IndexError on the CPU, a device-side assert on a GPU), without a sync.
    outside = torch.div(indices, rows, rounding_mode="floor")
    return indices + (offsets + outside * members) * rows


def member_embedding(indices, weight, padding_idx, by_freq: bool) -> torch.Tensor:
    """``F.embedding`` of each member's indices in its table (``weight``: ``[N, rows, dim]``)."""
    n, rows = weight.shape[0], weight.shape[1]
    shifted = merged_indices(indices, n, rows)
    # The shifted indices of different members differ, so the counts behind
    # scale_grad_by_freq stay per member.
    out = F.embedding(shifted, weight.flatten(0, 1), scale_grad_by_freq=by_freq)
    if padding_idx is not None:  # no gradient flows to the padding row
        pad = (indices == padding_idx).unsqueeze(-1)
        out = torch.where(pad, out.detach(), out)
    return out
