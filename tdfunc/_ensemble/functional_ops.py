"""``torch.nn.functional`` calls of a traced ``forward``, batched (rules for ``trace.py``).

A rule ``rule(rewriter, node, args, kwargs)`` rewrites one call for the
member-leading layout and returns True, or returns False to leave the call to the
general rules (which run it under ``vmap`` when nothing else applies):

- convolutions and transposed convolutions: with the members' stacked weights, the
  members fold into the groups (as the ``Conv*`` layers do); with a weight shared
  by the members, into the batch;
- ``layer_norm``, ``rms_norm``: normalised as they are; stacked affine tensors get
  the member dim in front of their own dims;
- ``dropout``: each member draws its own mask (as ``nn.Dropout`` does), following
  the ensemble's ``randomness``;
- ``embedding``: the members' tables merged into one lookup (as ``nn.Embedding``);
- elementwise losses (``mse_loss``, ``l1_loss``, ...): computed per element, then
  reduced per member; ``cross_entropy`` and ``nll_loss`` with ``reduction`` ``"none"``
  or ``"sum"``: the members fold into the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import graph_ops as ops
from .layers import _random_error, member_embedding

_CONVOLUTIONS = {
    F.conv1d: (1, False), F.conv2d: (2, False), F.conv3d: (3, False),
    F.conv_transpose1d: (1, True), F.conv_transpose2d: (2, True), F.conv_transpose3d: (3, True),
}  # fmt: skip
_CONV_OPTIONS = ("stride", "padding", "dilation", "groups")
_TRANSPOSED_OPTIONS = ("stride", "padding", "output_padding", "groups", "dilation")


def _leading(args, kwargs, names) -> tuple:
    """``args`` and ``kwargs`` with the leading ``names`` given by keyword moved into ``args``
    (``F.conv2d(input=x, weight=w)``), so a rule reads them by position."""
    args, kwargs = list(args), dict(kwargs)
    for name in names[len(args) :]:
        if name not in kwargs:
            break
        args.append(kwargs.pop(name))
    return tuple(args), kwargs


def _argument(args, kwargs, position: int, name: str, default=None):
    if position < len(args):
        return args[position]
    return kwargs.get(name, default)


def grouped_convolution(function, spatial: int, transposed: bool):
    """``function(x, weight, bias, ...)`` with stacked ``weight`` ``[N, ...]`` (and bias)."""
    names = _TRANSPOSED_OPTIONS if transposed else _CONV_OPTIONS

    def call(x, weight, bias=None, *rest, **kwargs):
        options = dict(zip(names, rest), **kwargs)
        n = weight.shape[0]
        unbatched = x.dim() == spatial + 2
        if unbatched:
            x = x.unsqueeze(1)
        batch = x.shape[1]
        h = x.transpose(0, 1).reshape(batch, n * x.shape[2], *x.shape[3:])
        groups = options.get("groups", 1)
        options["groups"] = groups * n
        flat_bias = None if bias is None else bias.reshape(-1)
        out = function(h, weight.flatten(0, 1), flat_bias, **options)
        # the channels by the weight, not by -1: an empty batch leaves -1 ambiguous
        channels = weight.shape[2] * groups if transposed else weight.shape[1]
        out = out.view(batch, n, channels, *out.shape[2:]).transpose(0, 1)
        return out.squeeze(1) if unbatched else out

    call.__name__ = f"grouped_{function.__name__}"
    return call


def shared_convolution(function, spatial: int):
    """``function(x, weight, ...)`` with one weight for every member: members join the batch."""

    def call(x, *args, **kwargs):
        if x.dim() == spatial + 2:  # one unbatched sample per member: members are the batch
            return function(x, *args, **kwargs)
        return function(x.flatten(0, 1), *args, **kwargs).unflatten(0, x.shape[:2])

    call.__name__ = f"shared_{function.__name__}"
    return call


def _convolution(rewriter, node, function, args, kwargs) -> bool:
    args, kwargs = _leading(args, kwargs, ("input", "weight", "bias"))
    if len(args) < 2:
        return False
    spatial, transposed = _CONVOLUTIONS[function]
    weight = _argument(args, kwargs, 1, "weight")
    bias = _argument(args, kwargs, 2, "bias")
    options = [*args[3:], *(v for k, v in kwargs.items() if k not in ("input", "weight", "bias"))]
    if any(rewriter.is_batched(v) for v in options):
        return False
    x_batched, weight_batched = rewriter.is_batched(args[0]), rewriter.is_batched(weight)
    bias_batched = rewriter.is_batched(bias)
    if weight_batched and (bias is None or bias_batched):
        target = grouped_convolution(function, spatial, transposed)
        new_args = (rewriter.lead_static(args[0]), *args[1:])
        rewriter.replace_op(node, target, new_args, kwargs, True)
        return True
    if x_batched and not weight_batched and not bias_batched:
        rewriter.replace_op(node, shared_convolution(function, spatial), args, kwargs, True)
        return True
    return False


def affine_norm(function, weight_batched: bool, bias_batched: bool):
    """``function(x, shape, weight, bias, ...)`` with stacked affine tensors ``[N, *shape]``."""

    def call(x, shape, weight=None, bias=None, *rest, **kwargs):
        lead = x.dim() - 1 - (1 if isinstance(shape, int) else len(shape))
        if function is F.rms_norm:  # rms_norm(x, shape, weight, eps): no bias
            rest, bias = ((bias, *rest) if bias is not None else rest), None
            y = function(x, shape, None, *rest, **kwargs)
        else:
            y = function(x, shape, None, None, *rest, **kwargs)
        if weight is not None:
            y = y * (_member_view(weight, lead) if weight_batched else weight)
        if bias is not None:
            y = y + (_member_view(bias, lead) if bias_batched else bias)
        return y

    call.__name__ = f"affine_{function.__name__}"
    return call


def _member_view(tensor, lead: int):
    return tensor.view(tensor.shape[0], *(1,) * lead, *tensor.shape[1:])


def _norm(rewriter, node, function, args, kwargs) -> bool:
    args, kwargs = _leading(args, kwargs, ("input", "normalized_shape"))
    if kwargs.keys() - {"weight", "bias", "eps"} or len(args) < 2:
        return False
    if rewriter.is_batched(args[1]) or any(rewriter.is_batched(a) for a in args[4:]):
        return False
    weight = _argument(args, kwargs, 2, "weight")
    bias = None if function is F.rms_norm else _argument(args, kwargs, 3, "bias")
    flags = rewriter.is_batched(weight), rewriter.is_batched(bias)
    if not any(flags):
        if not rewriter.is_batched(args[0]):
            return False
        rewriter.batched[node] = True  # trailing dims only: the member dim is one more batch dim
        return True
    target = affine_norm(function, *flags)
    rewriter.replace_op(node, target, (rewriter.lead_static(args[0]), *args[1:]), kwargs, True)
    return True


def member_dropout(context):
    """``F.dropout`` of member-leading activations: one mask per member (``randomness``)."""

    def call(x, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return x
        randomness = context.randomness
        if randomness == "different":  # drawn in logical order, as nn.Dropout's step does
            return F.dropout(x.contiguous(), p, True)
        if randomness == "same":
            return x * F.dropout(torch.ones(x.shape[1:], dtype=x.dtype, device=x.device), p, True)
        raise _random_error()

    return call


def _dropout(rewriter, node, function, args, kwargs) -> bool:
    args, kwargs = _leading(args, kwargs, ("input",))
    if not args:
        return False
    if kwargs.keys() - {"p", "training", "inplace"} or not rewriter.is_batched(args[0]):
        return False
    if any(rewriter.is_batched(v) for v in (*args[1:], *kwargs.values())):
        return False
    if _argument(args, kwargs, 3, "inplace", False) is not False:
        return False  # the caller may read its input afterwards: only vmap writes it in place
    target = member_dropout(rewriter.planner.context)
    rewriter.replace_op(node, target, args, kwargs, True)
    return True


def stacked_embedding(indices, weight, padding_idx=None, scale_grad_by_freq=False):
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[1]
    return member_embedding(indices, weight, padding_idx, scale_grad_by_freq)


def _embedding(rewriter, node, function, args, kwargs) -> bool:
    args, kwargs = _leading(args, kwargs, ("input", "weight"))
    if len(args) < 2:
        return False
    weight = _argument(args, kwargs, 1, "weight")
    if not rewriter.is_batched(weight) or len(args) > 3:
        return False
    # (a traced call carries every default by keyword)
    if kwargs.keys() - {"weight", "padding_idx", "scale_grad_by_freq", "max_norm", "norm_type",
                        "sparse"}:  # fmt: skip
        return False
    if kwargs.get("max_norm") is not None or kwargs.get("sparse"):
        return False  # in-place renormalisation, sparse gradients: left to vmap
    if any(rewriter.is_batched(kwargs.get(k)) for k in ("padding_idx", "scale_grad_by_freq")):
        return False
    kwargs = {k: v for k, v in kwargs.items() if k not in ("max_norm", "norm_type", "sparse")}
    new_args = (rewriter.lead_static(args[0]), *args[1:])
    rewriter.replace_op(node, stacked_embedding, new_args, kwargs, True)
    return True


_ELEMENTWISE_LOSSES = frozenset(
    [F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.huber_loss, F.binary_cross_entropy,
     F.binary_cross_entropy_with_logits, F.soft_margin_loss]
)  # fmt: skip
_CLASS_LOSSES = frozenset([F.cross_entropy, F.nll_loss])


def elementwise_loss(function, flags: tuple):
    """A loss computed per element (``reduction="none"``), then reduced per member."""
    per_element = ops.aligned(function, flags)

    def call(input, target, reduction="mean", **kwargs):
        out = per_element(input, target, reduction="none", **kwargs)
        if reduction == "none":
            return out
        flat = out.flatten(1)
        return flat.mean(1) if reduction == "mean" else flat.sum(1)

    call.__name__ = f"member_{function.__name__}"
    return call


def class_loss(function):
    """``cross_entropy`` / ``nll_loss`` with the members folded into the batch."""

    def call(input, target, reduction="mean", **kwargs):
        if input.dim() == 2:  # one unbatched sample [C] per member: members are the batch
            out = function(input, target, reduction="none", **kwargs)
            return out
        flat = function(input.flatten(0, 1), target.flatten(0, 1), reduction="none", **kwargs)
        out = flat.unflatten(0, input.shape[:2])
        return out if reduction == "none" else out.flatten(1).sum(1)

    call.__name__ = f"member_{function.__name__}"
    return call


def _loss(rewriter, node, function, args, kwargs) -> bool:
    args, kwargs = _leading(args, kwargs, ("input", "target"))
    # the deprecated size_average / reduce arguments come as None in a traced call
    if len(args) != 2 or kwargs.get("size_average") is not None or kwargs.get("reduce") is not None:
        return False
    kwargs = {k: v for k, v in kwargs.items() if k not in ("size_average", "reduce")}
    reduction = kwargs.get("reduction", "mean")
    others = [v for k, v in kwargs.items() if k != "reduction"]
    if not isinstance(reduction, str) or any(rewriter.is_batched(v) for v in others):
        return False
    flags = (rewriter.is_batched(args[0]), rewriter.is_batched(args[1]))
    if function in _ELEMENTWISE_LOSSES:
        rewriter.replace_op(node, elementwise_loss(function, flags), args, kwargs, True)
        return True
    if reduction not in ("none", "sum"):
        return False  # a mean over the targets that count (weights, ignore_index): vmap
    target = class_loss(function)
    rewriter.replace_op(node, target, rewriter.lead_static(args), kwargs, True)
    return True


def _shared_linear(rewriter, node, function, args, kwargs) -> bool:
    if not args:
        return False  # by keyword: left to the general rules
    # a weight (and bias) shared by the members: F.linear acts on the last dim, the
    # member dim is one more leading dim (stacked weights go to the linear rewrite)
    operands = (*args[1:], *kwargs.values())
    if not rewriter.is_batched(args[0]) or any(rewriter.is_batched(v) for v in operands):
        return False
    rewriter.batched[node] = True
    return True


RULES = {
    F.linear: _shared_linear,
    **dict.fromkeys(_CONVOLUTIONS, _convolution),
    F.layer_norm: _norm,
    F.rms_norm: _norm,
    F.dropout: _dropout,
    F.embedding: _embedding,
    **dict.fromkeys(_ELEMENTWISE_LOSSES | _CLASS_LOSSES, _loss),
}
