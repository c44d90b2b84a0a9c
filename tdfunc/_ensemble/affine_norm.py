"""A layer norm with per-member affine parameters that keeps one activation, not two.

torch's ``F.layer_norm`` takes one weight for the whole batch, so the batched form of
``LayerNorm`` is ``F.layer_norm`` without affine followed by ``addcmul(bias, y, weight)``.
Autograd then keeps the normalised ``y`` for the weight's gradient, beside the input
the normalisation keeps: one activation-sized tensor more per norm than a member's own
``LayerNorm`` keeps, which is most of what a transformer ensemble's training step holds
beyond a loop's. Here the backward recomputes ``y`` from the input and the saved
statistics instead.

Second derivatives go through the same formulas built from differentiable ops. Calls
that are traced or transformed (``torch.compile``, ``torch.export``, ``torch.func``)
take the plain composition, which every transform understands.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cache import tracing


def _sum_to(gradient: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``gradient`` summed over the dims along which ``like`` was broadcast."""
    lead = gradient.dim() - like.dim()
    dims = [d for d in range(gradient.dim()) if d < lead or like.shape[d - lead] == 1]
    if dims:
        gradient = gradient.sum(dims, keepdim=True)
    return gradient.view(like.shape) if lead else gradient


class _AffineLayerNorm(torch.autograd.Function):
    # forward(ctx, ...) rather than setup_context: apply() then binds no signature per
    # call (a visible cost at small sizes); transforms never reach this class.
    @staticmethod
    def forward(ctx, x, weight, bias, shape, eps):
        y, mean, rstd = torch.native_layer_norm(x, shape, None, None, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.shape, ctx.eps = shape, eps
        ctx.mark_non_differentiable(mean, rstd)
        return torch.addcmul(bias, y, weight), mean, rstd

    @staticmethod
    def backward(ctx, gradient, _mean, _rstd):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        shape, eps = ctx.shape, ctx.eps
        if torch.is_grad_enabled():  # a graph of the backward is asked for (create_graph)
            with torch.enable_grad():
                inner = x.detach().requires_grad_() if not x.requires_grad else x
                y = F.layer_norm(inner, shape, None, None, eps)
            needs = ctx.needs_input_grad
            grad_y = gradient * weight
            grad_x = None
            if needs[0]:
                (grad_x,) = torch.autograd.grad(y, inner, grad_y, create_graph=True)
            grad_weight = _sum_to(gradient * y, weight) if needs[1] else None
        else:
            # One activation-sized buffer at a time (this backward runs at the training
            # step's peak memory): y * gradient is built in place and reduced before
            # the input's gradient is allocated.
            needs = ctx.needs_input_grad
            grad_weight = None
            if needs[1]:
                grad_weight = _sum_to(torch.sub(x, mean).mul_(rstd).mul_(gradient), weight)
            grad_x = None
            if needs[0]:
                grad_x = torch.ops.aten.native_layer_norm_backward(
                    gradient * weight, x, shape, mean, rstd, None, None, [True, False, False]
                )[0]
        grad_bias = _sum_to(gradient, bias) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None, None


def affine_layer_norm(x, shape, weight, bias, eps):
    """``F.layer_norm(x, shape, None, None, eps) * weight + bias`` (``weight`` and ``bias``
    broadcast against ``x``: one row per member)."""
    if (
        not torch.is_grad_enabled()  # nothing is kept for a backward
        or tracing()
        or x.dtype != weight.dtype
        or x.dtype != bias.dtype
    ):
        return torch.addcmul(bias, F.layer_norm(x, shape, None, None, eps), weight)
    return _AffineLayerNorm.apply(x, weight, bias, shape, eps)[0]


def _two_leading(tensor: torch.Tensor) -> torch.Tensor:
    """``[N, *shape]`` as ``[N, 1, 1, *shape]``, against ``[N, B, T, *shape]`` activations."""
    return tensor.view(tensor.shape[0], 1, 1, *tensor.shape[1:])


def layer_norm_step(module, slots: dict, context):
    """The batched ``nn.LayerNorm`` through :func:`affine_layer_norm`, or None without
    both affine tensors (the plain planner is as lean there)."""
    w, b = slots.get("weight"), slots.get("bias")
    if w is None or b is None:
        return None
    shape, eps, rank = tuple(module.normalized_shape), module.eps, len(module.normalized_shape)
    # a transformer's [N, B, T, *shape] activations: the views made once, kept across calls
    w_rows, b_rows = context.derived(_two_leading, w), context.derived(_two_leading, b)
    sequence_rank = rank + 3

    def step(leaves, x):
        if x.dim() == sequence_rank:
            return affine_layer_norm(x, shape, leaves[w_rows], leaves[b_rows], eps)
        weight, bias = leaves[w], leaves[b]
        lead = (1,) * (x.dim() - 1 - rank)
        return affine_layer_norm(
            x,
            shape,
            weight.view(weight.shape[0], *lead, *weight.shape[1:]),
            bias.view(bias.shape[0], *lead, *bias.shape[1:]),
            eps,
        )

    return step
