"""Attention in custom ``forward`` code (traced and rewritten) against a loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attention_loop import check
from member_loop import members
from torch import nn

from tdfunc import Ensemble

N, B, T, D, H = 3, 2, 5, 8, 2


class SelfAttention(nn.Module):
    """Attention written by hand around ``F.scaled_dot_product_attention``."""

    def __init__(self, causal=False, dropout=0.0, gqa=False) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)
        self.causal, self.dropout, self.gqa = causal, dropout, gqa

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, d // H).permute(2, 0, 3, 1, 4)
        if self.gqa:  # two query heads share one key/value head
            k, v = k[:, :1], v[:, :1]
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=self.causal,
            enable_gqa=self.gqa,
        )
        return self.out(y.transpose(1, 2).reshape(b, t, d))


_MASKS = {
    "none": lambda: None,
    "shared_2d": lambda: torch.randn(T, T),
    "shared_bool_4d": lambda: torch.rand(B, 1, T, T) > 0.3,
}


# torch refuses an explicit mask together with is_causal
@pytest.mark.parametrize(("mask", "causal"), [*((m, False) for m in _MASKS), ("none", True)])
def test_scaled_dot_product_attention(mask, causal):
    models = members(lambda: SelfAttention(causal), N)
    made = _MASKS[mask]()
    if made is not None and made.dtype == torch.bool:
        made[..., 0] = True  # no row fully masked
    args = (torch.randn(B, T, D),) if made is None else (torch.randn(B, T, D), made)
    ensemble, _ = check(models, args)
    assert ensemble.batched_summary == "2/2 layers batched"


def test_scaled_dot_product_attention_per_member_mask_and_gqa():
    models = members(lambda: SelfAttention(gqa=True), N)
    check(models, (torch.randn(B, T, D), torch.randn(N, T, T)), in_dims=(None, 0))
    check(models, (torch.randn(N, B, T, D),), in_dims=0, train=False)


def test_scaled_dot_product_attention_dropout_follows_randomness():
    torch.manual_seed(0)
    model = SelfAttention(dropout=0.5)
    x = torch.randn(B, T, D)
    assert not torch.allclose(*Ensemble(*[model] * 2)(x))
    torch.testing.assert_close(*Ensemble(*[model] * 2, randomness="same")(x))
    with pytest.raises(RuntimeError, match="randomness='error'"):
        Ensemble(*[model] * 2, randomness="error")(x)


class PaddedClassifier(nn.Module):
    """A mask given positionally, handed to the attention as a keyword."""

    def __init__(self, which: str) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)
        self.fc = nn.Linear(D, 1)
        self.which = which

    def forward(self, x, mask):
        if self.which == "padding":
            return self.fc(self.attn(x, x, x, key_padding_mask=mask)[0])
        return self.fc(self.attn(x, x, x, attn_mask=mask)[0])


def test_masks_given_positionally_reach_attention_as_keywords():
    x = torch.randn(B, T, D)
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, -2:] = True
    check(members(lambda: PaddedClassifier("padding"), N), (x, padding))
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    check(members(lambda: PaddedClassifier("attn"), N), (x, causal))
    per_member = torch.rand(N, T, T) > 0.5
    per_member[..., 0] = False
    check(members(lambda: PaddedClassifier("attn"), N), (x, per_member), in_dims=(None, 0))


class SequenceModel(nn.Module):
    """Tokens, a learned position table sliced by the sequence length, an encoder, a head."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, D)
        self.layout = layout
        self.pos = nn.Parameter(torch.randn(1, 16, D) if layout == "row" else torch.randn(16, D))
        layer = nn.TransformerEncoderLayer(D, H, 2 * D, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(D, 2)

    def forward(self, tokens):
        h = self.embed(tokens)
        if self.layout == "row":
            h = h + self.pos[:, : tokens.size(1)]
        else:
            t = tokens.shape[-1]
            h = h + self.pos[:t]
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(1))
        return self.head(self.encoder(h, mask=mask, is_causal=True)[:, -1])


@pytest.mark.parametrize("layout", ["row", "table"])
def test_position_table_sliced_by_sequence_length(layout):
    models = members(lambda: SequenceModel(layout), N)
    tokens = torch.randint(0, 11, (B, 7))
    ensemble, _ = check(models, (tokens,))
    assert ensemble.batched_summary == "3/3 layers batched"
    check(models, (torch.randint(0, 11, (B, 3)),), train=False)  # another length
