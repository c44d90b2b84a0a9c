"""Ensembles at the sizes RL and uncertainty users run, beside what they write without tdfunc.

Cases (members, hidden layers x width, activation, batch, input, output):

- ``pets``: mbrl-lib's probabilistic ensemble, 7 members, 4 x 200 SiLU, batch 256
  per member (bootstrap batches: ``in_dims=0``), mean and log-variance heads; the
  training step is the Gaussian NLL with learned log-variance bounds shared by
  the members;
- ``sac``: twin critics, 2 members, 2 x 256 ReLU, batch 256 (shared input);
- ``redq``: 10 critics, 2 x 256 ReLU, batch 256; and ``redq_target``: the
  target's min over 2 of the 10 members drawn at random each call;
- ``deep``: a deep ensemble, 5 members, 3 x 100 ReLU, batch 128.

Contenders of one group (read ratios of medians from one run):

- ``ensemble``: ``tdfunc.Ensemble`` (``ens[idx]`` for the 2-of-10 target);
- ``hand``: the layer users write by hand: stacked weights ``[N, in, out]`` and
  ``torch.baddbmm`` (mbrl-lib's ``EnsembleLinearLayer``);
- ``torch_func``: ``stack_module_state`` + ``vmap(functional_call)``;
- ``loop``: a Python loop over ordinary modules (for the 2-of-10 target: a loop
  over the 2 chosen members only, the floor users compare with).

``train`` groups time forward, loss, backward and an Adam step. The ``recurrent``
family times forward and backward of GRU critics (hidden 64, 32 steps, batch 16) for
4 to 64 members against a loop over the members (torch's fused kernel per member;
``vmap`` cannot run it: there is no batching rule). The
``overhead`` family times the forward of an MLP 32-32-32-1 at batch 16 for 1 to
256 members against a hand-written ``baddbmm`` chain (pre-transposed weights).

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_ensemble_rl.py --benchmark-enable \\
        --benchmark-json=/tmp/rl.json -q
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state

from tdfunc import Ensemble

torch.set_num_threads(1)

# name -> (members, hidden layers, width, activation, batch, in, out, per-member inputs)
CASES = {
    "pets": (7, 4, 200, nn.SiLU, 256, 18, 28, True),
    "sac": (2, 2, 256, nn.ReLU, 256, 23, 1, False),
    "redq": (10, 2, 256, nn.ReLU, 256, 23, 1, False),
    "deep": (5, 3, 100, nn.ReLU, 128, 8, 1, False),
}
CONTENDERS = ("ensemble", "hand", "torch_func", "loop")


def make_mlp(hidden: int, width: int, activation, inputs: int, outputs: int) -> nn.Sequential:
    layers, size = [], inputs
    for _ in range(hidden):
        layers += [nn.Linear(size, width), activation()]
        size = width
    return nn.Sequential(*layers, nn.Linear(size, outputs))


@functools.lru_cache
def setup(case: str):
    members, hidden, width, activation, batch, inputs, outputs, per_member = CASES[case]
    torch.manual_seed(0)
    models = [make_mlp(hidden, width, activation, inputs, outputs) for _ in range(members)]
    x = torch.randn(members, batch, inputs) if per_member else torch.randn(batch, inputs)
    return models, x, per_member


class Hand(nn.Module):
    """The hand-written ensemble layer stack: ``baddbmm`` over stacked ``[N, in, out]``."""

    def __init__(self, models: list, activation) -> None:
        super().__init__()
        linears = [[m for m in model if isinstance(m, nn.Linear)] for model in models]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([ls[i].weight.detach().T for ls in linears]).contiguous())
            for i in range(len(linears[0]))
        )
        self.biases = nn.ParameterList(
            nn.Parameter(torch.stack([ls[i].bias.detach() for ls in linears]).unsqueeze(1))
            for i in range(len(linears[0]))
        )
        self.activation = activation()
        self.members = len(models)

    def forward(self, x, index=None):
        if x.dim() == 2:
            x = x.expand(self.members if index is None else len(index), *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if index is not None:
                w, b = w[index], b[index]
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = self.activation(x)
        return x


def contender(kind: str, case: str):
    """``(forward(x), parameters)`` of one contender for ``case``."""
    models, _, per_member = setup(case)
    models = copy.deepcopy(models)
    if kind == "ensemble":
        ensemble = Ensemble(*models, in_dims=0 if per_member else None)
        return ensemble, list(ensemble.parameters())
    if kind == "hand":
        hand = Hand(models, CASES[case][3])
        return hand, list(hand.parameters())
    if kind == "torch_func":
        params, buffers = stack_module_state(models)
        base = copy.deepcopy(models[0]).to("meta")

        def call(p, b, x):
            return functional_call(base, (p, b), (x,))

        vmapped = torch.vmap(call, in_dims=(0, 0, 0 if per_member else None))
        return (lambda x: vmapped(params, buffers, x)), list(params.values())
    if kind == "loop":
        if per_member:
            return (lambda x: torch.stack([m(x[k]) for k, m in enumerate(models)])), [
                p for m in models for p in m.parameters()
            ]
        return (lambda x: torch.stack([m(x) for m in models])), [
            p for m in models for p in m.parameters()
        ]
    raise ValueError(kind)


def loss_of(case: str, out: torch.Tensor, target: torch.Tensor, bounds) -> torch.Tensor:
    if case != "pets":
        return (out - target).square().mean(dim=(-2, -1)).sum()
    mean, logvar = out.chunk(2, dim=-1)  # bounded log-variance, the bounds shared
    low, high = bounds
    logvar = high - F.softplus(high - logvar)
    logvar = low + F.softplus(logvar - low)
    nll = ((mean - target) ** 2) * torch.exp(-logvar) + logvar
    return nll.mean(dim=(-2, -1)).sum() + 0.01 * (high.sum() - low.sum())


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", CONTENDERS)
def test_forward(benchmark, case, kind):
    benchmark.group = f"rl_forward[{case}]"
    forward, _ = contender(kind, case)
    models, x, per_member = setup(case)
    with torch.no_grad():
        expected = torch.stack([m(x[k] if per_member else x) for k, m in enumerate(models)])
    out = benchmark(forward, x)
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", CONTENDERS)
def test_train(benchmark, case, kind):
    benchmark.group = f"rl_train[{case}]"
    forward, params = contender(kind, case)
    models, x, _ = setup(case)
    outputs = CASES[case][6] // (2 if case == "pets" else 1)
    target = torch.randn(len(models), x.shape[-2], outputs)
    bounds = (
        nn.Parameter(-10 * torch.ones(1, outputs)),
        nn.Parameter(0.5 * torch.ones(1, outputs)),
    )
    optimizer = torch.optim.Adam([*params, *bounds], lr=1e-4)

    def step():
        optimizer.zero_grad()
        loss_of(case, forward(x), target, bounds).backward()
        optimizer.step()

    benchmark(step)


# ---------------------------------------------------------------- REDQ: 2 of 10 targets
@pytest.mark.parametrize("kind", ["ensemble", "ensemble_all", "hand", "torch_func", "loop"])
def test_redq_target(benchmark, kind):
    benchmark.group = "rl_forward[redq_target_2of10]"
    models, x, _ = setup("redq")
    generator = torch.Generator().manual_seed(0)
    forward, _ = contender("ensemble" if kind == "ensemble_all" else kind, "redq")

    if kind == "ensemble":

        def target(index):
            return forward[index](x)
    elif kind == "ensemble_all":  # all 10 members, then keep 2

        def target(index):
            return forward(x)[index]
    elif kind == "hand":

        def target(index):
            return forward(x, index)
    elif kind == "torch_func":
        params, buffers = stack_module_state(copy.deepcopy(models))
        base = copy.deepcopy(models[0]).to("meta")
        vmapped = torch.vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), (0, 0, None))

        def target(index):
            chosen = {k: v[index] for k, v in params.items()}
            return vmapped(chosen, {k: v[index] for k, v in buffers.items()}, x)
    else:

        def target(index):
            return torch.stack([models[k](x) for k in index.tolist()])

    def run():
        index = torch.randperm(10, generator=generator)[:2]
        with torch.no_grad():
            return target(index).min(dim=0).values

    benchmark(run)


# ---------------------------------------------------------------- forward overhead
OVERHEAD_MEMBERS = (1, 4, 16, 64, 256)


@functools.lru_cache
def overhead_setup(members: int):
    torch.manual_seed(0)
    models = [make_mlp(2, 32, nn.ReLU, 32, 1) for _ in range(members)]
    return models, torch.randn(16, 32)


def baddbmm_chain(models: list):
    weights, biases = [], []
    for i in (0, 2, 4):
        weights.append(
            torch.stack([m[i].weight.detach() for m in models]).mT.contiguous().requires_grad_()
        )
        biases.append(torch.stack([m[i].bias.detach() for m in models]).unsqueeze(1))
        biases[-1].requires_grad_()
    members = len(models)
    (w0, w1, w2), (b0, b1, b2) = weights, biases

    def forward(x):
        h = x.expand(members, *x.shape)
        h = torch.relu(torch.baddbmm(b0, h, w0))
        h = torch.relu(torch.baddbmm(b1, h, w1))
        return torch.baddbmm(b2, h, w2)

    return forward


@pytest.mark.parametrize("members", OVERHEAD_MEMBERS)
@pytest.mark.parametrize("kind", ["ensemble", "hand"])
def test_overhead(benchmark, members, kind):
    benchmark.group = f"ensemble_overhead[N{members}]"
    models, x = overhead_setup(members)
    forward = Ensemble(*copy.deepcopy(models)) if kind == "ensemble" else baddbmm_chain(models)
    out = benchmark(forward, x)
    assert out.shape == (members, 16, 1)


RECURRENT_MEMBERS = [4, 16, 64]


@pytest.mark.parametrize("members", RECURRENT_MEMBERS)
@pytest.mark.parametrize("kind", ["ensemble", "loop"])
def test_recurrent(benchmark, members, kind):
    benchmark.group = f"recurrent[N{members}]"
    torch.manual_seed(0)
    models = [nn.GRU(64, 64, batch_first=True) for _ in range(members)]
    x = torch.randn(16, 32, 64)
    if kind == "ensemble":
        ensemble = Ensemble(*copy.deepcopy(models))

        def step():
            ensemble(x)[0].sum().backward()

    else:

        def step():
            torch.stack([model(x)[0] for model in models]).sum().backward()

    benchmark(step)
