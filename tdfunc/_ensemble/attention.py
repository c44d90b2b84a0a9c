"""Batched attention: ``nn.MultiheadAttention`` and ``F.scaled_dot_product_attention``.

``vmap`` has no batching rule for the fused attention kernel, so under ``vmap`` an
ensemble of attention layers runs slower than a loop. Here the members fold into
the batch dim of one attention call: the projections are ``baddbmm``s over the
stacked weights (``[N, B * L, E] @ [N, E, 3E]``), the heads of every member and
sample go through one ``scaled_dot_product_attention`` on ``[N * B, H, L, E / H]``.

The computation follows ``F.multi_head_attention_forward`` step by step (masks
turned into additive float masks, ``bias_k``/``bias_v`` appended to the keys and
values, ``add_zero_attn``, the key padding mask added to the attention mask, the
explicit softmax when the weights are returned), so each member's result is the
one its own module gives. Attention dropout draws its masks with the ensemble's
``randomness``, as the dropout layers do.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._core.helpers.tracing import compiling
from .layers import _random_error, row, transposed
from .registry import BatchContext, register_planner


def canonical_mask(mask, dtype: torch.dtype, name: str):
    """A boolean mask as the additive float mask torch's attention uses (``-inf`` where
    ``True``); a float mask as it is."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))
    if not mask.is_floating_point():
        raise TypeError(
            f"Ensemble: only bool and floating types of {name} are supported, got {mask.dtype}."
        )
    return mask


def _one_for_all(tensor: torch.Tensor) -> torch.Tensor:
    """A member-leading tensor shared by the members (expanded: stride 0) as ``[1, ...]``,
    so that it broadcasts instead of being copied once per member."""
    if tensor.shape[0] > 1 and tensor.stride(0) == 0:
        return tensor[:1]
    return tensor


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are one tensor, or views of one memory with one layout (an input
    shared by the members, expanded once per argument)."""
    if a is b:
        return True
    if compiling():  # reading the views' base would break the graph
        return False
    base = a._base
    return (
        base is not None
        and base is b._base
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def _project(x: torch.Tensor, weight_t: torch.Tensor, bias_row) -> torch.Tensor:
    """``x @ W^T + b`` per member: ``x`` ``[N, ..., in]``, ``weight_t`` ``[N, in, out]``."""
    shape = x.shape
    flat = x.reshape(shape[0], -1, shape[-1])
    out = torch.bmm(flat, weight_t) if bias_row is None else torch.baddbmm(bias_row, flat, weight_t)
    return out.view(*shape[:-1], out.shape[-1])


class _Rows:
    """The derivation of rows ``start:stop`` of a packed projection: the weight's rows
    transposed, or the bias's as a row. Equal for equal rows, so the plans of the train
    and eval modes share the ensemble's derived leaves instead of each adding its own,
    also in a copy; a class of the module, so an ensemble that holds it pickles."""

    __slots__ = ("bias", "start", "stop")

    def __init__(self, start: int, stop: int, bias: bool) -> None:
        self.start, self.stop, self.bias = start, stop, bias

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        rows = tensor[:, self.start : self.stop]
        return rows.unsqueeze(1) if self.bias else rows.mT

    def __eq__(self, other: object) -> bool:
        return type(other) is _Rows and (self.start, self.stop, self.bias) == (
            other.start,
            other.stop,
            other.bias,
        )

    def __hash__(self) -> int:
        return hash((self.start, self.stop, self.bias))

    def __reduce__(self):
        return _Rows, (self.start, self.stop, self.bias)


def _slice_rows(start: int, stop: int) -> tuple[_Rows, _Rows]:
    """Derivations of rows ``start:stop`` of a packed projection (weight, bias)."""
    return _Rows(start, stop, False), _Rows(start, stop, True)


def attention_dropout(weights: torch.Tensor, p: float, context: BatchContext) -> torch.Tensor:
    """Dropout on member-leading attention weights with the ensemble's ``randomness``."""
    randomness = context.randomness
    if randomness == "different":
        return F.dropout(weights, p, True)
    if randomness == "same":  # one mask for every member
        return weights * F.dropout(torch.ones_like(weights[0]), p, True)
    raise _random_error()


class _Attention:
    """The batched forward of one ``nn.MultiheadAttention`` (``slots`` prefixed by ``prefix``)."""

    def __init__(self, module: nn.MultiheadAttention, slots: dict, context: BatchContext,
                 prefix: str = "") -> None:  # fmt: skip
        self.module = module
        self.context = context
        embed = module.embed_dim
        self.embed, self.heads = embed, module.num_heads
        self.head_dim = embed // module.num_heads

        def position(name):
            return slots.get(prefix + name)

        packed, bias = position("in_proj_weight"), position("in_proj_bias")
        self.packed = packed is not None
        if self.packed:
            self.w_qkv = context.derived(transposed, packed)
            self.w_kv = context.derived(_slice_rows(embed, 3 * embed)[0], packed)
            self.w_q, self.w_k, self.w_v = (
                context.derived(_slice_rows(i * embed, (i + 1) * embed)[0], packed)
                for i in range(3)
            )
        else:
            self.w_q, self.w_k, self.w_v = (
                context.derived(transposed, position(f"{n}_proj_weight")) for n in "qkv"
            )
        self.b_qkv = self.b_kv = self.b_q = self.b_k = self.b_v = None
        if bias is not None:
            self.b_qkv = context.derived(row, bias)
            self.b_kv = context.derived(_slice_rows(embed, 3 * embed)[1], bias)
            self.b_q, self.b_k, self.b_v = (
                context.derived(_slice_rows(i * embed, (i + 1) * embed)[1], bias) for i in range(3)
            )
        self.bias_k, self.bias_v = position("bias_k"), position("bias_v")
        self.w_out = context.derived(transposed, position("out_proj.weight"))
        out_bias = position("out_proj.bias")
        self.b_out = None if out_bias is None else context.derived(row, out_bias)

    def __call__(self, leaves, query, key, value, key_padding_mask=None, need_weights=True,
                 attn_mask=None, average_attn_weights=True, is_causal=False):  # fmt: skip
        module = self.module
        per_member = query.dim() - 1
        if per_member not in (2, 3):
            raise ValueError(
                f"MultiheadAttention: query should be unbatched 2D or batched 3D per member, "
                f"got {per_member}D (the ensemble adds the member dim in front)."
            )
        unbatched = per_member == 2
        if query.shape[-1] != self.embed:
            raise ValueError(
                f"MultiheadAttention: was expecting embedding dimension of {self.embed}, but "
                f"got {query.shape[-1]}."
            )
        self_attention = same_values(query, key) and same_values(key, value)
        key_is_value = self_attention or same_values(key, value)
        # one layout from here on: [N, B, L, E]
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(1)
        elif not module.batch_first:
            query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        dtype = query.dtype
        key_padding_mask = canonical_mask(key_padding_mask, dtype, "key_padding_mask")
        if is_causal and attn_mask is None:
            raise RuntimeError(
                "MultiheadAttention: Need attn_mask if specifying the is_causal hint. You may "
                "use the Transformer module method `generate_square_subsequent_mask` to "
                "create this mask."
            )
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None  # the causal hint replaces the mask, as in torch
        else:
            attn_mask = canonical_mask(attn_mask, dtype, "attn_mask")
            if key_padding_mask is not None:
                is_causal = False
        n, batch, length, _ = query.shape
        heads, head_dim = self.heads, self.head_dim
        mask = None
        if attn_mask is not None:
            mask = self.attn_mask(attn_mask, batch, length, key.shape[2])
        if self.packed and self_attention and self.bias_k is None:
            # the common case in few ops: [N * B, L, 3, H, E / H] viewed as q, k, v.
            # Unbound before the heads are transposed: the backward then stacks the three
            # gradients straight into the projection's layout (transposed first, the
            # stacked gradient would be copied once more to reach it).
            flat = query.reshape(n, batch * length, query.shape[-1])
            if self.b_qkv is None:
                qkv = torch.bmm(flat, leaves[self.w_qkv])
            else:
                qkv = torch.baddbmm(leaves[self.b_qkv], flat, leaves[self.w_qkv])
            q, k, v = qkv.view(n * batch, length, 3, heads, head_dim).unbind(2)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        else:
            q, k, v = self.project(leaves, query, key, value, self_attention, key_is_value)
            if self.bias_k is not None and self.bias_v is not None:
                k = torch.cat([k, leaves[self.bias_k].expand(n, batch, 1, -1)], 2)
                v = torch.cat([v, leaves[self.bias_v].expand(n, batch, 1, -1)], 2)
                mask = None if mask is None else F.pad(mask, (0, 1))
                if key_padding_mask is not None:
                    key_padding_mask = F.pad(key_padding_mask, (0, 1))
            # [N * B, H, L, E / H]: every member's heads in the batch dims of one attention
            q = q.reshape(n * batch, length, heads, head_dim).transpose(1, 2)
            k = k.reshape(n * batch, k.shape[2], heads, head_dim).transpose(1, 2)
            v = v.reshape(n * batch, v.shape[2], heads, head_dim).transpose(1, 2)
        if module.add_zero_attn:
            zeros = k.new_zeros(n * batch, heads, 1, head_dim)
            k, v = torch.cat([k, zeros], 2), torch.cat([v, zeros], 2)
            mask = None if mask is None else F.pad(mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask, (0, 1))
        if key_padding_mask is not None:
            padding = _one_for_all(key_padding_mask)
            if tuple(padding.shape[1:]) != (batch, k.shape[2]):
                raise ValueError(
                    f"MultiheadAttention: expected key_padding_mask of shape "
                    f"{(batch, k.shape[2] - (self.bias_k is not None) - module.add_zero_attn)} "
                    f"per member, got {tuple(key_padding_mask.shape[1:])}."
                )
            padding = padding[:, :, None, None, :]
            mask = padding if mask is None else mask + padding
        dropout = module.dropout if module.training else 0.0
        if need_weights or dropout > 0.0:
            out, weights = self.explicit(q, k, v, mask, dropout, n, batch)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, _folded(mask, n, batch), 0.0, bool(is_causal)
            )
            weights = None
        # [N, B * L, E] for the output projection
        out = out.transpose(1, 2).reshape(n, batch * length, self.embed)
        if self.b_out is None:
            out = torch.bmm(out, leaves[self.w_out])
        else:
            out = torch.baddbmm(leaves[self.b_out], out, leaves[self.w_out])
        out = out.view(n, batch, length, self.embed)
        if weights is not None:
            weights = weights.view(n, batch, heads, length, weights.shape[-1])
            if average_attn_weights:
                weights = weights.mean(dim=2)
            if not need_weights:
                weights = None
            elif unbatched:
                weights = weights.squeeze(1)
        if unbatched:
            return out.squeeze(1), weights
        return (out if module.batch_first else out.transpose(1, 2)), weights

    def project(self, leaves, query, key, value, self_attention: bool, key_is_value: bool):
        def read(position):
            return None if position is None else leaves[position]

        if self.packed and self_attention:
            qkv = _project(query, leaves[self.w_qkv], read(self.b_qkv))
            return qkv.chunk(3, -1)
        q = _project(query, leaves[self.w_q], read(self.b_q))
        if self.packed and key_is_value:
            k, v = _project(key, leaves[self.w_kv], read(self.b_kv)).chunk(2, -1)
            return q, k, v
        k = _project(key, leaves[self.w_k], read(self.b_k))
        v = _project(value, leaves[self.w_v], read(self.b_v))
        return q, k, v

    def attn_mask(self, mask: torch.Tensor, batch: int, length: int, source: int) -> torch.Tensor:
        """A per-member ``[L, S]`` or ``[B * H, L, S]`` mask as ``[N | 1, B | 1, H | 1, L, S]``."""
        mask = _one_for_all(mask)
        if mask.dim() == 3:
            if tuple(mask.shape[1:]) != (length, source):
                raise RuntimeError(
                    f"MultiheadAttention: The shape of the 2D attn_mask is "
                    f"{tuple(mask.shape[1:])} per member, but should be {(length, source)}."
                )
            return mask[:, None, None]
        if mask.dim() == 4:
            if tuple(mask.shape[1:]) != (batch * self.heads, length, source):
                raise RuntimeError(
                    f"MultiheadAttention: The shape of the 3D attn_mask is "
                    f"{tuple(mask.shape[1:])} per member, but should be "
                    f"{(batch * self.heads, length, source)}."
                )
            return mask.view(mask.shape[0], batch, self.heads, length, source)
        raise RuntimeError(
            f"MultiheadAttention: attn_mask's dimension {mask.dim() - 1} (per member) is not "
            f"supported."
        )

    def explicit(self, q, k, v, mask, dropout: float, n: int, batch: int):
        """Softmax attention written out (the weights are returned, or dropped out with
        the ensemble's randomness), as torch does when it returns the weights."""
        heads = self.heads
        rows = n * batch * heads
        q = (q * math.sqrt(1.0 / float(self.head_dim))).reshape(rows, q.shape[2], q.shape[3])
        k_t = k.reshape(rows, k.shape[2], k.shape[3]).mT
        if mask is None:
            weights = torch.bmm(q, k_t)
        else:
            full = mask.expand(n, batch, heads, *mask.shape[3:])
            weights = torch.baddbmm(full.reshape(rows, *mask.shape[3:]), q, k_t)
        weights = torch.softmax(weights, dim=-1)
        if dropout > 0.0:
            dropped = attention_dropout(weights.view(n, -1, *weights.shape[1:]), dropout,
                                        self.context)  # fmt: skip
            dropped = dropped.view(weights.shape)
        else:
            dropped = weights
        out = torch.bmm(dropped, v.reshape(rows, v.shape[2], v.shape[3]))
        return out.view(n * batch, heads, out.shape[1], out.shape[2]), dropped


def _folded(mask, n: int, batch: int):
    """An ``[N | 1, B | 1, H | 1, L | 1, S]`` mask for attention over ``[N * B, H, L, S]``."""
    if mask is None:
        return None
    if mask.shape[0] == 1 and mask.shape[1] == 1:
        return mask[0]
    return mask.expand(n, batch, *mask.shape[2:]).reshape(n * batch, *mask.shape[2:])


def attention_step(module: nn.MultiheadAttention, slots: dict, context: BatchContext,
                   prefix: str = ""):  # fmt: skip
    """The batched ``module(query, key, value, ...)``, or None for a configuration without one."""
    if type(module) is not nn.MultiheadAttention or module.embed_dim % module.num_heads:
        return None
    if (module.bias_k is None) != (module.bias_v is None):
        return None  # torch refuses this on every call
    if slots.get(prefix + "out_proj.weight") is None:
        return None
    return _Attention(module, slots, context, prefix)


@register_planner(nn.MultiheadAttention)
def _multihead_attention(module: nn.Module, slots: dict, context: BatchContext):
    attend = attention_step(module, slots, context)
    if attend is None:
        return None

    def step(leaves, *inputs, **kwargs):  # a function: what torch.fx can call by name
        return attend(leaves, *inputs, **kwargs)

    return step


_multihead_attention.subtree = True  # type: ignore[attr-defined]  # out_proj's tensors too


# ----------------------------------------------------- scaled_dot_product_attention
_SDPA_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
               "enable_gqa")  # fmt: skip


def folded_attention(batched: dict, context: BatchContext):
    """``F.scaled_dot_product_attention`` of a traced forward, on member-leading tensors.

    ``batched`` names the arguments that carry the member dim; the others are the
    same for every member. The members fold into the first batch dim of the query
    (``[N, B, H, L, E]`` runs as ``[N * B, H, L, E]``): one fused attention call.
    """

    def call(*args, **kwargs):
        values = dict(zip(_SDPA_NAMES, args))
        values.update(kwargs)
        query, key, value = values["query"], values["key"], values["value"]
        members = next(values[name].shape[0] for name in _SDPA_NAMES[:4] if batched.get(name))
        query, key, value = (
            t if batched.get(name) else t.expand(members, *t.shape)
            for name, t in (("query", query), ("key", key), ("value", value))
        )
        mask = values.get("attn_mask")
        if mask is not None:
            mask = _member_mask(mask, bool(batched.get("attn_mask")), query.dim() - 1)
        options = {k: values[k] for k in ("is_causal", "scale", "enable_gqa") if k in values}
        dropout = values.get("dropout_p", 0.0)
        if dropout and context.randomness != "different":
            if context.randomness == "error":
                raise _random_error()
            shared = mask is None or mask.shape[0] == 1
            return torch.func.vmap(  # one dropout mask for every member
                lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, dropout, **options),
                in_dims=(0, 0, 0, None if shared else 0),
                randomness="same",
            )(query, key, value, mask if not shared else None if mask is None else mask[0])
        if query.dim() < 4 or not query.dim() == key.dim() == value.dim():
            if mask is not None and mask.shape[0] == 1:
                mask = mask[0]  # the same mask for every member broadcasts as it is
            return F.scaled_dot_product_attention(query, key, value, mask, dropout, **options)
        n, batch = query.shape[0], query.shape[1]

        def fold(t):
            return t.reshape(n * t.shape[1], *t.shape[2:]) if t.shape[1] == batch else None

        q, k, v = fold(query), fold(key), fold(value)
        if k is None or v is None:  # batch dims broadcast between the operands
            if mask is not None and mask.shape[0] == 1:
                mask = mask[0]
            return F.scaled_dot_product_attention(query, key, value, mask, dropout, **options)
        out = F.scaled_dot_product_attention(q, k, v, _folded(mask, n, batch), dropout, **options)
        return out.view(n, batch, *out.shape[1:])

    call.__name__ = "folded_scaled_dot_product_attention"
    return call


def _member_mask(mask: torch.Tensor, batched: bool, rank: int) -> torch.Tensor:
    """A mask as ``[N | 1, ...]`` with ``rank`` dims after the member dim (singletons
    in front, as broadcasting would add them)."""
    if not batched:
        mask = mask.unsqueeze(0)
    mask = _one_for_all(mask)
    missing = rank - (mask.dim() - 1)
    if missing > 0:
        mask = mask.view(mask.shape[0], *(1,) * missing, *mask.shape[1:])
    return mask
