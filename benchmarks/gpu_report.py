"""Ensembles and optimizers on a CUDA device: tdfunc beside the alternatives, one table.

The pytest-benchmark files time the CPU. This script runs the same models on a GPU
(the first CUDA device) and prints a table of medians and ratios, after checking
that every contender computes the same numbers as a Python loop of ordinary modules
or ``torch.optim`` per member. GPU work is asynchronous, so every sample
synchronizes before reading the clock; each sample runs enough iterations to last
about 2 ms, and the median of 25 samples is reported.

    python benchmarks/gpu_report.py            # needs a CUDA device
    python benchmarks/gpu_report.py --json out.json

Ratios read "contender / tdfunc": above 1 means tdfunc is faster.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ensemble import (
    TutorialMLP,
    forward_of,
    make_mlp,
    train_step_of,
)
from bench_optim import handwritten_inplace_adam

from tdfunc import Ensemble, TensorDict, optim

DEVICE = torch.device("cuda")
SAMPLES = 25


def median_seconds(fn) -> float:
    """Median time of one call of ``fn``, synchronizing around each sample."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = max(time.perf_counter() - start, 1e-6)
    iterations = max(1, int(2e-3 / once))
    samples = []
    for _ in range(SAMPLES):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / iterations)
    return statistics.median(samples)


# name -> (members, batch, one member, input shape of one sample)
ENSEMBLES = {
    "N8-w32": (8, 16, lambda: make_mlp(32), (16,)),
    "N16-w128": (16, 64, lambda: make_mlp(128), (16,)),
    "tutorial": (10, 64, TutorialMLP, (1, 28, 28)),
    "N64-w512": (64, 256, lambda: make_mlp(512), (16,)),
    "N256-w64": (256, 128, lambda: make_mlp(64), (16,)),
}


def ensemble_rows(name: str) -> list[dict]:
    members, batch, make, sample = ENSEMBLES[name]
    torch.manual_seed(0)
    models = [make().to(DEVICE) for _ in range(members)]
    x = torch.randn(batch, *sample, device=DEVICE)
    with torch.no_grad():
        expected = torch.stack([m(x) for m in models])
    rows = []
    times = {}
    for kind in ["tdfunc_ensemble", "tdfunc_vmap", "torch_func", "loop", "baddbmm"]:
        forward = forward_of(kind, models, x)
        torch.testing.assert_close(forward().detach(), expected, rtol=1e-3, atol=1e-4)
        times[kind] = median_seconds(forward)
    rows.append({"group": f"forward {name}", **times})
    times = {}
    for kind in ["tdfunc_ensemble", "torch_func", "loop", "baddbmm"]:
        step = train_step_of(kind, copy.deepcopy(models), x)
        times[kind] = median_seconds(step)
    rows.append({"group": f"train {name}", **times})
    return rows


def check_ensemble_gradients() -> None:
    """One backward through the Ensemble gives each member the loop's gradients."""
    torch.manual_seed(1)
    models = [make_mlp(64).to(DEVICE) for _ in range(8)]
    x = torch.randn(32, 16, device=DEVICE)
    loop = copy.deepcopy(models)
    for m in loop:
        m(x).square().sum().backward()
    ensemble = Ensemble(*models)
    ensemble(x).square().sum().backward()
    stacked = ensemble.params
    for i, member in enumerate(loop):
        for name, p in member.named_parameters():
            q = stacked[tuple(name.split("."))]
            torch.testing.assert_close(q.grad[i], p.grad, rtol=1e-4, atol=1e-4, msg=name)


MEMBERS = 64


def optim_rows() -> list[dict]:
    torch.manual_seed(0)

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                             nn.Linear(64, 1)).to(DEVICE)  # fmt: skip

    members = [mlp() for _ in range(MEMBERS)]
    lrs = torch.logspace(-4, -1, MEMBERS, device=DEVICE)
    generator = torch.Generator(device=DEVICE).manual_seed(1)

    # correctness: 3 steps of tdfunc.optim.Adam == torch.optim.Adam per member
    ensemble = Ensemble(*copy.deepcopy(members))
    reference = copy.deepcopy(members)
    opt = optim.Adam(ensemble.parameters(), lr=lrs)
    ref_opts = [torch.optim.Adam(m.parameters(), lr=lr) for m, lr in zip(reference, lrs.tolist())]
    for _ in range(3):
        for p in ensemble.parameters():
            p.grad = torch.randn(p.shape, device=DEVICE, generator=generator)
        for i, m in enumerate(reference):
            for p, q in zip(m.parameters(), ensemble.parameters()):
                p.grad = q.grad[i].clone()
        opt.step()
        for o in ref_opts:
            o.step()
    for i, m in enumerate(reference):
        for p, q in zip(m.parameters(), ensemble.parameters()):
            torch.testing.assert_close(q[i], p, rtol=1e-5, atol=1e-6)

    times = {"tdfunc_optim_Adam": median_seconds(opt.step)}
    models = copy.deepcopy(members)
    per_member = []
    for lr, model in zip(lrs.tolist(), models):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, device=DEVICE, generator=generator)
        per_member.append(torch.optim.Adam(model.parameters(), lr=lr, foreach=True))
    times["torch_optim_x64"] = median_seconds(lambda: [o.step() for o in per_member])
    stacked = [p.detach() for p in Ensemble(*copy.deepcopy(members)).parameters()]
    grads = [torch.randn(p.shape, device=DEVICE, generator=generator) for p in stacked]
    times["handwritten_foreach"] = median_seconds(
        handwritten_inplace_adam(
            stacked,
            grads,
            [torch.zeros_like(p) for p in stacked],
            [torch.zeros_like(p) for p in stacked],
            lrs,
        )
    )
    rows = [{"group": "adam-ensemble N64", **times}]

    params = TensorDict.from_modules(*members).detach()
    grads_td = params.apply(lambda t: torch.randn(t.shape, device=DEVICE, generator=generator))
    functional = optim.adam(lr=lrs)
    state = functional.init(params)

    def functional_step():
        updates, new_state = functional.update(grads_td, state, params)
        return optim.apply_updates(params, updates), new_state

    rows.append(
        {"group": "adam-functional N64", "tdfunc_functional": median_seconds(functional_step)}
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_report.py needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False  # compare float32 with float32
    check_ensemble_gradients()
    rows = []
    for name in ENSEMBLES:
        rows += ensemble_rows(name)
    rows += optim_rows()
    print(f"device: {torch.cuda.get_device_name()} | torch {torch.__version__}")
    for row in rows:
        group, times = row["group"], {k: v for k, v in row.items() if k != "group"}
        base = next(iter(times.values()))
        cells = "  ".join(f"{k} {v * 1e6:8.1f}us ({v / base:4.2f}x)" for k, v in times.items())
        print(f"{group:22s} {cells}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
