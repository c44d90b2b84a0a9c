"""Ensembles of transformers: tdfunc beside a loop, torch.func and a hand-written batched form.

Model (one member): ``nn.TransformerEncoder`` of 2 ``nn.TransformerEncoderLayer(D, 4,
2 * D, dropout=0, batch_first=True)`` and a ``Linear(D, 1)`` head, in the sizes
``(N, B, T, D)`` = (members, batch, tokens, width) of ``CONFIGS``. A batch of inputs
``[B, T, D]`` is shared by all members; the parameters require grad. Contenders
(one ``group`` per operation and size; read ratios of medians from one run):

- ``tdfunc_ensemble``: ``tdfunc.Ensemble(*models)(x)``: batched projections
  (``baddbmm`` over the stacked weights) and one fused attention call for all members;
- ``torch_func``: ``stack_module_state`` + ``functional_call`` in ``vmap`` (the
  training step: ``vmap(grad(loss))``);
- ``loop``: ``torch.stack([m(x) for m in models])`` (the training step backpropagates
  each member's loss);
- ``batched_by_hand``: the same model written by hand over stacked, pre-transposed
  weights: ``baddbmm`` projections and one ``scaled_dot_product_attention`` call.

Targets (CPU, one thread, ratios of medians in one run): at ``N8-B8-T8-D32`` the
ensemble at least 3x the loop and 2x torch.func, at the two larger sizes at least 1.0x
the loop and 1.5x torch.func, forward and training step; the peak memory of a
training step at most 1.1x the loop's.

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_ensemble_transformer.py \\
        --benchmark-enable -q

Run as a script, the file measures the same contenders interleaved in one process
(CPU time of the thread, medians over rounds) and the peak memory of a training
step (the most bytes allocated at once, from the profiler's allocation records);
``--json`` keeps every sample for the figure of the benchmark page:

    python benchmarks/bench_ensemble_transformer.py --json transformer.json
    python benchmarks/plot_report.py --transformer transformer.json --out docs/img
"""

from __future__ import annotations

import argparse
import copy
import datetime
import functools
import json
import statistics
from pathlib import Path

import contenders
import pytest
import torch
import torch.nn.functional as F
from ratios import interleaved_samples, machine
from torch import nn

from tdfunc import Ensemble

HEADS = 4
# name -> (members N, batch B, tokens T, width D)
CONFIGS = {
    "N8-B8-T8-D32": (8, 8, 8, 32),
    "N8-B16-T32-D64": (8, 16, 32, 64),
    "N32-B16-T32-D64": (32, 16, 32, 64),
}
SMALL = "N8-B8-T8-D32"
KINDS = ("tdfunc_ensemble", "torch_func", "loop", "batched_by_hand")


def make_model(width: int) -> nn.Module:
    layer = nn.TransformerEncoderLayer(width, HEADS, 2 * width, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 2), nn.Linear(width, 1))


@functools.lru_cache
def setup(config: str):
    """Members, shared input and the loop's reference output for one configuration."""
    members, batch, tokens, width = CONFIGS[config]
    torch.manual_seed(0)
    models = [make_model(width) for _ in range(members)]
    x = torch.randn(batch, tokens, width)
    with torch.no_grad():
        expected = torch.stack([m(x) for m in models])
    return models, x, expected


def _stacked(tensors) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors]).contiguous().requires_grad_()


def batched_by_hand(models: list):
    """The model over stacked weights: ``baddbmm`` projections, one fused attention."""
    layers = []
    for index in range(len(models[0][0].layers)):
        parts = [m[0].layers[index] for m in models]

        def stack(read, parts=parts):
            return _stacked(read(p) for p in parts)

        layers.append(
            {
                "w_in": stack(lambda p: p.self_attn.in_proj_weight.mT),
                "b_in": stack(lambda p: p.self_attn.in_proj_bias[None]),
                "w_out": stack(lambda p: p.self_attn.out_proj.weight.mT),
                "b_out": stack(lambda p: p.self_attn.out_proj.bias[None]),
                "w_1": stack(lambda p: p.linear1.weight.mT),
                "b_1": stack(lambda p: p.linear1.bias[None]),
                "w_2": stack(lambda p: p.linear2.weight.mT),
                "b_2": stack(lambda p: p.linear2.bias[None]),
                "g_1": stack(lambda p: p.norm1.weight[None]),
                "n_1": stack(lambda p: p.norm1.bias[None]),
                "g_2": stack(lambda p: p.norm2.weight[None]),
                "n_2": stack(lambda p: p.norm2.bias[None]),
            }
        )
    head_w = _stacked(m[1].weight.mT for m in models)
    head_b = _stacked(m[1].bias[None] for m in models)

    def forward(x):
        n, (batch, tokens, width) = head_w.shape[0], x.shape
        h = x.expand(n, batch, tokens, width).reshape(n, batch * tokens, width)
        for p in layers:
            qkv = torch.baddbmm(p["b_in"], h, p["w_in"]).view(n * batch, tokens, 3, HEADS, -1)
            q, k, v = qkv.transpose(1, 3).unbind(2)  # [N * B, H, T, D / H] each
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
            a = torch.baddbmm(p["b_out"], a.reshape(n, batch * tokens, width), p["w_out"])
            h = torch.addcmul(p["n_1"], F.layer_norm(h + a, (width,)), p["g_1"])
            f = torch.baddbmm(p["b_2"], torch.relu(torch.baddbmm(p["b_1"], h, p["w_1"])), p["w_2"])
            h = torch.addcmul(p["n_2"], F.layer_norm(h + f, (width,)), p["g_2"])
        return torch.baddbmm(head_b, h, head_w).view(n, batch, tokens, 1)

    params = [t for p in layers for t in p.values()] + [head_w, head_b]
    return forward, params


def forward_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable computing every member's output with ``kind``."""
    if kind == "batched_by_hand":
        return functools.partial(batched_by_hand(models)[0], x)
    return contenders.forward_of(kind, models, x)


def train_step_of(kind: str, models: list, x: torch.Tensor):
    """A zero-argument callable: forward and backward of every member's loss."""
    if kind == "batched_by_hand":
        forward, _ = batched_by_hand(models)
        return lambda: forward(x).square().sum().backward()
    return contenders.train_step_of(kind, models, x)


def skip_large_unless_enabled(request, config: str) -> None:
    # The suite runs every benchmark once with timing off (a smoke test): the small
    # size checks the contenders; the large ones take minutes and run when timed.
    options = request.config.getoption
    if config != SMALL and options("benchmark_disable") and not options("benchmark_enable"):
        pytest.skip("a large size: run with --benchmark-enable")


# ---------------------------------------------------------------- forward
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_forward(benchmark, request, config, kind):
    skip_large_unless_enabled(request, config)
    benchmark.group = f"transformer_ensemble_forward[{config}]"
    models, x, expected = setup(config)
    out = benchmark(forward_of(kind, models, x))
    torch.testing.assert_close(out.detach(), expected, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- training step
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS)
def test_train_step(benchmark, request, config, kind):
    skip_large_unless_enabled(request, config)
    benchmark.group = f"transformer_ensemble_train_step[{config}]"
    models, x, _ = setup(config)
    models = copy.deepcopy(models)  # the loop accumulates gradients in its models
    benchmark(train_step_of(kind, models, x))


# ---------------------------------------------------------------- peak memory
def peak_memory(step, parameters) -> int:
    """Peak bytes allocated during one call of ``step`` (the profiler's allocation
    records, summed in time order; gradients are reset first: allocated anew)."""
    step()  # plans, derived views and caches are made once, before
    for p in parameters:
        p.grad = None
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profiler:
        step()
    records = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for record in sorted(records, key=lambda e: e.start_ns()):
        live += record.nbytes()
        peak = max(peak, live)
    return peak


def memory_ratio(config: str) -> tuple[int, int]:
    """Peak bytes of a training step, one backward for all members: (loop, ensemble)."""
    models, x, _ = setup(config)
    models = copy.deepcopy(models)
    ensemble = Ensemble(*copy.deepcopy(models))
    # All the members' graphs alive at once, as in one backward of the summed losses (a
    # loop that backpropagates member by member holds one member's graph at a time).
    loop_bytes = peak_memory(
        lambda: sum(m(x).square().sum() for m in models).backward(),
        [p for m in models for p in m.parameters()],
    )
    ensemble_bytes = peak_memory(
        lambda: ensemble(x).square().sum().backward(), list(ensemble.parameters())
    )
    return loop_bytes, ensemble_bytes


@pytest.mark.parametrize("config", list(CONFIGS))
def test_train_step_peak_memory(benchmark, request, config):
    """Records the peak-memory ratio (ensemble / loop) in the benchmark's extra info."""
    skip_large_unless_enabled(request, config)
    benchmark.group = f"transformer_ensemble_memory[{config}]"
    loop_bytes, ensemble_bytes = memory_ratio(config)
    benchmark.extra_info["loop_bytes"] = loop_bytes
    benchmark.extra_info["ensemble_bytes"] = ensemble_bytes
    benchmark.extra_info["ratio"] = ensemble_bytes / loop_bytes
    benchmark(lambda: None)


# ---------------------------------------------------------------- as a script


def main(rounds: int = 7, json_path: str | None = None) -> None:
    torch.set_num_threads(1)
    record: dict = {
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "torch": torch.__version__,
        "timer": "time.thread_time_ns, one thread, contenders interleaved in each round",
        "configs": {},
    }
    for config in CONFIGS:
        models, x, _ = setup(config)
        models = copy.deepcopy(models)
        repetitions = 10 if config == SMALL else 3
        samples = {}
        for what, make in (("forward", forward_of), ("train step", train_step_of)):
            calls = {kind: make(kind, models, x) for kind in KINDS}
            # interleaved: each round times every contender `repetitions` times
            samples[what] = interleaved_samples(calls, rounds, samples=repetitions)
        loop_bytes, ensemble_bytes = memory_ratio(config)
        record["configs"][config] = {
            **samples,
            "peak memory": {"loop": loop_bytes, "tdfunc_ensemble": ensemble_bytes},
        }
        print(f"{config}: peak memory of a training step, ensemble / loop "
              f"{ensemble_bytes / loop_bytes:.2f} ({ensemble_bytes / 2**20:.1f} MiB)")  # fmt: skip
        for what, times in samples.items():
            medians = {kind: statistics.median(t) for kind, t in times.items()}
            ours = medians["tdfunc_ensemble"]
            ratios = ", ".join(
                f"{kind} / ensemble {medians[kind] / ours:.2f}"
                for kind in KINDS
                if kind != "tdfunc_ensemble"
            )
            print(f"  {what}: ensemble {ours * 1e3:.2f} ms; {ratios}")
    if json_path:
        Path(json_path).write_text(json.dumps(record, indent=1))
        print(f"wrote {json_path} (draw it: benchmarks/plot_report.py --transformer {json_path})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Ensembles of transformers, interleaved.")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write every sample and the peak memory here")
    arguments = parser.parse_args()
    main(arguments.rounds, arguments.json)
