"""Batched transformers: encoder and decoder layers, their stacks, ``nn.Transformer``.

Each layer is composed of the batched steps of its parts (``attention.py`` for the
attention blocks, ``layers.py`` for ``Linear``, ``LayerNorm``, ``Dropout`` and the
activation), in the order of torch's own forward (``norm_first`` or not). The
stacks (``nn.TransformerEncoder`` / ``Decoder``) chain their layers' steps and turn
boolean masks into float masks once, as torch does.

Only the computation torch runs with gradients is reproduced: in eval mode without
gradients torch may take its fused inference kernels, whose results equal the
same computation up to rounding. The one difference that is not rounding is
reproduced too: an ``nn.TransformerEncoder`` built with ``enable_nested_tensor``
(torch's default) that runs in eval mode without gradients, with a padding mask
whose padding is at the end of each sequence, returns zeros at the padded
positions (torch drops them and pads the output back with zeros). One difference
is not reproduced: a sequence whose every key is padded gives NaN in torch's fused
inference kernels and finite values on torch's differentiable path; the ensemble
gives the differentiable path's values in every mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .._core.helpers.tracing import compiling
from . import graph_ops as ops
from .affine_norm import layer_norm_step
from .attention import attention_step, canonical_mask
from .cache import tracing
from .layers import _dropout, _layer_norm, _linear
from .registry import BatchContext, planner_for, register_planner


def _under(slots: dict, prefix: str) -> dict:
    """The slots of the submodule at ``prefix`` (``"linear1."``), by their own names."""
    size = len(prefix)
    return {name[size:]: position for name, position in slots.items() if name.startswith(prefix)}


def _part(module: nn.Module, name: str, slots: dict, context: BatchContext, prefix: str):
    """The step of the child ``name`` of ``module``, or None when it has no batched form."""
    child = getattr(module, name)
    if isinstance(child, nn.Linear) and type(child).forward is nn.Linear.forward:
        return _linear(child, _under(slots, f"{prefix}{name}."), context)
    if type(child) is nn.LayerNorm:
        own = _under(slots, f"{prefix}{name}.")
        return layer_norm_step(child, own, context) or _layer_norm(child, own, context)
    if type(child) is nn.Dropout:
        return _dropout(child, {}, context)
    planner = planner_for(child)
    if planner is None or getattr(planner, "subtree", False):
        return None
    return planner(child, _under(slots, f"{prefix}{name}."), context)


def _activation(module: nn.Module, slots: dict, context: BatchContext, prefix: str):
    """The feed-forward activation as ``(function, takes_leaves)``, or None."""
    activation = module.activation
    if isinstance(activation, nn.Module):
        step = _part(module, "activation", slots, context, prefix)
        if step is None:
            return None
        pointwise = getattr(step, "pointwise", None)
        return (step, True) if pointwise is None else (pointwise, False)
    # A function: batched only when it acts element by element (a function of the
    # whole tensor could mix the members).
    if activation in ops.POINTWISE_FUNCTIONS:
        return activation, False
    return None


class _Relu(torch.autograd.Function):
    # forward(ctx, ...): apply() then binds no signature per call
    @staticmethod
    def forward(ctx, x):
        y = torch.relu(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, gradient):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():  # a graph of the backward is asked for: out of place
            return torch.ops.aten.threshold_backward(gradient, y, 0)
        return torch.ops.aten.threshold_backward.grad_input(gradient, y, 0, grad_input=gradient)


def owned_gradient_relu(x: torch.Tensor) -> torch.Tensor:
    """``relu`` whose backward masks the incoming gradient in place.

    Only for the feed-forward block, where the activation's output reaches nothing but
    the dropout and ``linear2``, whose backwards hand over a gradient no other node
    holds. Masking it in place spares one activation-sized buffer at the moment of the
    training step's peak memory: in an ensemble it is N members' worth.
    """
    if not torch.is_grad_enabled() or not x.requires_grad or tracing():
        return torch.relu(x)
    return _Relu.apply(x)


def _feed_forward(module: nn.Module, slots: dict, context: BatchContext, prefix: str):
    """``linear2(dropout(activation(linear1(x))))``, or None."""
    linear1 = _part(module, "linear1", slots, context, prefix)
    linear2 = _part(module, "linear2", slots, context, prefix)
    dropout = _part(module, "dropout", slots, context, prefix)
    activation = _activation(module, slots, context, prefix)
    if None in (linear1, linear2, dropout, activation):
        return None
    function, takes_leaves = activation
    if function in (torch.relu, F.relu):
        function = owned_gradient_relu

    if takes_leaves:

        def feed_forward(leaves, x):
            return linear2(leaves, dropout(leaves, function(leaves, linear1(leaves, x))))

    else:

        def feed_forward(leaves, x):
            return linear2(leaves, dropout(leaves, function(linear1(leaves, x))))

    return feed_forward


def _block_parts(module: nn.Module, names: tuple, slots, context, prefix) -> tuple | None:
    parts = tuple(_part(module, name, slots, context, prefix) for name in names)
    return None if None in parts else parts


def encoder_layer_step(module: nn.Module, slots: dict, context: BatchContext, prefix: str = ""):
    """The batched ``nn.TransformerEncoderLayer`` at ``prefix``, or None."""
    if type(module) is not nn.TransformerEncoderLayer:
        return None
    attend = attention_step(module.self_attn, slots, context, f"{prefix}self_attn.")
    feed_forward = _feed_forward(module, slots, context, prefix)
    parts = _block_parts(module, ("norm1", "norm2", "dropout1", "dropout2"), slots, context,
                         prefix)  # fmt: skip
    if attend is None or feed_forward is None or parts is None:
        return None
    norm1, norm2, dropout1, dropout2 = parts
    norm_first = module.norm_first

    def step(leaves, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        dtype = src.dtype
        padding = canonical_mask(src_key_padding_mask, dtype, "src_key_padding_mask")
        mask = canonical_mask(src_mask, dtype, "src_mask")
        x = src
        if norm_first:
            h = norm1(leaves, x)
            x = x + dropout1(leaves, attend(leaves, h, h, h, padding, False, mask, True,
                                            is_causal)[0])  # fmt: skip
            return x + dropout2(leaves, feed_forward(leaves, norm2(leaves, x)))
        x = norm1(leaves, x + dropout1(leaves, attend(leaves, x, x, x, padding, False, mask,
                                                       True, is_causal)[0]))  # fmt: skip
        return norm2(leaves, x + dropout2(leaves, feed_forward(leaves, x)))

    return step


def decoder_layer_step(module: nn.Module, slots: dict, context: BatchContext, prefix: str = ""):
    """The batched ``nn.TransformerDecoderLayer`` at ``prefix``, or None."""
    if type(module) is not nn.TransformerDecoderLayer:
        return None
    self_attend = attention_step(module.self_attn, slots, context, f"{prefix}self_attn.")
    cross_attend = attention_step(module.multihead_attn, slots, context,
                                  f"{prefix}multihead_attn.")  # fmt: skip
    feed_forward = _feed_forward(module, slots, context, prefix)
    names = ("norm1", "norm2", "norm3", "dropout1", "dropout2", "dropout3")
    parts = _block_parts(module, names, slots, context, prefix)
    if None in (self_attend, cross_attend, feed_forward, parts):
        return None
    norm1, norm2, norm3, dropout1, dropout2, dropout3 = parts
    norm_first = module.norm_first

    def step(leaves, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
             memory_key_padding_mask=None, tgt_is_causal=False,
             memory_is_causal=False):  # fmt: skip
        def self_block(x):
            out = self_attend(leaves, x, x, x, tgt_key_padding_mask, False, tgt_mask, True,
                              tgt_is_causal)[0]  # fmt: skip
            return dropout1(leaves, out)

        def cross_block(x):
            out = cross_attend(leaves, x, memory, memory, memory_key_padding_mask, False,
                               memory_mask, True, memory_is_causal)[0]  # fmt: skip
            return dropout2(leaves, out)

        x = tgt
        if norm_first:
            x = x + self_block(norm1(leaves, x))
            x = x + cross_block(norm2(leaves, x))
            return x + dropout3(leaves, feed_forward(leaves, norm3(leaves, x)))
        x = norm1(leaves, x + self_block(x))
        x = norm2(leaves, x + cross_block(x))
        return norm3(leaves, x + dropout3(leaves, feed_forward(leaves, x)))

    return step


# what the layer table says makes each planner return None (then vmap runs the module)
_UNKNOWN_ACTIVATION = "an activation function not known to act elementwise"
_LAYER_FALLS_BACK = "a layer that falls back"


@register_planner(nn.TransformerEncoderLayer, falls_back=_UNKNOWN_ACTIVATION)
def _encoder_layer(module: nn.Module, slots: dict, context: BatchContext):
    return encoder_layer_step(module, slots, context)


@register_planner(nn.TransformerDecoderLayer, falls_back=_UNKNOWN_ACTIVATION)
def _decoder_layer(module: nn.Module, slots: dict, context: BatchContext):
    return decoder_layer_step(module, slots, context)


def _final_norm(module: nn.Module, slots: dict, context: BatchContext) -> Callable | None:
    """The stack's final ``norm`` (identity when there is none), or None."""
    if module.norm is None:
        return lambda leaves, x: x
    return _part(module, "norm", slots, context, "")


def _layer_steps(module: nn.Module, build: Callable, slots: dict, context: BatchContext):
    steps = tuple(
        build(layer, slots, context, f"layers.{index}.")
        for index, layer in enumerate(module.layers)
    )
    return None if None in steps else steps


@register_planner(nn.TransformerEncoder, falls_back=_LAYER_FALLS_BACK)
def _encoder(module: nn.Module, slots: dict, context: BatchContext):
    steps = _layer_steps(module, encoder_layer_step, slots, context)
    norm = _final_norm(module, slots, context)
    if steps is None or norm is None or not steps:
        return None
    first = [position for name, position in slots.items() if name.startswith("layers.0.")]
    batch_first = module.layers[0].self_attn.batch_first

    def step(leaves, src, mask=None, src_key_padding_mask=None, is_causal=None):
        dtype = src.dtype
        padding = canonical_mask(src_key_padding_mask, dtype, "src_key_padding_mask")
        mask = canonical_mask(mask, dtype, "mask")
        causal = causal_hint(is_causal, mask, src, batch_first)
        dropped = _dropped_padding(module, leaves, first, src, padding, mask)
        if dropped is not None:
            padding = torch.where(dropped, float("-inf"), padding)
        output = src
        for layer in steps:
            output = layer(leaves, output, mask, padding, causal)
        if dropped is not None:
            output = output.masked_fill(_at_positions(module, dropped), 0.0)
        return norm(leaves, output)

    return step


def causal_hint(hint, mask, x: torch.Tensor, batch_first: bool) -> bool:
    """A stack's causal hint; ``None`` asks, as in torch, whether ``mask`` is causal.

    A mask found causal becomes the hint, and the hint gives what the mask itself
    gives, so the (data-dependent) comparison is made only where the outcome differs:
    a float mask of another dtype than the input, which attention refuses unless the
    hint replaces it. ``mask``: member-leading, ``[N, T, T]`` for one mask per member.
    """
    if hint is not None or mask is None or mask.dtype in (x.dtype, torch.bool):
        return bool(hint)
    length = x.shape[2] if batch_first and x.dim() == 4 else x.shape[1]
    if mask.dim() != 3 or tuple(mask.shape[1:]) != (length, length):
        return False
    causal = nn.Transformer.generate_square_subsequent_mask(length, mask.device, mask.dtype)
    return bool((mask == causal).all())


def _dropped_padding(module, leaves, first, src, padding, mask):
    """Where torch's nested-tensor path would drop padded positions (boolean
    ``[N, B, S]``), or None when it would not run (see the module docstring)."""
    if (
        padding is None
        or mask is not None
        or not getattr(module, "use_nested_tensor", False)
        or not torch.backends.mha.get_fastpath_enabled()
        or module.layers[0].training
        or src.dim() != 4
        or torch.is_autocast_enabled()
        or src.is_nested
    ):
        return None
    if torch.is_grad_enabled() and (
        src.requires_grad or any(leaves[position].requires_grad for position in first)
    ):
        return None
    check = getattr(module, "mask_check", True)
    if check and compiling():
        return None
    padded = padding != 0  # torch keeps exactly the zeros of a float mask
    if not check:
        return padded
    # Padding only at the end of each sequence, per member (else torch keeps the mask).
    kept = ~padded
    aligned = (kept[..., 1:] <= kept[..., :-1]).flatten(1).all(1)
    return padded & aligned.view(-1, 1, 1)


def _at_positions(module: nn.Module, dropped: torch.Tensor) -> torch.Tensor:
    """``[N, B, S]`` positions as a mask over the stack's output ``[N, B, S, E]`` (or
    ``[N, S, B, E]`` for sequence-first layers)."""
    if module.layers[0].self_attn.batch_first:
        return dropped.unsqueeze(-1)
    return dropped.transpose(1, 2).unsqueeze(-1)


@register_planner(nn.TransformerDecoder, falls_back=_LAYER_FALLS_BACK)
def _decoder(module: nn.Module, slots: dict, context: BatchContext):
    steps = _layer_steps(module, decoder_layer_step, slots, context)
    norm = _final_norm(module, slots, context)
    if steps is None or norm is None or not steps:
        return None
    batch_first = module.layers[0].self_attn.batch_first

    def step(leaves, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
             memory_key_padding_mask=None, tgt_is_causal=None,
             memory_is_causal=False):  # fmt: skip
        causal = causal_hint(tgt_is_causal, tgt_mask, tgt, batch_first)
        output = tgt
        for layer in steps:
            output = layer(leaves, output, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                           memory_key_padding_mask, causal, memory_is_causal)  # fmt: skip
        return norm(leaves, output)

    return step


@register_planner(nn.Transformer, falls_back=f"a custom encoder or decoder, {_LAYER_FALLS_BACK}")
def _transformer(module: nn.Module, slots: dict, context: BatchContext):
    # torch's forward is the encoder's stack and then the decoder's, each with its
    # final norm: their steps, chained, with the two checks torch makes first.
    parts = (
        (_encoder, module.encoder, nn.TransformerEncoder, "encoder."),
        (_decoder, module.decoder, nn.TransformerDecoder, "decoder."),
    )
    if any(type(child) is not kind for _, child, kind, _ in parts):
        return None  # a custom encoder or decoder: its own forward, left to vmap
    encode, decode = (build(child, _under(slots, prefix), context)
                      for build, child, _, prefix in parts)  # fmt: skip
    if encode is None or decode is None:
        return None
    d_model, batch = module.d_model, 1 if module.batch_first else 2

    def step(leaves, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
             src_key_padding_mask=None, tgt_key_padding_mask=None,
             memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
             memory_is_causal=False):  # fmt: skip
        # member-leading: a batched member input is 4-D, its batch dim one further on
        if src.dim() == 4 and src.size(batch) != tgt.size(batch):
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.size(-1) != d_model or tgt.size(-1) != d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = encode(leaves, src, src_mask, src_key_padding_mask, src_is_causal)
        return decode(leaves, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                      memory_key_padding_mask, tgt_is_causal, memory_is_causal)  # fmt: skip

    return step


for _planner in (_encoder_layer, _decoder_layer, _encoder, _decoder, _transformer):
    _planner.subtree = True  # type: ignore[attr-defined]  # gets its submodules' tensors
del _planner
