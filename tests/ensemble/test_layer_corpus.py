"""More built-in batched layers against a loop over the member modules.

Transposed convolutions, instance norm, pooling with indices, the two-input
layers, ``EmbeddingBag`` and the parameter-free per-sample layers: outputs,
gradients and buffers equal a Python loop over ordinary modules, in train and
eval mode, with inputs shared by the members and given per member.
"""

from __future__ import annotations

import copy

import pytest
import torch
from member_loop import MEMBERS, check_against_loop, flat, members
from torch import nn

from tdfunc import Ensemble


def _randomised(module: nn.Module) -> nn.Module:
    """Every floating tensor drawn at random: affine weights start as ones otherwise,
    and members that agree would hide a mix-up between them."""
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(torch.rand_like(tensor) + 0.5)
    return module


def with_head(layer: nn.Module, channels: int, dims: int) -> nn.Module:
    """A parameter-free ``layer`` after a 1x1 convolution (members need tensors)."""
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1](channels, channels, 1)
    return nn.Sequential(conv, layer)


def randn(*shape):
    return lambda i: (torch.randn(*shape),)


# name -> (member factory, inputs of one member (i is None for shared inputs))
CORPUS = {
    "conv_transpose1d": (lambda: nn.ConvTranspose1d(3, 4, 3, stride=2), randn(2, 3, 7)),
    "conv_transpose1d_unbatched": (lambda: nn.ConvTranspose1d(3, 4, 2, bias=False), randn(3, 5)),
    "conv_transpose2d": (
        lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
        randn(2, 4, 5, 5),
    ),
    "conv_transpose2d_dilated": (
        lambda: nn.ConvTranspose2d(2, 3, (2, 3), stride=(2, 1), dilation=(1, 2), padding=(0, 1)),
        randn(2, 2, 4, 3),
    ),
    "conv_transpose3d": (lambda: nn.ConvTranspose3d(2, 2, 2, stride=2), randn(2, 2, 2, 3, 2)),
    "instance_norm1d": (lambda: nn.InstanceNorm1d(3, affine=True), randn(4, 3, 6)),
    "instance_norm1d_plain": (
        lambda: with_head(nn.InstanceNorm1d(3), 3, 1),
        randn(4, 3, 6),
    ),
    "instance_norm2d_tracked": (
        lambda: nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
        randn(4, 3, 4, 5),
    ),
    "instance_norm2d_tracked_no_affine": (
        lambda: with_head(nn.InstanceNorm2d(3, track_running_stats=True, momentum=None), 3, 2),
        randn(2, 3, 4, 4),
    ),
    "instance_norm3d_unbatched": (
        lambda: nn.InstanceNorm3d(2, affine=True, track_running_stats=True),
        randn(2, 3, 3, 4),
    ),
    "max_pool2d_indices": (
        lambda: with_head(nn.MaxPool2d(2, return_indices=True), 3, 2),
        randn(2, 3, 4, 6),
    ),
    "adaptive_max_pool1d_indices": (
        lambda: with_head(nn.AdaptiveMaxPool1d(3, return_indices=True), 2, 1),
        randn(2, 2, 7),
    ),
    "autoencoder": (
        lambda: nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.ConvTranspose2d(4, 3, 2, stride=2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(3, 1, 3, padding=1),
        ),
        randn(2, 1, 6, 6),
    ),
    "upsample_bilinear_after_conv": (
        lambda: with_head(nn.Upsample(scale_factor=2, mode="bilinear"), 3, 2),
        randn(2, 3, 3, 4),
    ),
    "max_pool2d_unbatched_after_conv": (lambda: with_head(nn.MaxPool2d(2), 3, 2), randn(3, 4, 4)),
    "avg_pool1d_on_the_input": (
        lambda: nn.Sequential(nn.AvgPool1d(2), nn.Conv1d(2, 2, 1)),
        randn(3, 2, 6),
    ),
    "zero_pad2d_of_a_matrix": (  # a member's input [H, W]: padding reads no batch dim
        lambda: nn.Sequential(nn.Linear(4, 4), nn.ZeroPad2d((1, 0, 2, 1))),
        randn(3, 4),
    ),
    "constant_pad3d_after_conv": (
        lambda: with_head(nn.ConstantPad3d((1, 0, 0, 1, 1, 1), 0.5), 2, 3),
        randn(2, 2, 2, 2, 2),
    ),
    "zero_pad1d_after_conv": (lambda: with_head(nn.ZeroPad1d((1, 2)), 2, 1), randn(2, 2, 5)),
    "pixel_shuffle_after_conv": (lambda: with_head(nn.PixelShuffle(2), 4, 2), randn(2, 4, 3, 3)),
    "pixel_unshuffle_unbatched": (lambda: with_head(nn.PixelUnshuffle(2), 1, 2), randn(1, 4, 4)),
    "local_response_norm": (
        lambda: with_head(nn.LocalResponseNorm(3), 5, 2),
        randn(2, 5, 3, 3),
    ),
    "reflection_pad3d": (lambda: with_head(nn.ReflectionPad3d(1), 2, 3), randn(2, 2, 3, 3, 3)),
    "replication_pad3d_unbatched": (
        lambda: with_head(nn.ReplicationPad3d((1, 0, 2, 1, 0, 1)), 2, 3),
        randn(2, 3, 3, 3),
    ),
    "circular_pad2d": (lambda: with_head(nn.CircularPad2d((1, 2, 0, 1)), 3, 2), randn(2, 3, 3, 4)),
    "circular_pad2d_unbatched": (lambda: with_head(nn.CircularPad2d(1), 3, 2), randn(3, 3, 4)),
    "lp_pool3d": (lambda: with_head(nn.LPPool3d(2, 2), 2, 3), randn(2, 2, 4, 4, 4)),
    "channel_shuffle": (lambda: with_head(nn.ChannelShuffle(2), 4, 2), randn(2, 4, 3, 3)),
    "softmax2d": (lambda: with_head(nn.Softmax2d(), 3, 2), randn(2, 3, 2, 2)),
    "softmax2d_unbatched": (lambda: with_head(nn.Softmax2d(), 3, 2), randn(3, 2, 2)),
    "unfold_unbatched": (lambda: with_head(nn.Unfold(2), 3, 2), randn(3, 4, 4)),
    "unfold_fold": (
        lambda: nn.Sequential(
            nn.Conv2d(2, 2, 1), nn.Unfold(2, stride=2), nn.Fold((4, 4), 2, stride=2)
        ),
        randn(3, 2, 4, 4),
    ),
    "bilinear": (lambda: nn.Bilinear(3, 4, 5), lambda i: (torch.randn(6, 3), torch.randn(6, 4))),
    "bilinear_one_sample_no_bias": (
        lambda: nn.Bilinear(3, 2, 4, bias=False),
        lambda i: (torch.randn(3), torch.randn(2)),
    ),
    "bilinear_three_dims": (
        lambda: nn.Bilinear(2, 2, 3),
        lambda i: (torch.randn(2, 4, 2), torch.randn(2, 4, 2)),
    ),
    "cosine_similarity": (
        lambda: nn.Sequential(
            nn.Linear(4, 4), nn.Unflatten(1, (2, 2)), _Pair(nn.CosineSimilarity(1))
        ),
        randn(5, 4),
    ),
    "pairwise_distance": (
        lambda: nn.Sequential(
            nn.Linear(4, 4), nn.Unflatten(1, (2, 2)), _Pair(nn.PairwiseDistance(3, keepdim=True))
        ),
        randn(5, 4),
    ),
    "embedding_bag_fixed_mean": (
        lambda: nn.EmbeddingBag(10, 3, mode="mean"),
        lambda i: (torch.randint(0, 10, (4, 5)),),
    ),
    "embedding_bag_offsets_sum_weights": (
        lambda: nn.EmbeddingBag(10, 3, mode="sum"),
        lambda i: (
            torch.randint(0, 10, (9,)),
            torch.tensor([0, 2, 2, 7]),  # an empty bag
            torch.rand(9),
        ),
    ),
    "embedding_bag_offsets_max": (
        lambda: nn.EmbeddingBag(10, 3, mode="max"),
        lambda i: (torch.randint(0, 10, (8,)), torch.tensor([0, 3, 3, 6])),
    ),
    # float64: with every weight drawn positive (above) attention saturates, and float32
    # rounding of gradients near 100 passes the tolerance, in the loop as in the ensemble
    "transformer_encoder_layer": (
        lambda: nn.TransformerEncoderLayer(8, 2, 12, 0.0, "gelu", dtype=torch.float64),
        lambda i: (torch.randn(5, 2, 8, dtype=torch.float64),),  # sequence first
    ),
    "transformer_decoder_layer": (
        lambda: nn.TransformerDecoderLayer(
            8, 2, 12, 0.0, batch_first=True, norm_first=True, dtype=torch.float64
        ),
        lambda i: (torch.randn(2, 4, 8).double(), torch.randn(2, 5, 8).double()),
    ),
    "transformer": (
        lambda: nn.Transformer(8, 2, 1, 2, 12, 0.0, batch_first=True, dtype=torch.float64),
        lambda i: (torch.randn(2, 5, 8).double(), torch.randn(2, 3, 8).double()),
    ),
}


class _Pair(nn.Module):
    """Splits ``[B, 2, F]`` into the two inputs of ``layer`` (a custom forward)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x[:, 0], x[:, 1])


def _models(name: str) -> list:
    return [_randomised(m) for m in members(CORPUS[name][0])]


def _inputs(name: str, shared: bool):
    make = CORPUS[name][1]
    if shared:
        torch.manual_seed(1)
        fixed = make(None)
        return lambda i: fixed
    torch.manual_seed(1)
    per_member = [make(i) for i in range(MEMBERS)]
    return lambda i: per_member[i]


def _float_inputs_require_grad(args_for):
    def with_grad(i):
        return tuple(
            a.requires_grad_() if a.is_floating_point() and not a.requires_grad else a
            for a in args_for(i)
        )

    return with_grad


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per_member"])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", list(CORPUS))
def test_layer_matches_loop(name, train, shared):
    models = [m.train(train) for m in _models(name)]
    args_for = _float_inputs_require_grad(_inputs(name, shared))
    check_against_loop(models, args_for, in_dims=None if shared else 0)


@pytest.mark.parametrize(
    "name",
    ["instance_norm2d_tracked", "instance_norm2d_tracked_no_affine", "instance_norm3d_unbatched"],
)
def test_running_statistics_follow_the_loop(name):
    """Two train-mode steps on per-member inputs move each member's statistics by
    its own batch; eval mode then normalises with them."""
    models = _models(name)
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    args_for = _inputs(name, shared=False)
    args = tuple(torch.stack(parts) for parts in zip(*(args_for(i) for i in range(MEMBERS))))
    for _ in range(2):
        out = ensemble(*args)
        expected = torch.stack([m(*args_for(i)) for i, m in enumerate(models)])
        torch.testing.assert_close(out, expected)
    state = ensemble.state_dict()
    for key in models[0].state_dict():
        reference = torch.stack([m.state_dict()[key] for m in models])
        torch.testing.assert_close(state[f"stacked.{key}"], reference, msg=key)
        if key.endswith("running_mean"):
            assert not torch.equal(reference[0], reference[1]), "members saw different batches"
    ensemble.eval()
    expected = torch.stack([m.eval()(*args_for(i)) for i, m in enumerate(models)])
    assert "vmapped" not in ensemble.batched_summary
    torch.testing.assert_close(ensemble(*args), expected)


def test_conv_transpose_output_size_argument():
    models = _models("conv_transpose2d")
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(2, 4, 5, 5)
    for size in ([10, 10], [9, 10], (2, 6, 9, 9)):
        out = ensemble(x, output_size=size)
        expected = torch.stack([m(x, output_size=size) for m in models])
        torch.testing.assert_close(out, expected)


def test_conv_transpose_output_size_out_of_reach_is_torch_error():
    ensemble = Ensemble(*_models("conv_transpose2d"))
    with pytest.raises(ValueError, match="requested an output size"):
        ensemble(torch.randn(2, 4, 5, 5), output_size=[20, 20])


def test_embedding_bag_index_out_of_range_raises_like_the_member():
    ensemble = Ensemble(*_models("embedding_bag_fixed_mean"))
    for bad in (10, -1):
        indices = torch.tensor([[1, 2, bad]])
        with pytest.raises((IndexError, RuntimeError)):
            ensemble.member(0)(indices)
        with pytest.raises((IndexError, RuntimeError)):
            ensemble(indices)


def test_embedding_bag_shared_offsets_by_keyword():
    models = _models("embedding_bag_offsets_sum_weights")
    ensemble = Ensemble(*copy.deepcopy(models))
    indices, offsets = torch.randint(0, 10, (7,)), torch.tensor([0, 4])
    out = ensemble(indices, offsets=offsets)
    expected = torch.stack([m(indices, offsets=offsets) for m in models])
    torch.testing.assert_close(out, expected)


# configurations whose batched form would differ from torch's own per-member call
# (one padding row per member, renormalised rows, torch's own counts for
# scale_grad_by_freq, the last bag of max and mean when the offsets end early)
FALLBACKS = {
    "padding_idx": (lambda: nn.EmbeddingBag(10, 3, padding_idx=0), (torch.tensor([[1, 0, 4]]),)),
    "max_norm": (lambda: nn.EmbeddingBag(10, 3, max_norm=1.0), (torch.tensor([[1, 0, 4]]),)),
    "scale_grad_by_freq": (
        lambda: nn.EmbeddingBag(6, 2, scale_grad_by_freq=True),
        (torch.tensor([[1, 1, 2], [1, 3, 3]]),),
    ),
    "mean_last_offset": (
        lambda: nn.EmbeddingBag(10, 3, mode="mean", include_last_offset=True),
        (torch.tensor([2, 8, 5, 6, 6, 5, 7, 2]), torch.tensor([0, 3, 3, 8])),
    ),
    "sum_last_offset": (
        lambda: nn.EmbeddingBag(10, 3, mode="sum", include_last_offset=True),
        (torch.tensor([2, 8, 5, 6, 6, 5, 7, 2]), torch.tensor([0, 3, 3, 8])),
    ),
    "max_last_offset": (
        lambda: nn.EmbeddingBag(10, 3, mode="max", include_last_offset=True),
        (torch.tensor([2, 8, 5, 6, 6, 5, 7, 2]), torch.tensor([0, 3, 3, 8])),
    ),
}


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_configurations_without_batched_form_fall_back_exactly(name):
    make, args = FALLBACKS[name]
    models = members(make)
    ensemble = Ensemble(*copy.deepcopy(models))
    assert "vmapped" in ensemble.batched_summary
    out = ensemble(*args)
    expected = torch.stack([m(*args) for m in models])
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(expected)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    grads = torch.stack([m.weight.grad for m in models])
    torch.testing.assert_close(ensemble.get_parameter("stacked.weight").grad, grads)


def test_instance_norm_affine_channel_mismatch_is_torch_error():
    ensemble = Ensemble(*_models("instance_norm1d"))
    with pytest.raises(ValueError, match="num_features"):
        ensemble(torch.randn(2, 4, 6))


def test_outputs_of_pooling_with_indices_are_a_pair():
    models = _models("max_pool2d_indices")
    out = Ensemble(*copy.deepcopy(models))(torch.randn(2, 3, 4, 6))
    assert isinstance(out, tuple) and len(flat(out)) == 2
    assert out[1].dtype == torch.int64


@pytest.mark.parametrize(
    "name",
    ["conv_transpose1d", "conv_transpose2d", "autoencoder", "bilinear", "max_pool2d_indices"],
)
def test_empty_batch_matches_the_loop(name):
    """A batch of 0 samples: the same (empty) output, or the same error, as the members."""
    models = _models(name)
    ensemble = Ensemble(*copy.deepcopy(models))
    args = tuple(a[:0] for a in _inputs(name, shared=True)(None))
    try:
        outputs = [flat(m(*args)) for m in models]
    except (RuntimeError, ValueError, IndexError) as error:
        with pytest.raises(type(error)):
            ensemble(*args)
        return
    expected = [torch.stack(parts) for parts in zip(*outputs)]
    got = flat(ensemble(*args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def _random_conv_transpose(seed: int):
    """A transposed convolution with a random configuration (valid for torch)."""
    rng = torch.Generator().manual_seed(seed)

    def pick(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (), generator=rng))

    dims = pick(1, 3)
    groups = pick(1, 2)
    stride, dilation = pick(1, 3), pick(1, 2)
    layer = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[dims - 1](
        groups * pick(1, 2),
        groups * pick(1, 2),
        pick(1, 3),
        stride=stride,
        padding=pick(0, 1),
        output_padding=pick(0, max(stride, dilation) - 1),
        groups=groups,
        dilation=dilation,
        bias=bool(pick(0, 1)),
    )
    size = 3 if dims == 3 else 4
    batch = () if pick(0, 3) == 0 else (2,)  # sometimes one unbatched sample per member
    return layer, (*batch, layer.in_channels, *(size,) * dims)


@pytest.mark.parametrize("seed", range(12))
def test_random_conv_transpose_configurations_match_loop(seed):
    models = members(lambda: _random_conv_transpose(seed)[0])
    shape = _random_conv_transpose(seed)[1]
    torch.manual_seed(seed)
    x = torch.randn(MEMBERS, *shape)
    check_against_loop(models, lambda i: (x[0].clone().requires_grad_(),) if i is None else (x[i],))
    check_against_loop(models, lambda i: (x[0],) if i is None else (x[i],), in_dims=0)


@pytest.mark.parametrize("index", [slice(0, 3, 2), [2, 0], 1])
def test_selected_members_update_their_own_running_statistics(index):
    """A selection (strided views, a gather, one member) in train mode moves the
    selected members' instance-norm statistics only, as those members alone would."""
    models = _models("instance_norm2d_tracked")
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(2, 3, 4, 5)
    if isinstance(index, int):
        picked = [index]
    elif isinstance(index, list):
        picked = index
    else:
        picked = list(range(MEMBERS))[index]
    out = ensemble[index](x)
    expected = torch.stack([models[k](x) for k in picked])
    torch.testing.assert_close(out.reshape(expected.shape), expected)
    state = ensemble.state_dict()
    for key in ("running_mean", "running_var"):
        reference = torch.stack([m.state_dict()[key] for m in models])
        torch.testing.assert_close(state[f"stacked.{key}"], reference, msg=key)
