"""The batched path of ``Ensemble`` over a corpus of architectures.

Every architecture is checked against two references computed without tdfunc:
a Python loop over the member models, and ``torch.func`` (``stack_module_state``
+ ``functional_call`` in ``vmap``, plain dicts). Outputs, gradients of every
parameter and of the input, buffers after a train-mode step and parameters after
several optimizer steps must agree.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from tdfunc import Ensemble, register_batched

# the corpus holds fallbacks on purpose; each entry's summary says which path it takes
pytestmark = pytest.mark.filterwarnings("ignore::tdfunc.EnsembleFallbackWarning")


# ----------------------------------------------------------------- the corpus
class TutorialMLP(nn.Module):
    """The torch.func ensembling tutorial's model (smaller)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 12)
        self.fc2 = nn.Linear(12, 12)
        self.fc3 = nn.Linear(12, 3)

    def forward(self, x):
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect")
        self.norm = nn.GroupNorm(2, 6)
        self.head = nn.Linear(6 * 2 * 2, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        x = nn.functional.avg_pool2d(self.norm(self.conv2(x)), 2)
        return self.head(x.view(x.size(0), -1))


class Attention(nn.Module):
    """Custom forward with chunk, matmul, transpose, softmax(dim=-1), a residual and
    a parameter read directly (``self.scale``)."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.scale = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        mixed = torch.softmax(scores, dim=-1) @ v
        return x + self.out(mixed) * self.scale


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 8, padding_idx=0)
        self.block = Attention(8)
        self.head = nn.Linear(16, 2)

    def forward(self, tokens):
        h = self.block(self.embed(tokens))
        return self.head(torch.cat([h.mean(dim=1), h.amax(1)], dim=1))


class Unsupported(nn.Module):
    """An op without a batched rule (``torch.linalg.vector_norm``) runs under vmap alone."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        h = self.fc(x)
        return h / torch.linalg.vector_norm(h, dim=-1, keepdim=True)


class LengthDependent(nn.Module):
    """``len(x)`` of a traced value is not traceable: the forward runs under vmap as a whole."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc(x) / len(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        mixed, _ = self.attn(x, x, x, need_weights=False)
        return self.norm(x + mixed)


class WithAttention(nn.Module):
    """``nn.MultiheadAttention`` inside custom code, batched with the layers around it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.blk = Block()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.blk(torch.tanh(self.fc(x)))[:, -1])


class WithUnbatchedLayer(nn.Module):
    """A ``torch.nn`` layer without a batched form inside batched code: vmapped alone."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.drop = nn.AlphaDropout(0.0)
        self.head = nn.Linear(3, 2)

    def forward(self, x):  # x: [B, 3, 6]
        h = torch.tanh(self.fc(x))
        return self.head(self.drop(h).mean(-1))


class DecoderOnItself(nn.Module):
    """A decoder layer attending to its own input as memory (sequence-first)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.TransformerDecoderLayer(6, 3, 8, dropout=0.0, norm_first=True)

    def forward(self, x):
        return self.layer(x, x)


class ShapeOps(nn.Module):
    """Dim-taking and shape ops of custom code, all rewritten to the member-leading layout."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 8)
        self.mix = nn.Linear(4, 4)
        self.offset = nn.Parameter(torch.randn(2, 4))

    def forward(self, x):  # x: [B, 3, 4]
        h = self.fc(x.reshape(x.size(0), -1))  # [B, 8]
        a, b = h.split(4, dim=1)
        pair = torch.stack([a, b], dim=1) + self.offset  # [B, 2, 4]
        pair = self.mix(pair.transpose(1, 2).permute(0, 2, 1))
        top = pair.max(dim=1).values  # [B, 4]
        pad = x.new_zeros(x.shape[0], 2)
        scores = torch.softmax(torch.cat([top, pad], dim=1), dim=1)  # [B, 6]
        gated = torch.where(scores > 0.1, scores, scores.unsqueeze(-1).squeeze(-1) * 0.5)
        return gated[:, :5].view(x.size(0), 5, 1).flatten(1) + h[..., :1]


def mlp():
    return nn.Sequential(
        nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)
    )


def randn(*shape):
    return lambda batch: torch.randn(batch, *shape)


CORPUS = {
    # name: (member factory, input maker, expected batched summary)
    "mlp": (mlp, randn(6), "5/5 layers batched"),
    "tutorial": (TutorialMLP, randn(1, 4, 4), "3/3 layers batched"),
    "cnn": (SmallCNN, randn(1, 8, 8), "5/5 layers batched"),
    "batchnorm": (
        lambda: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 2)),
        randn(6),
        "4/4 layers batched",
    ),
    "conv1d": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 3, 3, padding="same"),
            nn.BatchNorm1d(3),
            nn.SiLU(),
            nn.AdaptiveMaxPool1d(2),
            nn.Flatten(),
            nn.Linear(6, 2),
        ),
        randn(2, 7),
        "6/6 layers batched",
    ),
    "conv3d": (
        lambda: nn.Sequential(
            nn.Conv3d(1, 2, 2, groups=1), nn.ReLU(), nn.Flatten(1), nn.Linear(16, 2)
        ),
        randn(1, 3, 3, 3),
        "4/4 layers batched",
    ),
    "dropout_eval": (
        lambda: nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.4), nn.Linear(8, 2)).eval(),
        randn(6),
        "3/3 layers batched",
    ),
    "layernorm": (
        lambda: nn.Sequential(nn.Unflatten(1, (2, 3)), Attention(3), nn.Flatten(), nn.Linear(6, 2)),
        randn(6),
        "6/6 layers batched",
    ),
    "embedding": (Tokens, lambda batch: torch.randint(0, 11, (batch, 5)), "5/5 layers batched"),
    "unsupported_op": (
        Unsupported,
        randn(6),
        "1/1 layers batched; `op linalg_vector_norm` vmapped",
    ),
    "untraceable": (
        LengthDependent,
        randn(6),
        "forward vmapped (untraceable by torch.fx: 'len' is not supported",
    ),
    "wide_shared_input": (  # one matmul with every member's weight: [B * 40, 128] @ [128, N * 8]
        lambda: nn.Sequential(nn.Linear(128, 8), nn.ReLU(), nn.Linear(8, 2, bias=False)),
        randn(40, 128),
        "3/3 layers batched",
    ),
    "wide_shared_input_no_bias": (
        lambda: nn.Sequential(nn.Linear(128, 8, bias=False), nn.Tanh()),
        randn(40, 128),
        "2/2 layers batched",
    ),
    "shape_ops": (ShapeOps, randn(3, 4), "2/2 layers batched"),
    "sequential_of_untraceable": (
        lambda: nn.Sequential(nn.Linear(6, 6), LengthDependent()),
        randn(6),
        "1/2 layers batched; `1` vmapped",
    ),
    "attention_block": (WithAttention, randn(3, 6), "4/4 layers batched"),
    "transformer_encoder": (
        lambda: nn.Sequential(
            nn.TransformerEncoder(
                nn.TransformerEncoderLayer(6, 2, 12, dropout=0.0, batch_first=True), 2
            ),
            nn.Linear(6, 2),
        ),
        randn(4, 6),
        "2/2 layers batched",
    ),
    "transformer_decoder_layer": (DecoderOnItself, randn(4, 6), "1/1 layers batched"),
    "unregistered_layer": (WithUnbatchedLayer, randn(3, 6), "2/3 layers batched; `drop` vmapped"),
}


def members_of(name: str, n: int = 3, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    factory = CORPUS[name][0]
    return [factory() for _ in range(n)]


def loop_forward(members, x):
    return torch.stack([m(x) for m in members])


def torch_func_forward(members, x):
    """The torch.func tutorial's recipe, with plain dicts (buffers updated in place)."""
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")

    def one(p, b, x):
        return functional_call(base, (p, b), (x,))

    return vmap(one, (0, 0, None), randomness="different")(params, buffers, x), params, buffers


def flat_grads(ensemble: Ensemble) -> dict:
    prefix = "stacked."
    return {n[len(prefix) :]: p.grad for n, p in ensemble.named_parameters()}


# ----------------------------------------------------------------- the corpus checks
@pytest.mark.parametrize("name", list(CORPUS))
def test_outputs_and_gradients_match_loop_and_torch_func(name):
    members = members_of(name)
    ensemble = Ensemble(*copy.deepcopy(members))
    assert ensemble.batched_summary.startswith(CORPUS[name][2])
    assert CORPUS[name][2] in repr(ensemble)
    x = CORPUS[name][1](5)
    if x.is_floating_point():
        x.requires_grad_()
    out = ensemble(x)
    expected = loop_forward(members, x)
    reference, params, _ = torch_func_forward(copy.deepcopy(members), x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, reference)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    ensemble_grad_x, x.grad = x.grad, None
    (expected * weights).sum().backward()
    grads = flat_grads(ensemble)
    states = [dict(m.named_parameters()) for m in members]
    for key, grad in grads.items():
        torch.testing.assert_close(grad, torch.stack([s[key].grad for s in states]), msg=key)
    func_grads = torch.autograd.grad((reference * weights).sum(), list(params.values()))
    for key, grad in zip(params, func_grads):
        torch.testing.assert_close(grads[key], grad, msg=key)
    if x.requires_grad:
        torch.testing.assert_close(ensemble_grad_x, x.grad)


@pytest.mark.parametrize("name", ["batchnorm", "cnn"])
def test_train_mode_buffers_then_eval_match_loop_and_torch_func(name):
    members = members_of(name)
    ensemble = Ensemble(*copy.deepcopy(members))
    func_members = copy.deepcopy(members)
    x = CORPUS[name][1](6)
    params, buffers = stack_module_state(func_members)
    base = copy.deepcopy(members[0]).to("meta")
    for _ in range(2):  # running statistics move: per-member batch statistics
        torch.testing.assert_close(ensemble(x), loop_forward(members, x))
        vmap(lambda p, b: functional_call(base, (p, b), (x,)))(params, buffers)
    state = {k[len("stacked.") :]: v for k, v in ensemble.state_dict().items()}
    for key in buffers:
        reference = torch.stack([m.state_dict()[key] for m in members])
        torch.testing.assert_close(state[key], reference, msg=key)
        torch.testing.assert_close(state[key], buffers[key], msg=key)
    ensemble.eval()
    for m in members:
        m.eval()
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))


# Adam divides by the gradients' magnitude, which turns rounding noise into steps
# where a gradient is zero in exact arithmetic (a bias before a BatchNorm, the key
# bias of an attention): those models are checked with SGD.
@pytest.mark.parametrize(
    ("name", "optimizer_cls"),
    [(name, torch.optim.SGD) for name in ("batchnorm", "cnn", "embedding", "unregistered_layer")]
    + [(name, torch.optim.Adam) for name in ("mlp", "tutorial", "unsupported_op")],
)
def test_optimizer_steps_match_separate_training(name, optimizer_cls):
    members = members_of(name)
    ensemble = Ensemble(*copy.deepcopy(members))
    x = CORPUS[name][1](6)
    kwargs = {"lr": 0.05, "momentum": 0.9} if optimizer_cls is torch.optim.SGD else {"lr": 0.01}
    optimizer = optimizer_cls(ensemble.parameters(), **kwargs)
    target = torch.randn_like(copy.deepcopy(members[0])(x))  # a copy: running stats stay
    for _ in range(3):
        optimizer.zero_grad()
        ensemble(x).sub(target).square().mean(dim=(1, 2)).sum().backward()
        optimizer.step()
    for model in members:
        opt = optimizer_cls(model.parameters(), **kwargs)
        for _ in range(3):
            opt.zero_grad()
            model(x).sub(target).square().mean().backward()
            opt.step()
    state = {k[len("stacked.") :]: v for k, v in ensemble.state_dict().items()}
    for key, value in state.items():
        torch.testing.assert_close(value, torch.stack([m.state_dict()[key] for m in members]))


# ----------------------------------------------------------------- running options
@pytest.mark.parametrize("name", ["mlp", "cnn", "unregistered_layer"])
def test_per_member_inputs_and_chunks(name):
    members = members_of(name, n=4)
    xs = torch.stack([CORPUS[name][1](3) for _ in range(4)], 1)  # member dim 1
    expected = torch.stack([m(x) for m, x in zip(members, xs.unbind(1))])
    torch.testing.assert_close(Ensemble(*members, in_dims=1)(xs), expected)
    ensemble = Ensemble(*copy.deepcopy(members), in_dims=1, chunk_size=3)
    torch.testing.assert_close(ensemble(xs), expected)
    with pytest.raises(ValueError, match="expected 4"):
        ensemble(xs[:, :2])


def test_chunks_update_every_members_batchnorm_buffers():
    members = members_of("batchnorm", n=5)
    ensemble = Ensemble(*copy.deepcopy(members), chunk_size=2)
    x = torch.randn(7, 6)
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))
    running = ensemble.stacked.get_submodule("1").running_var
    torch.testing.assert_close(running, torch.stack([m[1].running_var for m in members]))


def test_dropout_masks_per_member_or_shared():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5))
    same_members = [copy.deepcopy(model) for _ in range(3)]
    x = torch.randn(8, 4)
    dense = model[0](x)
    different = Ensemble(*same_members)
    assert different.batched_summary == "2/2 layers batched"
    out = different(x)
    for member_out in out:  # every entry is dropped or scaled by 1 / (1 - p)
        kept = member_out != 0
        torch.testing.assert_close(member_out[kept], 2 * dense[kept])
        assert 0 < kept.float().mean() < 1
    assert not torch.equal(out[0] != 0, out[1] != 0)
    same = Ensemble(*same_members, randomness="same")(x)
    assert torch.equal(same[0], same[1]) and torch.equal(same[1], same[2])
    with pytest.raises(RuntimeError, match="randomness"):
        Ensemble(*same_members, randomness="error")(x)


# ----------------------------------------------------------------- edge cases
def test_one_member_empty_batch_and_non_contiguous_input():
    members = members_of("mlp", n=1)
    ensemble = Ensemble(*members)
    x = torch.randn(6, 5).t()  # non-contiguous
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))
    assert ensemble(torch.randn(0, 6)).shape == (1, 0, 3)
    tutorial = members_of("tutorial", n=1)
    images = torch.randn(4, 4, 1, 3).permute(3, 2, 0, 1)  # [3, 1, 4, 4], non-contiguous
    torch.testing.assert_close(Ensemble(*tutorial)(images), loop_forward(tutorial, images))


@pytest.mark.parametrize("name", ["mlp", "cnn", "embedding"])
def test_float64_no_grad_and_inference_mode(name):
    members = [m.double() for m in members_of(name)]
    ensemble = Ensemble(*copy.deepcopy(members)).eval()
    for m in members:
        m.eval()
    x = CORPUS[name][1](4)
    x = x.double() if x.is_floating_point() else x
    with torch.no_grad():
        out = ensemble(x)
        assert out.dtype == torch.float64 and not out.requires_grad
        torch.testing.assert_close(out, loop_forward(members, x))
    with torch.inference_mode():
        torch.testing.assert_close(ensemble(x), loop_forward(members, x))
    out = ensemble(x)  # grads still flow after the no_grad and inference_mode calls
    out.sum().backward()
    loop_forward(members, x).sum().backward()
    for key, grad in flat_grads(ensemble).items():
        reference = torch.stack([dict(m.named_parameters())[key].grad for m in members])
        torch.testing.assert_close(grad, reference, msg=key)


def test_conversions_and_new_parameters_after_a_forward():
    members = members_of("tutorial")
    ensemble = Ensemble(*copy.deepcopy(members))
    x = torch.randn(4, 1, 4, 4)
    ensemble(x)  # views of the parameters are kept from here on
    ensemble.double()  # swaps the parameters' data, same objects
    torch.testing.assert_close(
        ensemble(x.double()), loop_forward([m.double() for m in members], x.double())
    )
    other = Ensemble(*members_of("tutorial", seed=1)).double()
    ensemble.load_state_dict(other.state_dict(), assign=True)  # new parameter objects
    torch.testing.assert_close(ensemble(x.double()), other(x.double()))


def test_meta_device_members():
    with torch.device("meta"):
        members = [TutorialMLP() for _ in range(3)]
    ensemble = Ensemble(*members)
    out = ensemble(torch.randn(5, 1, 4, 4, device="meta"))
    assert out.shape == (3, 5, 3) and out.device.type == "meta"


def test_functional_call_batched_with_other_params():
    members = members_of("tutorial")
    ensemble = Ensemble(*members)
    x = torch.randn(4, 1, 4, 4)
    doubled = ensemble.params * 2
    expected = torch.stack(
        [functional_call(m, {k: 2 * v for k, v in m.state_dict().items()}, (x,)) for m in members]
    )
    torch.testing.assert_close(ensemble.functional_call(doubled, x), expected)


def test_torch_func_transforms_over_the_batched_forward():
    members = members_of("tutorial")
    ensemble = Ensemble(*members)
    xs = torch.randn(2, 4, 1, 4, 4)
    expected = torch.stack([loop_forward(members, x) for x in xs])
    torch.testing.assert_close(vmap(ensemble)(xs), expected)
    input_grad = torch.func.grad(lambda x: ensemble(x).square().sum())(xs[0])
    x = xs[0].clone().requires_grad_()
    loop_forward(members, x).square().sum().backward()
    torch.testing.assert_close(input_grad, x.grad)


# ----------------------------------------------------------------- registration
class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * torch.sigmoid(self.weight)


def test_register_batched_layer_is_used():
    calls = []

    def gate(module, params, x):
        calls.append((tuple(params["weight"].shape), tuple(x.shape)))
        return x * torch.sigmoid(params["weight"]).unsqueeze(1)

    torch.manual_seed(0)
    members = [nn.Sequential(nn.Linear(3, 4), nn.Sequential(Gate(), nn.Tanh())) for _ in range(2)]
    before = Ensemble(*members)
    assert before.batched_summary == "2/2 layers batched"  # Gate's forward is traced
    x = torch.randn(5, 3)
    torch.testing.assert_close(before(x), loop_forward(members, x))
    assert register_batched(Gate, gate) is gate
    ensemble = Ensemble(*members)
    assert ensemble.batched_summary == "3/3 layers batched"
    torch.testing.assert_close(ensemble(x), loop_forward(members, x))
    assert calls == [((2, 4), (2, 5, 4))]
    with pytest.raises(TypeError, match=r"nn\.Module subclass"):
        register_batched(print, gate)


# ----------------------------------------------------------------- clipping
@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_clip_grad_norm_per_member_matches_clipping_each_member(norm_type):
    members = members_of("mlp", n=4)
    ensemble = Ensemble(*copy.deepcopy(members))
    x = torch.randn(6, 6)
    scales = torch.tensor([0.01, 1.0, 10.0, 100.0]).view(4, 1, 1)
    (ensemble(x) * scales).sum().backward()
    norms = ensemble.clip_grad_norm_(1.0, norm_type)
    expected_norms = []
    for member, scale in zip(members, scales.flatten()):
        (member(x) * scale).sum().backward()
        expected_norms.append(torch.nn.utils.clip_grad_norm_(member.parameters(), 1.0, norm_type))
    torch.testing.assert_close(norms, torch.stack(expected_norms))
    grads = flat_grads(ensemble)
    for key, grad in grads.items():
        reference = torch.stack([dict(m.named_parameters())[key].grad for m in members])
        torch.testing.assert_close(grad, reference, msg=key)


# ----------------------------------------------------------------- compile
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "tutorial"])
def test_compiled_batched_forward_and_backward_fullgraph(name):
    members = members_of(name)
    ensemble = Ensemble(*copy.deepcopy(members))
    compiled = torch.compile(ensemble, backend="aot_eager", fullgraph=True)
    x = CORPUS[name][1](5)
    out = compiled(x)
    torch.testing.assert_close(out, loop_forward(members, x))
    out.sum().backward()
    loop_forward(members, x).sum().backward()
    grads = flat_grads(ensemble)
    for key, grad in grads.items():
        reference = torch.stack([dict(m.named_parameters())[key].grad for m in members])
        torch.testing.assert_close(grad, reference, msg=key)


# a short chain runs as generated code, a deep one as a loop
@pytest.mark.parametrize("depth", [3, 80])
def test_deep_sequential_matches_loop(depth):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(4, 4), nn.Tanh()]
    members = [nn.Sequential(*copy.deepcopy(layers)) for _ in range(3)]
    for member in members:
        for p in member.parameters():
            p.data.normal_(0, 0.5)
    ensemble = Ensemble(*copy.deepcopy(members))
    x = torch.randn(5, 4)
    out = ensemble(x)
    expected = torch.stack([m(x) for m in members])
    torch.testing.assert_close(out, expected)
    out.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(
        ensemble.get_parameter("stacked.0.weight").grad,
        torch.stack([m[0].weight.grad for m in members]),
    )
