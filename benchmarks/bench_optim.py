"""tdfunc.optim against torch.optim, hand-written foreach/vmapped code and torchopt.

Groups (read ratios of medians within a group, from one run, one CPU thread):

- ``adam-ensemble``: one Adam step for N=64 members (MLP 8-64-64-1) with
  per-member learning rates: ``tdfunc.optim.Adam`` over an ``Ensemble``'s stacked
  parameters; 64 ``torch.optim.Adam(foreach=True)`` over 64 modules; a
  hand-written in-place foreach Adam over the stacked tensors (``baseline``:
  learning rates viewed ``[N, 1, ...]`` once, bias corrections folded into the
  kernels' scalar arguments, no step counters kept; tdfunc's step keeps
  ``torch.optim``'s per-parameter step counters and rounds ``lr / (1 - beta1**t)``
  per member exactly as ``torch.optim`` does).
- ``adam-amsgrad-ensemble``: the same Adam step with ``amsgrad=True`` (tdfunc's
  against 64 ``torch.optim.Adam(amsgrad=True, foreach=True)``): the check that every
  state has its running maximum runs where a state can lose it, not on every step.
- ``adam-functional``: the functional step ``update`` + ``apply_updates`` over a
  TensorDict of the same stacked parameters, per-member learning rates; the
  same out-of-place math in ``torch._foreach_*`` ops on a flat list (``baseline``).
  ``chain``: the same Adam spelled as a chain of transforms (one state per transform).
- ``adam-functional-scalar``: the same with one scalar learning rate, beside
  torchopt's functional ``adam`` (over a dict of the same tensors).
- ``maml-adam``: a MAML meta-gradient (5 differentiable inner Adam steps, 8
  sine tasks, MLP 1-40-40-1 with tanh): tdfunc's functional Adam under
  ``vmap`` over tasks; a loop over tasks with ``torch.autograd.grad(...,
  create_graph=True)`` and a hand-written Adam (``loop``); a hand-written
  Adam on plain tensors under ``vmap`` (``baseline``); torchopt's ``MetaAdam``
  in a loop over tasks (``torchopt``).

Every step allocates: ``conftest.py`` pins glibc's allocator (``mallopt``) so
that freed buffers are reused instead of returned to the OS and faulted in
again, and every benchmark warms up before timing.

    OMP_NUM_THREADS=1 python -m pytest benchmarks/bench_optim.py --benchmark-enable -q

pytest-benchmark times one contender after the other, so a change of load on a
shared machine lands on some of them only. Run as a script, the file times the
same contenders interleaved in one process instead: round by round, each
contender once per round, in CPU time of the thread (``time.thread_time_ns``),
and prints each group's medians with their interquartile ranges and the ratios
to tdfunc; ``--json`` writes the medians and quartiles in pytest-benchmark's
layout, which ``plot_report.py --optim`` draws::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_optim.py --json optim.json
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import grad, vmap

from tdfunc import Ensemble, TensorDict, functional_call, optim

torch.set_num_threads(1)

MEMBERS = 64
# steps of about a millisecond on a shared machine: many rounds, so that the medians settle
PEDANTIC = {"rounds": 200, "iterations": 1, "warmup_rounds": 20}


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 1))  # fmt: skip


def lrs() -> torch.Tensor:
    return torch.logspace(-4, -1, MEMBERS)


def make_members() -> list[nn.Module]:
    torch.manual_seed(0)
    return [mlp() for _ in range(MEMBERS)]


@pytest.fixture(scope="module")
def members():
    return make_members()


def fill_grads(parameters) -> None:
    generator = torch.Generator().manual_seed(1)
    for p in parameters:
        p.grad = torch.randn(p.shape, generator=generator)


# ------------------------------------------------------------------ adam-ensemble
def adam_ensemble_tdfunc(members):
    ensemble = Ensemble(*copy.deepcopy(members))
    fill_grads(ensemble.parameters())
    return optim.Adam(ensemble.parameters(), lr=lrs()).step


def adam_ensemble_torch_optim(members):
    models = copy.deepcopy(members)
    optimizers = []
    for lr, model in zip(lrs().tolist(), models):
        fill_grads(model.parameters())
        optimizers.append(torch.optim.Adam(model.parameters(), lr=lr, foreach=True))

    def step():
        for opt in optimizers:
            opt.step()

    return step


def test_adam_amsgrad_ensemble_tdfunc(benchmark, members):
    ensemble = Ensemble(*copy.deepcopy(members))
    fill_grads(ensemble.parameters())
    opt = optim.Adam(ensemble.parameters(), lr=lrs(), amsgrad=True)
    benchmark.group = "adam-amsgrad-ensemble"
    benchmark.pedantic(opt.step, **PEDANTIC)


def test_adam_amsgrad_ensemble_torch_optim(benchmark, members):
    models = copy.deepcopy(members)
    optimizers = []
    for lr, model in zip(lrs().tolist(), models):
        fill_grads(model.parameters())
        optimizers.append(torch.optim.Adam(model.parameters(), lr=lr, amsgrad=True, foreach=True))

    def step():
        for opt in optimizers:
            opt.step()

    benchmark.group = "adam-amsgrad-ensemble"
    benchmark.pedantic(step, **PEDANTIC)


def handwritten_inplace_adam(params, grads, exp_avg, exp_avg_sq, lr, beta1=0.9, beta2=0.999,
                             eps=1e-8):  # fmt: skip
    """The careful user's foreach Adam over stacked tensors, lr shaped [N, 1, ...].

    The per-member learning rates are viewed once; the bias corrections are
    Python numbers folded into the kernels' scalar arguments, so a step runs no
    small tensor operation at all.
    """
    step = [0]
    lr_views = [lr.view(-1, *(1,) * (p.dim() - 1)) for p in params]

    def run():
        step[0] += 1
        t = step[0]
        torch._foreach_lerp_(exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sq, beta2)
        torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sq)
        torch._foreach_div_(denom, (1 - beta2**t) ** 0.5)
        torch._foreach_add_(denom, eps)
        scaled = torch._foreach_mul(exp_avg, lr_views)
        torch._foreach_addcdiv_(params, scaled, denom, value=-1 / (1 - beta1**t))

    return run


def adam_ensemble_baseline(members):
    stacked = [p.detach() for p in Ensemble(*copy.deepcopy(members)).parameters()]
    generator = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=generator) for p in stacked]
    return handwritten_inplace_adam(
        stacked, grads, [torch.zeros_like(p) for p in stacked],
        [torch.zeros_like(p) for p in stacked], lrs(),
    )  # fmt: skip


def test_adam_ensemble_tdfunc(benchmark, members):
    benchmark.group = "adam-ensemble"
    benchmark.pedantic(adam_ensemble_tdfunc(members), **PEDANTIC)


def test_adam_ensemble_torch_optim(benchmark, members):
    benchmark.group = "adam-ensemble"
    benchmark.pedantic(adam_ensemble_torch_optim(members), **PEDANTIC)


def test_adam_ensemble_baseline(benchmark, members):
    benchmark.group = "adam-ensemble"
    benchmark.pedantic(adam_ensemble_baseline(members), **PEDANTIC)


# ------------------------------------------------------------------ adam-functional
def functional_inputs(members):
    params = TensorDict.from_modules(*members).detach()
    generator = torch.Generator().manual_seed(1)
    grads = params.apply(lambda t: torch.randn(t.shape, generator=generator))
    return params, grads


def tdfunc_functional(members, lr, build=optim.adam):
    params, grads = functional_inputs(members)
    opt = build(lr=lr)
    state = opt.init(params)
    _, state = opt.update(grads, state, params)  # non-zero moments

    def step():
        updates, new_state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), new_state

    return step


def foreach_functional(members, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    params, grads = functional_inputs(members)
    p_list = list(params.values(include_nested=True, leaves_only=True))
    g_list = list(grads.values(include_nested=True, leaves_only=True))
    m_list = [0.1 * g for g in g_list]
    v_list = [0.001 * g * g for g in g_list]
    step_t = torch.ones(MEMBERS)

    ranks = [p.dim() for p in p_list]
    distinct = sorted(set(ranks))

    def per_leaf(value):  # one [N, 1, ...] view per rank, shared by the leaves of that rank
        views = {rank: value.view(-1, *(1,) * (rank - 1)) for rank in distinct}
        return [views[rank] for rank in ranks]

    def step():
        t = (step_t + 1).double()
        bc1, bc2 = 1 - beta1**t, 1 - beta2**t
        wide_lr = lr.double() if isinstance(lr, torch.Tensor) else lr
        neg_views = per_leaf((-(wide_lr / bc1)).float())
        root_views = per_leaf(bc2.sqrt().float())
        m = torch._foreach_lerp(m_list, g_list, 1 - beta1)
        v = torch._foreach_mul(v_list, beta2)
        torch._foreach_addcmul_(v, g_list, g_list, value=1 - beta2)
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, root_views)
        torch._foreach_add_(denom, eps)
        updates = torch._foreach_mul(m, neg_views)
        torch._foreach_div_(updates, denom)
        return torch._foreach_add(p_list, updates), m, v

    return step


def adam_as_chain(lr):
    return optim.chain(
        optim.add_decayed_weights(0.0), optim.scale_by_adam(), optim.scale_by_learning_rate(lr)
    )


def torchopt_functional(torchopt, members, lr):
    params, grads = functional_inputs(members)
    names = [".".join(k) for k in params.keys(include_nested=True, leaves_only=True)]
    p_dict = dict(zip(names, params.values(include_nested=True, leaves_only=True)))
    g_dict = dict(zip(names, grads.values(include_nested=True, leaves_only=True)))
    opt = torchopt.adam(lr=lr)
    state = opt.init(p_dict)
    _, state = opt.update(g_dict, state, params=p_dict, inplace=False)

    def step():
        updates, new_state = opt.update(g_dict, state, params=p_dict, inplace=False)
        return torchopt.apply_updates(p_dict, updates, inplace=False), new_state

    return step


def test_adam_functional_tdfunc(benchmark, members):
    benchmark.group = "adam-functional"
    benchmark.pedantic(tdfunc_functional(members, lrs()), **PEDANTIC)


def test_adam_functional_chain(benchmark, members):
    benchmark.group = "adam-functional"
    benchmark.pedantic(tdfunc_functional(members, lrs(), build=adam_as_chain), **PEDANTIC)


def test_adam_functional_baseline(benchmark, members):
    benchmark.group = "adam-functional"
    benchmark.pedantic(foreach_functional(members, lrs()), **PEDANTIC)


def test_adam_functional_scalar_tdfunc(benchmark, members):
    benchmark.group = "adam-functional-scalar"
    benchmark.pedantic(tdfunc_functional(members, 1e-3), **PEDANTIC)


def test_adam_functional_scalar_baseline(benchmark, members):
    benchmark.group = "adam-functional-scalar"
    benchmark.pedantic(foreach_functional(members, 1e-3), **PEDANTIC)


def test_adam_functional_scalar_torchopt(benchmark, members):
    torchopt = pytest.importorskip("torchopt")
    benchmark.group = "adam-functional-scalar"
    benchmark.pedantic(torchopt_functional(torchopt, members, 1e-3), **PEDANTIC)


# ------------------------------------------------------------------ maml-adam
TASKS, SHOTS, INNER_STEPS, INNER_LR = 8, 10, 5, 0.01
MAML_PEDANTIC = {"rounds": 15, "iterations": 1, "warmup_rounds": 3}


def maml_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 40), nn.Tanh(), nn.Linear(40, 40), nn.Tanh(),
                         nn.Linear(40, 1))  # fmt: skip


def maml_tasks():
    generator = torch.Generator().manual_seed(1)
    amplitude = torch.rand(TASKS, 1, 1, generator=generator) * 4.5 + 0.5
    phase = torch.rand(TASKS, 1, 1, generator=generator) * torch.pi
    xs = torch.rand(TASKS, SHOTS, 1, generator=generator) * 10 - 5
    xq = torch.rand(TASKS, SHOTS, 1, generator=generator) * 10 - 5
    return xs, amplitude * torch.sin(xs + phase), xq, amplitude * torch.sin(xq + phase)


def plain_forward(w, x):
    h = torch.tanh(x @ w[0].T + w[1])
    h = torch.tanh(h @ w[2].T + w[3])
    return h @ w[4].T + w[5]


def plain_loss(w, x, y):
    return ((plain_forward(w, x) - y) ** 2).mean()


def plain_adam(w, g, m, v, t, lr=INNER_LR, b1=0.9, b2=0.999, eps=1e-8):
    m = [b1 * a + (1 - b1) * b for a, b in zip(m, g)]
    v = [b2 * a + (1 - b2) * b * b for a, b in zip(v, g)]
    step_size = lr / (1 - b1**t)
    root = (1 - b2**t) ** 0.5
    w = [p - step_size * a / (b.sqrt() / root + eps) for p, a, b in zip(w, m, v)]
    return w, m, v


def maml_tdfunc():
    model = maml_model()
    params = TensorDict.from_module(model).detach()
    tasks = maml_tasks()
    opt = optim.adam(lr=INNER_LR)

    def loss(p, x, y):
        return ((functional_call(model, p, (x,)) - y) ** 2).mean()

    def task_loss(p, xs, ys, xq, yq):
        state = opt.init(p)
        for _ in range(INNER_STEPS):
            updates, state = opt.update(grad(loss)(p, xs, ys), state, p)
            p = optim.apply_updates(p, updates)
        return loss(p, xq, yq)

    def meta_loss(p):
        return vmap(task_loss, (None, 0, 0, 0, 0))(p, *tasks).mean()

    return lambda: grad(meta_loss)(params)


def maml_baseline():
    """Hand-written: plain tensors, hand-written Adam, torch.func grad and vmap."""
    weights = [p.detach() for p in maml_model().parameters()]
    tasks = maml_tasks()

    def task_loss(w, xs, ys, xq, yq):
        m = [torch.zeros_like(p) for p in w]
        v = [torch.zeros_like(p) for p in w]
        for t in range(1, INNER_STEPS + 1):
            w, m, v = plain_adam(w, grad(plain_loss)(w, xs, ys), m, v, t)
        return plain_loss(w, xq, yq)

    def meta_loss(w):
        return vmap(task_loss, (None, 0, 0, 0, 0))(w, *tasks).mean()

    return lambda: grad(meta_loss)(weights)


def maml_loop():
    """The way most MAML code is written: a loop over tasks with torch.autograd."""
    weights = [p.detach().requires_grad_() for p in maml_model().parameters()]
    tasks = maml_tasks()

    def meta_step():
        total = 0.0
        for xs, ys, xq, yq in zip(*tasks):
            w = weights
            m = [torch.zeros_like(p) for p in w]
            v = [torch.zeros_like(p) for p in w]
            for t in range(1, INNER_STEPS + 1):
                g = torch.autograd.grad(plain_loss(w, xs, ys), w, create_graph=True)
                w, m, v = plain_adam(w, g, m, v, t)
            total = total + plain_loss(w, xq, yq)
        return torch.autograd.grad(total / TASKS, weights)

    return meta_step


def maml_torchopt(torchopt):
    """torchopt's MetaAdam (its differentiable module optimizer), a loop over tasks."""
    model = maml_model()
    tasks = maml_tasks()

    def meta_step():
        model.zero_grad()
        for xs, ys, xq, yq in zip(*tasks):
            snapshot = torchopt.extract_state_dict(model)
            inner = torchopt.MetaAdam(model, lr=INNER_LR)
            for _ in range(INNER_STEPS):
                inner.step(((model(xs) - ys) ** 2).mean())
            (((model(xq) - yq) ** 2).mean() / TASKS).backward()
            torchopt.recover_state_dict(model, snapshot)
        return [p.grad for p in model.parameters()]

    return meta_step


def test_maml_adam_tdfunc(benchmark):
    benchmark.group = "maml-adam"
    benchmark.pedantic(maml_tdfunc(), **MAML_PEDANTIC)


def test_maml_adam_baseline(benchmark):
    benchmark.group = "maml-adam"
    benchmark.pedantic(maml_baseline(), **MAML_PEDANTIC)


def test_maml_adam_loop(benchmark):
    benchmark.group = "maml-adam"
    benchmark.pedantic(maml_loop(), **MAML_PEDANTIC)


def test_maml_adam_torchopt(benchmark):
    torchopt = pytest.importorskip("torchopt")
    benchmark.group = "maml-adam"
    benchmark.pedantic(maml_torchopt(torchopt), **MAML_PEDANTIC)


# ------------------------------------------------------------------ script: interleaved
def groups(torchopt=None) -> dict:
    """``{group: (rounds, warm-up rounds, {contender: a step})}``, torchopt's where given."""
    members = make_members()
    ensemble = {
        "tdfunc": adam_ensemble_tdfunc(members),
        "torch_optim": adam_ensemble_torch_optim(members),
        "baseline": adam_ensemble_baseline(members),
    }
    functional = {
        "tdfunc": tdfunc_functional(members, lrs()),
        "chain": tdfunc_functional(members, lrs(), build=adam_as_chain),
        "baseline": foreach_functional(members, lrs()),
    }
    scalar = {
        "tdfunc": tdfunc_functional(members, 1e-3),
        "baseline": foreach_functional(members, 1e-3),
    }
    maml = {"tdfunc": maml_tdfunc(), "baseline": maml_baseline(), "loop": maml_loop()}
    if torchopt is not None:
        scalar["torchopt"] = torchopt_functional(torchopt, members, 1e-3)
        maml["torchopt"] = maml_torchopt(torchopt)
    fast, slow = PEDANTIC, MAML_PEDANTIC
    return {
        "adam-ensemble": (fast["rounds"], fast["warmup_rounds"], ensemble),
        "adam-functional": (fast["rounds"], fast["warmup_rounds"], functional),
        "adam-functional-scalar": (fast["rounds"], fast["warmup_rounds"], scalar),
        "maml-adam": (slow["rounds"], slow["warmup_rounds"], maml),
    }


def _stats(values: list[float]) -> dict:
    q1, median, q3 = statistics.quantiles(values, n=4)
    return {"median": median, "q1": q1, "q3": q3, "min": min(values), "rounds": len(values)}


def _load() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def main(scale: float = 1.0, json_path: str | None = None) -> None:
    from ratios import cpu_model, interleaved_samples

    try:
        import torchopt
    except ImportError:
        torchopt = None
        print("torchopt is not installed: its contenders are left out", file=sys.stderr)
    record = {
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine_info": {"cpu": {"brand_raw": cpu_model(), "count": os.cpu_count()}},
        "torch": torch.__version__,
        "timer": "time.thread_time_ns, one thread, contenders interleaved round by round",
        "load_average": [_load()],
        "benchmarks": [],
    }
    for group, (rounds, warmup, contenders) in groups(torchopt).items():
        rounds = max(3, round(rounds * scale))
        times = interleaved_samples(contenders, rounds, warmup=warmup)
        stats = {name: _stats(values) for name, values in times.items()}
        ours = stats["tdfunc"]
        print(f"{group} ({rounds} rounds): tdfunc {ours['median'] * 1e3:.3f} ms "
              f"(IQR {ours['q1'] * 1e3:.3f}-{ours['q3'] * 1e3:.3f})")  # fmt: skip
        for name, other in stats.items():
            if name != "tdfunc":
                low, high = other["q1"] / ours["q3"], other["q3"] / ours["q1"]
                print(f"  {name:12s} {other['median'] * 1e3:9.3f} ms, / tdfunc "
                      f"{other['median'] / ours['median']:.2f} ({low:.2f}-{high:.2f})")  # fmt: skip
            record["benchmarks"].append(
                {
                    "name": f"test_{group.replace('-', '_')}_{name}",
                    "group": group,
                    "stats": stats[name],
                }
            )
        record["load_average"].append(_load())
    print(f"load average (1 min) before and after each group: {record['load_average']}")
    if json_path:
        Path(json_path).write_text(json.dumps(record, indent=1))
        print(f"wrote {json_path} (draw it: benchmarks/plot_report.py --optim {json_path})")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import pin_allocator

    pin_allocator()  # before the first step allocates
    parser = argparse.ArgumentParser(description="tdfunc.optim's benchmarks, interleaved.")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the rounds")
    parser.add_argument("--json", help="write the medians and quartiles here")
    arguments = parser.parse_args()
    main(arguments.scale, arguments.json)
