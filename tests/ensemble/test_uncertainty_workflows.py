"""Deep ensembles for uncertainty, against a loop of ordinary modules.

Members mix batch norm, dropout and layer norm. Where the random numbers can be
matched (one random layer: ``randomness="different"`` draws the members' masks in
one call, in the order a loop of modules draws them one member after another), the
ensemble trained with ``torch.optim`` or ``tdfunc.optim`` equals the loop trained
with ``torch.optim`` exactly; ``vmap`` with either randomness equals
``torch.func.vmap`` over ``stack_module_state`` dicts, for any number of random layers.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

import tdfunc
from tdfunc import Ensemble

N = 3
LRS = torch.tensor([1e-3, 1e-2, 5e-2])


def member() -> nn.Module:
    # no bias before batch norm: its gradient is rounding noise that Adam would amplify
    return nn.Sequential(
        nn.Linear(5, 16, bias=False),
        nn.BatchNorm1d(16),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(16, 16),
        nn.LayerNorm(16),
        nn.Tanh(),
        nn.Linear(16, 2),
    )


def members() -> list[nn.Module]:
    torch.manual_seed(0)
    return [member() for _ in range(N)]


def assert_members_equal(ens: Ensemble, loop: list[nn.Module]) -> None:
    states = ens.member_state_dicts()
    for k, module in enumerate(loop):
        for name, value in module.state_dict().items():
            torch.testing.assert_close(
                states[k][name], value, rtol=1e-4, atol=1e-5, msg=f"member {k}, {name}"
            )


OPTIMIZERS = [
    (torch.optim.Adam, tdfunc.optim.Adam, {"weight_decay": 1e-2}),
    (torch.optim.AdamW, tdfunc.optim.AdamW, {"weight_decay": 1e-2}),
    (torch.optim.SGD, tdfunc.optim.SGD, {"momentum": 0.9, "nesterov": True}),
]


@pytest.mark.parametrize("stateful", ["torch", "tdfunc"])
@pytest.mark.parametrize(("torch_opt", "tdfunc_opt", "options"), OPTIMIZERS)
def test_training_with_batch_norm_and_dropout_matches_a_loop(
    stateful, torch_opt, tdfunc_opt, options
):
    models = members()
    ens, loop = Ensemble(*copy.deepcopy(models)), copy.deepcopy(models)
    if stateful == "tdfunc":  # one learning rate per member
        opt = tdfunc_opt(ens.parameters(), lr=LRS, **options)
        lrs = LRS.tolist()
    else:
        opt = torch_opt(ens.parameters(), lr=1e-2, **options)
        lrs = [1e-2] * N
    loop_opts = [torch_opt(m.parameters(), lr=lr, **options) for m, lr in zip(loop, lrs)]
    g = torch.Generator().manual_seed(0)
    for step in range(5):
        x, y = torch.randn(N, 16, 5, generator=g), torch.randn(N, 16, 2, generator=g)
        torch.manual_seed(step)
        losses = ((ens(x, in_dims=0) - y) ** 2).mean(dim=(1, 2))
        opt.zero_grad()
        losses.sum().backward()
        opt.step()
        torch.manual_seed(step)  # the masks drawn member after member
        outs = [m(x[k]) for k, m in enumerate(loop)]
        for k, out in enumerate(outs):
            loop_opts[k].zero_grad()
            ((out - y[k]) ** 2).mean().backward()
            loop_opts[k].step()
    assert_members_equal(ens, loop)

    # predictions in eval mode: the mean and spread a deep ensemble reports
    ens.eval()
    grid = torch.linspace(-3, 3, 40).unsqueeze(-1).expand(40, 5)
    with torch.no_grad():
        predictions = ens(grid)
        expected = torch.stack([m.eval()(grid) for m in loop])
    torch.testing.assert_close(predictions.mean(0), expected.mean(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(predictions.std(0), expected.std(0), rtol=1e-4, atol=1e-5)


def test_selected_members_train_their_batch_norm_statistics_like_a_loop():
    models = members()
    for model in models:
        model[3].p = 0.0
    ens, loop = Ensemble(*copy.deepcopy(models)), copy.deepcopy(models)
    chosen = [2, 0]
    x = torch.randn(2, 16, 5)
    out = ens[chosen](x, in_dims=0)
    expected = torch.stack([loop[k](x[i]) for i, k in enumerate(chosen)])
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert_members_equal(ens, loop)  # member 1's statistics untouched, as in the loop

    ens.eval()
    params = ens.params.detach().clone()
    with torch.no_grad():
        through_call = ens.functional_call(params[chosen], x, in_dims=0)
        expected = torch.stack([loop[k].eval()(x[i]) for i, k in enumerate(chosen)])
    torch.testing.assert_close(through_call, expected, rtol=1e-4, atol=1e-5)


ARCHITECTURES = {
    "batch norm then dropout": lambda: nn.Sequential(
        nn.Linear(5, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Linear(16, 2)
    ),
    "two dropouts": lambda: nn.Sequential(
        nn.Linear(5, 16), nn.Dropout(0.3), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 2)
    ),
    "channel dropout": lambda: nn.Sequential(
        nn.Linear(5, 16),
        nn.BatchNorm1d(16),
        nn.Unflatten(1, (4, 4)),
        nn.Dropout1d(0.3),
        nn.Flatten(),
        nn.Linear(16, 2),
    ),
}


@pytest.mark.parametrize("randomness", ["different", "same"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_random_layers_draw_what_torch_func_vmap_draws(arch, randomness):
    torch.manual_seed(0)
    models = [ARCHITECTURES[arch]() for _ in range(N)]
    ens = Ensemble(*copy.deepcopy(models), randomness=randomness)
    params, buffers = stack_module_state(copy.deepcopy(models))
    base = copy.deepcopy(models[0])

    def run(p, b, x):
        return functional_call(base, (p, b), (x,))

    x = torch.randn(8, 5)
    torch.manual_seed(5)
    out = ens(x)
    torch.manual_seed(5)
    expected = vmap(run, (0, 0, None), randomness=randomness)(params, buffers, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_functional_training_with_vmap_grad_matches_a_loop():
    torch.manual_seed(0)
    models = [
        nn.Sequential(nn.Linear(5, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 2))
        for _ in range(N)
    ]
    ens, loop = Ensemble(*copy.deepcopy(models)), copy.deepcopy(models)
    params = ens.params.detach().clone()
    opt = tdfunc.optim.adam(lr=LRS)
    state = opt.init(params)
    x, y = torch.randn(N, 16, 5), torch.randn(N, 16, 2)

    def loss(p, x, y):
        return ((ens.call_member(p, x) - y) ** 2).mean()

    for _ in range(4):
        updates, state = opt.update(vmap(grad(loss))(params, x, y), state, params)
        params = tdfunc.optim.apply_updates(params, updates)
    loop_opts = [torch.optim.Adam(m.parameters(), lr=lr) for m, lr in zip(loop, LRS.tolist())]
    for _ in range(4):
        for k, m in enumerate(loop):
            loop_opts[k].zero_grad()
            ((m(x[k]) - y[k]) ** 2).mean().backward()
            loop_opts[k].step()
    for k, m in enumerate(loop):
        for name, value in m.named_parameters():
            torch.testing.assert_close(params[k][tuple(name.split("."))], value)
