"""The per-member affine layer norm of the transformer layers: first and second derivatives."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from member_loop import members
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from tdfunc import Ensemble
from tdfunc._ensemble.affine_norm import affine_layer_norm


def _plain(x, shape, weight, bias, eps):
    return torch.addcmul(bias, F.layer_norm(x, shape, None, None, eps), weight)


def test_matches_the_composition_with_first_and_second_derivatives():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 1, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(3, 1, 5, dtype=torch.float64, requires_grad=True)
    inputs = (x, weight, bias)
    torch.testing.assert_close(
        affine_layer_norm(x, (5,), weight, bias, 1e-5), _plain(x, (5,), weight, bias, 1e-5)
    )

    def function(*tensors):
        return affine_layer_norm(tensors[0], (5,), tensors[1], tensors[2], 1e-5)

    assert torch.autograd.gradcheck(function, inputs)
    assert torch.autograd.gradgradcheck(function, inputs)


@sdpa_kernel(SDPBackend.MATH)  # the fused CPU kernel has no second derivative, in a loop too
def test_second_order_gradients_of_an_encoder_layer_match_the_loop():
    """A meta-learning step: the gradient of a function of the gradients."""
    models = members(lambda: nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True))
    ensemble = Ensemble(*copy.deepcopy(models))
    x = torch.randn(2, 3, 4)
    params = list(ensemble.parameters())
    grads = torch.autograd.grad(ensemble(x).square().sum(), params, create_graph=True)
    outer = torch.autograd.grad(sum(g.square().sum() for g in grads), params)
    for name, got in zip([n for n, _ in ensemble.named_parameters()], outer):
        name = name[len("stacked.") :]
        expected = []
        for model in models:
            p = dict(model.named_parameters())
            inner = torch.autograd.grad(model(x).square().sum(), list(p.values()),
                                        create_graph=True)  # fmt: skip
            second = torch.autograd.grad(sum(g.square().sum() for g in inner), p[name])
            expected.append(second[0])
        torch.testing.assert_close(got, torch.stack(expected), atol=1e-4, rtol=1e-3, msg=name)


def test_in_place_relu_of_the_feed_forward_has_torch_s_derivatives():
    from tdfunc._ensemble.transformer import owned_gradient_relu

    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)

    def function(x, weight):  # the consumer hands over a gradient of its own, as linear2's
        return owned_gradient_relu(x * 1.5) @ weight

    assert torch.autograd.gradcheck(function, (x, weight))
    assert torch.autograd.gradgradcheck(function, (x, weight))
