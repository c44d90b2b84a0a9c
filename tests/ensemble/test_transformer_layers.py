"""Transformer layers and stacks in an ensemble against a loop over ordinary modules."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from attention_loop import check
from member_loop import members
from torch import nn

from tdfunc import Ensemble

N, B, T, S, D, H = 3, 2, 5, 4, 8, 2


def _causal(length):
    return nn.Transformer.generate_square_subsequent_mask(length)


def _sequence(batch_first, length=T):
    return torch.randn(B, length, D) if batch_first else torch.randn(length, B, D)


def _padding():
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, -2:] = True  # padding at the end of one sequence
    return mask


_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "module": nn.GELU(), "silu": F.silu}


@pytest.mark.parametrize("activation", list(_ACTIVATIONS))
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer(activation, norm_first, batch_first):
    models = members(
        lambda: nn.TransformerEncoderLayer(D, H, 2 * D, dropout=0.0, batch_first=batch_first,
                                           norm_first=norm_first,
                                           activation=_ACTIVATIONS[activation]),
        N,
    )  # fmt: skip
    x = _sequence(batch_first)
    check(models, (x,))
    check(models, (x,), {"src_mask": _causal(T), "is_causal": True})
    check(models, (x,), {"src_key_padding_mask": _padding(), "src_mask": _causal(T)})


def test_encoder_layer_with_bias_off_and_dropout_in_eval():
    models = members(lambda: nn.TransformerEncoderLayer(D, H, 16, bias=False, batch_first=True), N)
    check(models, (_sequence(True),), train=False)


@pytest.mark.parametrize("grad", [True, False])
def test_encoder_layer_in_eval_mode_backpropagates(grad):
    """In eval mode with gradients the loop runs torch's differentiable path; without
    gradients torch's fused inference kernel: the ensemble matches both."""
    models = members(lambda: nn.TransformerEncoderLayer(D, H, 16, batch_first=True), N)
    x = _sequence(True)
    check(models, (x,), {"src_key_padding_mask": _padding()}, train=False, grad=grad)


def test_encoder_layer_under_vmap_fallback_backpropagates_in_eval():
    """A layer left to vmap (a subclass) in eval mode with gradients: torch's inference
    kernel (no backward) must not be taken where the loop does not take it."""

    class Layer(nn.TransformerEncoderLayer):
        pass

    models = members(lambda: Layer(D, H, 16, batch_first=True), N)
    ensemble, _ = check(models, (_sequence(True),), train=False, batched=False)
    assert "vmapped" in ensemble.batched_summary
    assert torch.backends.mha.get_fastpath_enabled()  # restored


def test_unknown_activation_function_falls_back_with_the_same_answer():
    models = members(
        lambda: nn.TransformerEncoderLayer(D, H, 16, 0.0, lambda x: x * torch.sigmoid(x)),
        N,
    )
    ensemble, _ = check(models, (_sequence(False),), batched=False)
    assert "vmapped" in ensemble.batched_summary


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_decoder_layer(norm_first, batch_first):
    models = members(
        lambda: nn.TransformerDecoderLayer(D, H, 16, dropout=0.0, batch_first=batch_first,
                                           norm_first=norm_first),
        N,
    )  # fmt: skip
    tgt, memory = _sequence(batch_first), _sequence(batch_first, S)
    check(models, (tgt, memory))
    memory_padding = torch.zeros(B, S, dtype=torch.bool)
    memory_padding[1, -1] = True
    kwargs = {
        "tgt_mask": _causal(T),
        "tgt_is_causal": True,
        "memory_key_padding_mask": memory_padding,
        "tgt_key_padding_mask": _padding(),
    }
    check(models, (tgt, memory), kwargs)
    check(models, (tgt, memory), kwargs, train=False, grad=False)


@pytest.mark.parametrize("final_norm", [False, True])
def test_encoder_stack(final_norm):
    def make():
        layer = nn.TransformerEncoderLayer(D, H, 16, dropout=0.0, batch_first=True)
        norm = nn.LayerNorm(D) if final_norm else None
        return nn.TransformerEncoder(layer, 2, norm=norm, enable_nested_tensor=False)

    models = members(make, N)
    x = _sequence(True)
    check(models, (x,))
    check(models, (x,), {"mask": _causal(T)})  # detected as causal by torch
    check(models, (x,), {"mask": _causal(T), "src_key_padding_mask": _padding()}, train=False)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("aligned", [True, False])
def test_encoder_stack_with_nested_tensors_in_inference(grad, aligned):
    """torch's default ``enable_nested_tensor``: in eval mode without gradients a stack
    given a padding mask drops the padded positions and returns zeros there."""

    def make():
        layer = nn.TransformerEncoderLayer(D, H, 16, batch_first=True)
        return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(D))

    models = members(make, N)
    padding = _padding()
    if not aligned:
        padding[1, 1] = True  # padding inside a sequence: torch keeps the mask
    _, out = check(models, (_sequence(True),), {"src_key_padding_mask": padding}, train=False,
                   grad=grad)  # fmt: skip
    assert out.isfinite().all()


def test_per_member_padding_masks_in_a_stack():
    def make():
        layer = nn.TransformerEncoderLayer(D, H, 16, batch_first=True)
        return nn.TransformerEncoder(layer, 2)

    models = members(make, N)
    padding = torch.zeros(N, B, T, dtype=torch.bool)
    padding[0, 0, -1] = padding[2, 1, -3:] = True
    padding[1, 0, 2] = True  # one member's mask not at the end
    x = _sequence(True)
    check(models, (x, None, padding), in_dims=(None, None, 0), train=False, grad=False)
    check(models, (x, None, padding), in_dims=(None, None, 0), train=False)


def test_decoder_stack():
    def make():
        layer = nn.TransformerDecoderLayer(D, H, 16, dropout=0.0)
        return nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(D))

    models = members(make, N)
    tgt, memory = _sequence(False), _sequence(False, S)
    check(models, (tgt, memory), {"tgt_mask": _causal(T)})
    check(models, (tgt, memory), {"tgt_mask": _causal(T), "tgt_is_causal": True}, train=False)


def test_dropout_layers_follow_randomness():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, H, 16, dropout=0.5, batch_first=True)
    x = _sequence(True)
    same = Ensemble(*[layer] * N, randomness="same")(x)
    torch.testing.assert_close(same[0], same[2])
    different = Ensemble(*[layer] * N)(x)
    assert not torch.allclose(different[0], different[2])
    with pytest.raises(RuntimeError, match="randomness='error'"):
        Ensemble(*[layer] * N, randomness="error")(x)
    torch.testing.assert_close(Ensemble(*[layer] * N).eval()(x)[1], layer.eval()(x))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_steps_in_train_and_eval_match_the_loop(optimizer):
    """Steps of torch.optim on the ensemble against one optimizer per member."""

    def make():
        layer = nn.TransformerEncoderLayer(D, H, 16, dropout=0.0, batch_first=True)
        return nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                             nn.Linear(D, 2))  # fmt: skip

    def optimize(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        # eps above rounding noise: the key bias's gradient is zero up to rounding (a
        # constant added to every key leaves the softmax unchanged), which Adam would
        # scale up to full steps of either sign
        return torch.optim.Adam(params, lr=0.01, eps=1e-4)

    models = members(make, N)
    ensemble = Ensemble(*[copy.deepcopy(m) for m in models])
    ensemble_optimizer = optimize(ensemble.parameters())
    loop_optimizers = [optimize(m.parameters()) for m in models]
    generator = torch.Generator().manual_seed(0)
    for step in range(6):
        train = step % 3 != 2
        ensemble.train(train)
        x = torch.randn(N, B, T, D, generator=generator)
        target = torch.randn(N, B, T, 2, generator=generator)
        ((ensemble(x, in_dims=0) - target) ** 2).mean((1, 2, 3)).sum().backward()
        for model, xi, ti in zip(models, x, target):
            model.train(train)
            ((model(xi) - ti) ** 2).mean().backward()
        for opt in (ensemble_optimizer, *loop_optimizers):
            opt.step()
            opt.zero_grad()
        for name, stacked in ensemble.named_parameters():
            expected = torch.stack([m.get_parameter(name[len("stacked.") :]) for m in models])
            torch.testing.assert_close(stacked, expected, atol=1e-5, rtol=1e-4, msg=name)
