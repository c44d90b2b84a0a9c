"""``nn.MultiheadAttention`` in an ensemble against a loop over ordinary modules."""

from __future__ import annotations

import itertools

import pytest
import torch
from attention_loop import check
from member_loop import members
from torch import nn

from tdfunc import Ensemble

N, B, L, S, E, H = 3, 2, 5, 4, 8, 2


def attention(**options):
    return members(lambda: nn.MultiheadAttention(E, H, **options), N)


def inputs(batch_first, unbatched=False, cross=False):
    def make(length, features=E):
        if unbatched:
            return torch.randn(length, features)
        return torch.randn(B, length, features) if batch_first else torch.randn(length, B, features)

    query = make(L)
    if not cross:
        return query, query, query
    return query, make(S), make(S)


# every option once against the most common call; pairs below
_OPTIONS = [
    {},
    {"bias": False},
    {"add_bias_kv": True},
    {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True, "bias": False},
    {"dropout": 0.3},  # inactive in eval, explicit in training (checked below)
]


@pytest.mark.parametrize("options", _OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_options(options, batch_first, need_weights, cross):
    models = attention(batch_first=batch_first, **options)
    train = "dropout" not in options
    args = inputs(batch_first, cross=cross)
    check(models, args, {"need_weights": need_weights}, train=train)


@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("unbatched", [False, True])
def test_weights_per_head_and_unbatched(average, unbatched):
    models = attention(batch_first=True)
    _, (_, weights) = check(models, inputs(True, unbatched), {"average_attn_weights": average})
    per_member = (L, L) if unbatched else (B, L, L)
    heads = () if average else (H,)
    assert weights.shape == (N, *per_member[:-2], *heads, *per_member[-2:])


@pytest.mark.parametrize("need_weights", [True, False])
def test_kdim_vdim_separate_projections(need_weights):
    models = members(lambda: nn.MultiheadAttention(E, H, kdim=5, vdim=3, batch_first=True), N)
    args = (torch.randn(B, L, E), torch.randn(B, S, 5), torch.randn(B, S, 3))
    check(models, args, {"need_weights": need_weights})
    same = members(lambda: nn.MultiheadAttention(E, H, kdim=5, vdim=5, batch_first=True), N)
    memory = torch.randn(B, S, 5)
    check(same, (args[0], memory, memory), {"need_weights": need_weights}, train=False)


def test_key_is_value_shares_one_projection():
    models = attention(batch_first=True)
    query, memory = torch.randn(B, L, E), torch.randn(B, S, E)
    check(models, (query, memory, memory), {"need_weights": False})


def _causal(length):
    return torch.triu(torch.ones(length, length, dtype=torch.bool), 1)


_MASKS = {
    "none": lambda: {},
    "padding_bool": lambda: {"key_padding_mask": torch.tensor([[0, 0, 1, 1, 0], [0] * 5]).bool()},
    "padding_float": lambda: {"key_padding_mask": torch.randn(B, L)},
    "causal_bool": lambda: {"attn_mask": _causal(L)},
    "causal_float": lambda: {"attn_mask": nn.Transformer.generate_square_subsequent_mask(L)},
    "causal_hint": lambda: {"attn_mask": _causal(L), "is_causal": True},
    "per_sample_3d": lambda: {"attn_mask": torch.rand(B * H, L, L) > 0.7},
    "both": lambda: {
        "attn_mask": torch.randn(L, L),
        "key_padding_mask": torch.tensor([[0, 0, 0, 0, 1], [0, 1, 0, 0, 0]]).float() * -1e9,
    },
}


@pytest.mark.parametrize("mask", list(_MASKS))
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("options", [{}, {"add_bias_kv": True, "add_zero_attn": True}],
                         ids=["plain", "extra_keys"])  # fmt: skip
def test_shared_masks(mask, need_weights, options):
    models = attention(batch_first=True, **options)
    kwargs = {"need_weights": need_weights, **_MASKS[mask]()}
    check(models, inputs(True), kwargs)


@pytest.mark.parametrize("which", ["key_padding_mask", "attn_mask_2d", "attn_mask_3d"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_per_member_masks(which, need_weights):
    """A mask that differs per member enters positionally with in_dims=0."""
    models = attention(batch_first=True)
    x = torch.randn(B, L, E)
    if which == "key_padding_mask":
        mask = torch.rand(N, B, L) > 0.6
        mask[..., 0] = False  # no row fully masked
        args, dims = (x, x, x, mask, need_weights), (None, None, None, 0, None)
    else:
        shape = (N, L, L) if which == "attn_mask_2d" else (N, B * H, L, L)
        mask = torch.randn(shape)
        args, dims = (x, x, x, None, need_weights, mask), (None, None, None, None, None, 0)
    check(models, args, in_dims=dims)


def test_per_member_inputs():
    models = attention(batch_first=False)
    query, key = torch.randn(N, L, B, E), torch.randn(N, S, B, E)
    check(models, (query, key, key), {"need_weights": False}, in_dims=0)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_eval_and_no_grad(train, grad):
    models = attention(batch_first=True)
    check(models, inputs(True), {"need_weights": False}, train=train, grad=grad)


def test_none_output_passes_through_and_mask_errors():
    ensemble = Ensemble(*attention(batch_first=True))
    x = torch.randn(B, L, E)
    out, weights = ensemble(x, x, x, need_weights=False)
    assert weights is None and out.shape == (N, B, L, E)
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        ensemble(x, x, x, is_causal=True)
    with pytest.raises(TypeError, match="only bool and floating types of key_padding_mask"):
        ensemble(x, x, x, key_padding_mask=torch.zeros(B, L, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"should be \(5, 5\)"):
        ensemble(x, x, x, attn_mask=torch.zeros(4, 5))


def test_an_unsupported_configuration_runs_under_vmap_with_none_outputs():
    """A configuration without a batched form (a subclass) still gives the loop's answer."""

    class Subclass(nn.MultiheadAttention):
        pass

    models = members(lambda: Subclass(E, H, batch_first=True), N)
    ensemble, _ = check(models, inputs(True), {"need_weights": False}, batched=False)
    assert "vmapped" in ensemble.batched_summary


@pytest.mark.parametrize("randomness", ["different", "same"])
def test_attention_dropout_follows_randomness(randomness):
    torch.manual_seed(0)
    model = nn.MultiheadAttention(E, H, dropout=0.5, batch_first=True)
    ensemble = Ensemble(*[model] * N, randomness=randomness)  # equal members
    x = torch.randn(B, L, E)
    out, weights = ensemble(x, x, x, average_attn_weights=False)
    dropped = weights == 0
    assert dropped.any() and not dropped.all()
    if randomness == "same":
        assert torch.equal(dropped[0], dropped[1]) and torch.allclose(out[0], out[1])
    else:
        assert not torch.equal(dropped[0], dropped[1])
    # each member's weights are its softmax, dropped out and scaled by 1 / (1 - p)
    with torch.no_grad():
        _, full = model.eval()(x, x, x, average_attn_weights=False)
    kept = ~dropped
    torch.testing.assert_close(weights[kept], (full.expand_as(weights) * 2)[kept])


def test_attention_dropout_with_randomness_error_raises():
    ensemble = Ensemble(*attention(dropout=0.5), randomness="error")
    x = torch.randn(L, B, E)
    with pytest.raises(RuntimeError, match="randomness='error'"):
        ensemble(x, x, x)
    ensemble.eval()(x, x, x)  # no dropout in eval: nothing random runs


def test_all_option_pairs_in_eval_without_grad():
    """Pairs of options, in the mode where torch may take its fused inference kernel."""
    flags = ["bias", "add_bias_kv", "add_zero_attn", "batch_first"]
    for values in itertools.product([False, True], repeat=len(flags)):
        options = dict(zip(flags, values))
        models = attention(**options)
        check(models, inputs(options["batch_first"]), {"need_weights": False}, train=False,
              grad=False)  # fmt: skip


def test_switching_between_train_and_eval_keeps_the_derived_weights_right():
    """Each mode has its plan; both read the ensemble's views of the stacked weights."""
    models = attention(batch_first=True)
    ensemble = Ensemble(*models)
    query, memory = torch.randn(B, L, E), torch.randn(B, S, E)
    for mode in (True, False, True, False):
        ensemble.train(mode)
        out, _ = ensemble(query, memory, memory)
        expected = torch.stack([m.train(mode)(query, memory, memory)[0] for m in models])
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


def test_compiles_without_graph_breaks_and_exports():
    models = attention()
    ensemble = Ensemble(*models)
    q = torch.randn(L, B, E)
    expected = torch.stack([m(q, q, q, need_weights=False)[0] for m in models])
    torch._dynamo.reset()
    compiled = torch.compile(ensemble, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, q, q, need_weights=False)[0], expected)
    layers = members(lambda: nn.TransformerEncoderLayer(E, H, 16, 0.0, batch_first=True), N)
    x = torch.randn(B, L, E)
    exported = torch.export.export(Ensemble(*layers), (x,)).module()
    torch.testing.assert_close(exported(x), torch.stack([m(x) for m in layers]))
