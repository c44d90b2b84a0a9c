"""``nn.Transformer`` (encoder, decoder and their final norms) in an ensemble against a loop."""

from __future__ import annotations

import copy

import pytest
import torch
from attention_loop import check
from member_loop import members
from torch import nn

from tdfunc import Ensemble

N, B, S, T, D, H = 3, 2, 5, 4, 8, 2


def _causal(length):
    return nn.Transformer.generate_square_subsequent_mask(length)


def _model(batch_first=False, norm_first=False, dropout=0.0, **kwargs):
    return nn.Transformer(D, H, 2, 2, 16, dropout, batch_first=batch_first,
                          norm_first=norm_first, **kwargs)  # fmt: skip


def _pair(batch_first):
    src = torch.randn(B, S, D) if batch_first else torch.randn(S, B, D)
    tgt = torch.randn(B, T, D) if batch_first else torch.randn(T, B, D)
    return src, tgt


def _paddings():
    src_padding = torch.zeros(B, S, dtype=torch.bool)
    src_padding[0, -2:] = True  # at the end of one sequence
    tgt_padding = torch.zeros(B, T, dtype=torch.bool)
    tgt_padding[1, -1] = True
    return src_padding, tgt_padding


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_with_every_mask(batch_first, norm_first):
    models = members(lambda: _model(batch_first, norm_first), N)
    src, tgt = _pair(batch_first)
    check(models, (src, tgt))
    src_padding, tgt_padding = _paddings()
    memory_mask = torch.zeros(T, S)
    memory_mask[:, 0] = float("-inf")  # no target position reads the first source position
    kwargs = {
        "src_mask": _causal(S) > 0,  # boolean
        "tgt_mask": _causal(T),  # float
        "memory_mask": memory_mask,
        "src_key_padding_mask": src_padding,
        "tgt_key_padding_mask": tgt_padding,
        "memory_key_padding_mask": src_padding,
    }
    check(models, (src, tgt), kwargs)
    check(models, (src, tgt), kwargs, train=False)
    check(models, (src, tgt), kwargs, train=False, grad=False)


@pytest.mark.parametrize("train", [True, False])
def test_causal_hints(train):
    models = members(lambda: _model(True), N)
    src, tgt = _pair(True)
    kwargs = {"tgt_mask": _causal(T), "tgt_is_causal": True, "src_mask": _causal(S),
              "src_is_causal": True}  # fmt: skip
    check(models, (src, tgt), kwargs, train=train)
    # a detected causal mask (the hints left to None) gives what the mask gives
    check(models, (src, tgt), {"tgt_mask": _causal(T), "src_mask": _causal(S)}, train=train)


@pytest.mark.parametrize("grad", [True, False])
def test_eval_with_nested_tensor_encoder_drops_padding_as_torch(grad):
    """torch's encoder (``enable_nested_tensor``, batch first) returns zeros at padded
    positions in eval mode without gradients; the decoder then reads that memory."""
    models = members(lambda: _model(True), N)
    src, tgt = _pair(True)
    src_padding, _ = _paddings()
    kwargs = {"src_key_padding_mask": src_padding, "memory_key_padding_mask": src_padding}
    check(models, (src, tgt), kwargs, train=False, grad=grad)


def test_per_member_masks_and_inputs():
    models = members(lambda: _model(True), N)
    src = torch.randn(N, B, S, D)
    tgt = torch.randn(N, B, T, D)
    tgt_masks = torch.stack([_causal(T), torch.zeros(T, T), _causal(T).flip(0)])
    src_padding = torch.zeros(N, B, S, dtype=torch.bool)
    src_padding[1, 0, -1] = src_padding[2, 1, 1] = True
    args = (src, tgt, None, tgt_masks, None, src_padding)
    check(models, args, in_dims=(0, 0, None, 0, None, 0))
    check(models, args, in_dims=(0, 0, None, 0, None, 0), train=False, grad=False)


def test_unbatched_members_and_options():
    models = members(lambda: _model(False, True, activation="gelu", bias=False), N)
    check(models, (torch.randn(S, D), torch.randn(T, D)), {"tgt_mask": _causal(T)})


def test_float64():
    models = members(lambda: _model(True).double(), N)
    src, tgt = _pair(True)
    check(models, (src.double(), tgt.double()), {"tgt_mask": _causal(T).double()}, atol=1e-10)


def test_non_contiguous_inputs():
    models = members(lambda: _model(True), N)
    src = torch.randn(S, B, D).transpose(0, 1)
    tgt = torch.randn(D, T, B).permute(2, 1, 0)
    assert not src.is_contiguous() and not tgt.is_contiguous()
    check(models, (src, tgt), {"tgt_mask": _causal(T)})


def test_custom_encoder_falls_back_with_the_same_answer():
    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(D, D)

        def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
            return torch.tanh(self.linear(src))

    models = members(lambda: _model(True, custom_encoder=Encoder()), N)
    src, tgt = _pair(True)
    ensemble, _ = check(models, (src, tgt), batched=False)
    assert "vmapped" in ensemble.batched_summary


def test_refusals_are_torch_s():
    models = members(lambda: _model(True), N)
    ensemble = Ensemble(*models)
    src, tgt = _pair(True)
    for bad_src, bad_tgt, message in (
        (src[:1], tgt, "batch number of src and tgt"),
        (src[..., :-1], tgt, "feature number of src and tgt"),
    ):
        with pytest.raises(RuntimeError, match=message):
            models[0](bad_src, bad_tgt)
        with pytest.raises(RuntimeError, match=message):
            ensemble(bad_src, bad_tgt)


def test_dropout_follows_randomness():
    torch.manual_seed(0)
    model = _model(True, dropout=0.5)
    src, tgt = _pair(True)
    same = Ensemble(*[model] * N, randomness="same")(src, tgt)
    torch.testing.assert_close(same[0], same[2])
    different = Ensemble(*[model] * N)(src, tgt)
    assert not torch.allclose(different[0], different[2])
    with pytest.raises(RuntimeError, match="randomness='error'"):
        Ensemble(*[model] * N, randomness="error")(src, tgt)
    torch.testing.assert_close(Ensemble(*[model] * N).eval()(src, tgt)[1], model.eval()(src, tgt))


def test_one_dropout_layer_draws_what_the_loop_draws():
    """One random layer, drawn in the elements' logical order: the ensemble's masks are
    the loop's when each member draws from the same generator state in turn."""

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _model(True)
            self.drop = nn.Dropout(0.3)

        def forward(self, src, tgt):
            return self.drop(self.body(src, tgt))

    models = members(Head, N)
    ensemble = Ensemble(*copy.deepcopy(models))
    assert "vmapped" not in ensemble.batched_summary
    src, tgt = _pair(True)
    torch.manual_seed(7)
    out = ensemble(src, tgt)
    torch.manual_seed(7)
    # the members' masks are consecutive draws of one [N, B, T, D] mask
    mask = torch.nn.functional.dropout(torch.ones(N, B, T, D), 0.3)
    expected = torch.stack([m.body(src, tgt) for m in models]) * mask
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_steps_in_train_and_eval_match_the_loop(optimizer):
    def optimize(params):
        if optimizer == "sgd":
            return torch.optim.SGD(params, lr=0.05, momentum=0.9)
        # eps above rounding noise: the key bias's gradient is zero up to rounding
        return torch.optim.Adam(params, lr=0.01, eps=1e-4)

    models = members(lambda: _model(True), N)
    ensemble = Ensemble(*[copy.deepcopy(m) for m in models])
    ensemble_optimizer = optimize(ensemble.parameters())
    loop_optimizers = [optimize(m.parameters()) for m in models]
    generator = torch.Generator().manual_seed(0)
    for step in range(4):
        train = step % 2 == 0
        ensemble.train(train)
        src = torch.randn(N, B, S, D, generator=generator)
        tgt = torch.randn(N, B, T, D, generator=generator)
        target = torch.randn(N, B, T, D, generator=generator)
        out = ensemble(src, tgt, tgt_mask=_causal(T), in_dims=0)
        ((out - target) ** 2).mean((1, 2, 3)).sum().backward()
        for model, s, t, y in zip(models, src, tgt, target):
            model.train(train)
            ((model(s, t, tgt_mask=_causal(T)) - y) ** 2).mean().backward()
        for opt in (ensemble_optimizer, *loop_optimizers):
            opt.step()
            opt.zero_grad()
        for name, stacked in ensemble.named_parameters():
            expected = torch.stack([m.get_parameter(name[len("stacked.") :]) for m in models])
            torch.testing.assert_close(stacked, expected, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("index", [[2, 0], slice(1, None, 2), 1])
def test_selected_members_match_the_loop_and_train_their_own_rows(index):
    models = members(lambda: _model(True), N)
    ensemble = Ensemble(*copy.deepcopy(models))
    src, tgt = _pair(True)
    if isinstance(index, slice):
        chosen = list(range(N))[index]
    else:
        chosen = [index] if isinstance(index, int) else index
    out = ensemble[index](src, tgt, tgt_mask=_causal(T))
    expected = torch.stack([models[i](src, tgt, tgt_mask=_causal(T)) for i in chosen])
    torch.testing.assert_close(out, expected[0] if isinstance(index, int) else expected)
    out.sum().backward()
    grad = ensemble.get_parameter("stacked.decoder.norm.bias").grad
    touched = [i for i in range(N) if grad[i].abs().sum() > 0]
    assert touched == sorted(set(chosen))


def test_compiles_whole_with_aot_eager_and_trains():
    models = members(lambda: _model(True), N)
    ensemble = Ensemble(*copy.deepcopy(models))
    compiled = torch.compile(ensemble, backend="aot_eager", fullgraph=True)
    src, tgt = _pair(True)
    out = compiled(src, tgt, tgt_mask=_causal(T))
    expected = torch.stack([m(src, tgt, tgt_mask=_causal(T)) for m in models])
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    for name, stacked in ensemble.named_parameters():
        reference = torch.stack([m.get_parameter(name[len("stacked.") :]).grad for m in models])
        torch.testing.assert_close(stacked.grad, reference, atol=1e-5, rtol=1e-4, msg=name)


def test_a_sequence_entirely_padded_gives_torch_s_differentiable_answer():
    """torch's own layers disagree with themselves here: with gradients a fully padded
    sequence gives finite values, in eval mode without gradients the fused inference
    kernel gives NaN. The ensemble gives the differentiable path's values in both."""
    models = members(lambda: nn.TransformerEncoderLayer(D, H, 16, 0.0, batch_first=True), N)
    src, _ = _pair(True)
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[0] = True
    ensemble = Ensemble(*copy.deepcopy(models)).eval()
    with torch.no_grad():
        out = ensemble(src, src_key_padding_mask=padding)
        fused = torch.stack([m.eval()(src, src_key_padding_mask=padding) for m in models])
    expected = torch.stack([m(src, src_key_padding_mask=padding) for m in models])
    assert fused[:, 0].isnan().all() and expected.isfinite().all()
    torch.testing.assert_close(out, expected.detach())


def test_stepping_some_members_with_per_member_learning_rates_matches_their_optimizers():
    """tdfunc.optim.Adam over the ensemble, stepping a subset of members with one
    learning rate each, against one torch.optim.Adam per member stepped alone."""
    import tdfunc.optim

    models = members(lambda: _model(True), N)
    ensemble = Ensemble(*copy.deepcopy(models))
    rates = torch.tensor([0.01, 0.02, 0.03])
    optimizer = tdfunc.optim.Adam(ensemble.parameters(), lr=rates, eps=1e-4)
    loop = [torch.optim.Adam(m.parameters(), lr=float(r), eps=1e-4) for m, r in zip(models, rates)]
    src, tgt = _pair(True)
    for chosen in ([0, 2], [1], [0, 1, 2]):
        ensemble(src, tgt, tgt_mask=_causal(T)).square().mean((1, 2, 3)).sum().backward()
        optimizer.step(members=chosen)
        optimizer.zero_grad()
        for i, (model, opt) in enumerate(zip(models, loop)):
            model(src, tgt, tgt_mask=_causal(T)).square().mean().backward()
            if i in chosen:
                opt.step()
            opt.zero_grad()
        for name, stacked in ensemble.named_parameters():
            expected = torch.stack([m.get_parameter(name[len("stacked.") :]) for m in models])
            torch.testing.assert_close(stacked, expected, atol=1e-5, rtol=1e-4, msg=name)


def test_a_causal_mask_of_another_dtype_is_read_as_torch_reads_it():
    """torch's stacks ask whether a mask is causal when no hint is given; a causal one
    then replaces the mask, so a float64 causal mask works with float32 inputs. Any
    other float64 mask is refused by attention, in the loop as in the ensemble."""
    models = members(lambda: _model(True), N)
    src, tgt = _pair(True)
    causal = {"tgt_mask": _causal(T).double(), "src_mask": _causal(S).double()}
    check(models, (src, tgt), causal)
    check(models, (src, tgt), causal, train=False, grad=False)
    ensemble = Ensemble(*models)
    other = {"tgt_mask": torch.zeros(T, T, dtype=torch.float64)}
    message = "Expected attn_mask dtype"
    with pytest.raises(RuntimeError, match=message):
        models[0](src, tgt, **other)
    with pytest.raises(RuntimeError, match=message):
        ensemble(src, tgt, **other)


def test_pickled_and_copied_ensembles_run_and_train_like_the_loop():
    import pickle

    models = members(lambda: _model(True), N)
    src, tgt = _pair(True)
    original = Ensemble(*copy.deepcopy(models))
    original(src, tgt)  # plans and derived views made before the copy
    for ensemble in (pickle.loads(pickle.dumps(original)), copy.deepcopy(original)):
        loop = copy.deepcopy(models)
        for train in (True, False, True):
            ensemble.train(train)
            out = ensemble(src, tgt, tgt_mask=_causal(T))
            expected = torch.stack([m.train(train)(src, tgt, tgt_mask=_causal(T)) for m in loop])
            torch.testing.assert_close(out, expected)
            with torch.no_grad():  # an edit in place reaches the derived views
                ensemble.params["encoder", "layers", "0", "self_attn", "in_proj_weight"].mul_(0.9)
                for m in loop:
                    m.encoder.layers[0].self_attn.in_proj_weight.mul_(0.9)
