"""Batched layers of two inputs: ``Bilinear``, ``CosineSimilarity``, ``PairwiseDistance``.

Both inputs arrive member-leading (``[N, ..., features]``). Where a layer
broadcasts its inputs against each other, the lower-rank one gets singleton dims
after its member dim first, so that the member dims meet.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import shift_dim
from .registry import BatchContext, register_planner


def _aligned(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rank = max(a.dim(), b.dim())
    return _padded(a, rank), _padded(b, rank)


def _padded(x: torch.Tensor, rank: int) -> torch.Tensor:
    if x.dim() == rank:
        return x
    return x.view(x.shape[0], *(1,) * (rank - x.dim()), *x.shape[1:])


def bilinear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``[N, out, in1, in2]`` as ``[N, in1, out * in2]``: one bmm with the first input."""
    n, out, in1, in2 = weight.shape
    return weight.permute(0, 2, 1, 3).reshape(n, in1, out * in2)


@register_planner(nn.Bilinear)
def _bilinear(module: nn.Module, slots: dict, context: BatchContext):
    # y[o] = x1 @ W[o] @ x2 + b[o]: x1 meets every output's matrix in one bmm, the
    # result ([rows, out, in2]) meets x2 in a batched matrix-vector product.
    w = context.derived(bilinear_weight, slots["weight"])
    b = slots.get("bias")
    out_features = module.out_features

    def step(leaves, x1, x2):
        if x1.shape[:-1] != x2.shape[:-1]:
            raise RuntimeError(
                f"Bilinear: input1 and input2 must have the same size except the last dim, "
                f"got {tuple(x1.shape[1:])} and {tuple(x2.shape[1:])} per member."
            )
        n, lead = x1.shape[0], x1.shape[1:-1]
        first = x1.reshape(n, -1, x1.shape[-1])
        second = x2.reshape(n, -1, x2.shape[-1])
        # the second input's features by its shape, not by -1: an empty batch leaves -1 ambiguous
        mixed = torch.bmm(first, leaves[w]).view(n, first.shape[1], out_features, x2.shape[-1])
        out = torch.matmul(mixed, second.unsqueeze(-1)).squeeze(-1)
        if b is not None:
            out = out + leaves[b].unsqueeze(1)
        return out.view(n, *lead, out_features)

    return step


@register_planner(nn.CosineSimilarity)
def _cosine_similarity(module: nn.Module, slots: dict, context: BatchContext):
    dim, eps = shift_dim(module.dim), module.eps

    def step(leaves, x1, x2):
        x1, x2 = _aligned(x1, x2)
        return F.cosine_similarity(x1, x2, dim, eps)

    return step


@register_planner(nn.PairwiseDistance)
def _pairwise_distance(module: nn.Module, slots: dict, context: BatchContext):
    norm, eps, keepdim = module.norm, module.eps, module.keepdim

    def step(leaves, x1, x2):
        x1, x2 = _aligned(x1, x2)
        return F.pairwise_distance(x1, x2, norm, eps, keepdim)

    return step
