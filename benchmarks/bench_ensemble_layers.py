"""Ensembles of convolutional members: tdfunc's ``Ensemble`` beside torch.func and a loop.

Models (a batch of inputs shared by the members, gradient recording on):

- ``autoencoder``: a small CNN autoencoder on ``1 x 16 x 16`` images (``Conv2d``,
  ``MaxPool2d``, ``ConvTranspose2d``, ``Upsample``), 8 members, batch 16;
- ``instance_norm``: ``Conv1d`` -> ``InstanceNorm1d`` (affine, running statistics)
  -> ``ReLU`` -> ``Conv1d`` on 4 channels of length 32, 8 members, batch 16.

Contenders of one group: ``tdfunc_ensemble`` (``Ensemble(*models)``, batched
kernels), ``torch_func`` (``stack_module_state`` + ``functional_call`` in ``vmap``;
``vmap(grad(loss))`` for the training step) and ``loop``
(``torch.stack([m(x) for m in models])``; each member's backward in turn). The
``train`` groups time one forward and backward of the summed squared outputs.

Target: the ensemble no slower than the loop and faster than torch.func, forward and
training step. Read ratios of medians from one run; on a shared machine, prefer
the interleaved timing of this file run as a script (contenders alternate call
by call in one process, CPU time of the thread, one thread)::

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_ensemble_layers.py --benchmark-enable -q
    OMP_NUM_THREADS=1 python benchmarks/bench_ensemble_layers.py [repetitions]
"""

from __future__ import annotations

import copy
import functools
import sys

import contenders
import pytest
import torch
from ratios import interleaved_medians
from torch import nn

from tdfunc import Ensemble


def autoencoder() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.ConvTranspose2d(16, 8, 2, stride=2),
        nn.ReLU(),
        nn.Upsample(scale_factor=2),
        nn.Conv2d(8, 1, 3, padding=1),
    )


def instance_norm() -> nn.Module:
    return nn.Sequential(
        nn.Conv1d(4, 16, 3, padding=1),
        nn.InstanceNorm1d(16, affine=True, track_running_stats=True),
        nn.ReLU(),
        nn.Conv1d(16, 4, 3, padding=1),
    )


# name -> (members, batch, make one member, input shape of one sample)
CONFIGS = {
    "autoencoder": (8, 16, autoencoder, (1, 16, 16)),
    "instance_norm": (8, 16, instance_norm, (4, 32)),
}
KINDS = ("tdfunc_ensemble", "torch_func", "loop")


@functools.lru_cache
def setup(config: str):
    members, batch, make, sample = CONFIGS[config]
    torch.manual_seed(0)
    models = [make() for _ in range(members)]
    return models, torch.randn(batch, *sample)


def forward_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable computing every member's output with ``kind``."""
    if kind == "tdfunc_ensemble":  # what this file measures: every layer batched
        ensemble = Ensemble(*models)
        assert "vmapped" not in ensemble.batched_summary, ensemble.batched_summary
        return lambda: ensemble(x)
    return contenders.forward_of(kind, models, x)


def train_step_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable: one forward and backward of every member's loss."""
    return contenders.train_step_of(kind, models, x)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_forward(benchmark, config, kind):
    benchmark.group = f"ensemble_layers_forward[{config}]"
    models, x = setup(config)
    models = copy.deepcopy(models)  # running statistics move in train mode
    reference = copy.deepcopy(models)
    out = benchmark(forward_of(kind, models, x))
    with torch.no_grad():
        expected = torch.stack([m(x) for m in reference])
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_train_step(benchmark, config, kind):
    benchmark.group = f"ensemble_layers_train_step[{config}]"
    models, x = setup(config)
    benchmark(train_step_of(kind, copy.deepcopy(models), x))


def interleaved(repetitions: int = 200) -> str:
    """Ratios of medians, the contenders alternating call by call (thread CPU time)."""
    torch.set_num_threads(1)
    lines = ["| model | step | loop / Ensemble | torch.func / Ensemble | Ensemble (µs) |",
             "|---|---|---|---|---|"]  # fmt: skip
    for config in CONFIGS:
        models, x = setup(config)
        for step, make in (("forward", forward_of), ("train", train_step_of)):
            calls = {kind: make(kind, copy.deepcopy(models), x) for kind in KINDS}
            # warm-up (plans, allocator), then one call per contender per round
            median = interleaved_medians(calls, repetitions, warmup=5)
            mine = median["tdfunc_ensemble"]
            lines.append(
                f"| {config} | {step} | {median['loop'] / mine:.2f} | "
                f"{median['torch_func'] / mine:.2f} | {mine * 1e6:.0f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(interleaved(int(sys.argv[1]) if len(sys.argv) > 1 else 200))
