"""Differential fuzzing of the RL and uncertainty workflows of an Ensemble.

A hypothesis state machine runs an Ensemble and a loop of N ordinary modules
(each with its own torch.optim optimizer) through random sequences of: member
selections (ints, slices, lists with repeats, boolean masks, index tensors)
run forward and trained, per-member and shared inputs with the member dim in
any position and batch ranks 0 to 3, Polyak updates of target networks,
per-member checkpoints loaded in another order, freezing single parameters, and
forwards under no_grad / inference_mode. test_differential.py covers the
full-ensemble sequences (dtype changes, deepcopy, load_state_dict).
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from torch import nn

from tdfunc import Ensemble

MEMBERS = 4
IN, OUT = 3, 2


class _Bounded(nn.Module):
    """PETS-style: a custom forward reading per-member bounds by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(IN, 8), nn.SiLU(), nn.Linear(8, OUT))
        self.low = nn.Parameter(-torch.rand(OUT))
        self.high = nn.Parameter(torch.rand(OUT))

    def forward(self, x):
        return self.net(x).clamp(min=self.low, max=self.high) + self.low.expand(x.shape[-2], -1)


ARCHITECTURES = {
    "mlp": lambda: nn.Sequential(nn.Linear(IN, 8), nn.ReLU(), nn.Linear(8, OUT)),
    "layernorm": lambda: nn.Sequential(nn.Linear(IN, 8), nn.LayerNorm(8), nn.Linear(8, OUT)),
    "batchnorm": lambda: nn.Sequential(
        nn.Linear(IN, 6, bias=False), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, OUT)
    ),
    "bounded": _Bounded,
}
# batch ranks each architecture accepts (BatchNorm1d: [B, C] only)
RANKS = {"mlp": (0, 1, 2, 3), "layernorm": (0, 1, 2, 3), "batchnorm": (1,), "bounded": (1, 2, 3)}


def _chosen(index) -> list[int]:
    members = list(range(MEMBERS))
    if isinstance(index, int):
        return [members[index]]
    if isinstance(index, slice):
        return members[index]
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
        return index.nonzero().flatten().tolist()
    return [members[int(i)] for i in index]


indices = st.one_of(
    st.integers(-MEMBERS, MEMBERS - 1),
    st.builds(
        slice,
        st.one_of(st.none(), st.integers(-MEMBERS, MEMBERS - 1)),
        st.one_of(st.none(), st.integers(-MEMBERS, MEMBERS)),
        st.one_of(st.none(), st.sampled_from([1, 2, -1, -2])),
    ).filter(lambda s: len(range(MEMBERS)[s]) > 0),
    st.lists(st.integers(-MEMBERS, MEMBERS - 1), min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=MEMBERS, max_size=MEMBERS)
    .filter(any)
    .map(lambda m: torch.tensor(m)),
    st.lists(st.integers(0, MEMBERS - 1), min_size=1, max_size=5).map(torch.tensor),
)


def _close(actual, expected, what):
    scale = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual, expected, rtol=1e-4, atol=1e-4 * scale, msg=lambda d: f"{what}: {d}"
    )


class WorkflowsVersusLoop(RuleBasedStateMachine):
    arch = "mlp"

    @initialize(seed=st.integers(0, 2**16))
    def build(self, seed):
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        make = ARCHITECTURES[self.arch]
        self.models = [make() for _ in range(MEMBERS)]
        self.targets = copy.deepcopy(self.models)
        self.ens = Ensemble(*copy.deepcopy(self.models))
        self.target = Ensemble(*copy.deepcopy(self.targets))
        self.ens_opt = torch.optim.SGD(self.ens.parameters(), lr=0.05)
        self.loop_opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in self.models]

    def _randn(self, *shape):
        return torch.randn(*shape, generator=self.generator)

    def _batch(self, rank):
        return (2, 3, 2)[:rank]

    # ------------------------------------------------------------------ rules
    @rule(
        index=indices,
        shared=st.booleans(),
        rank=st.integers(0, 3),
        train=st.booleans(),
        grad_mode=st.sampled_from(["grad", "no_grad", "inference"]),
    )
    def select_forward(self, index, shared, rank, train, grad_mode):
        rank = RANKS[self.arch][rank % len(RANKS[self.arch])]
        chosen = _chosen(index)
        count = len(chosen)
        x = self._randn(*(() if shared else (count,)), *self._batch(rank), IN)
        updates_buffers = self.arch == "batchnorm" and self.ens.training
        repeats = len(set(chosen)) != len(chosen) and not isinstance(index, (int, slice))
        context = {"grad": torch.enable_grad, "no_grad": torch.no_grad}.get(
            grad_mode, torch.inference_mode
        )
        with context():
            if updates_buffers and repeats:
                before = copy.deepcopy(self.ens.state_dict())
                with pytest.raises(ValueError, match="repeats"):
                    self.ens[index](x, in_dims=None if shared else 0)
                self.ens.load_state_dict(before)
                return
            out = self.ens[index](x, in_dims=None if shared else 0)
            expected = torch.stack(
                [self.models[k](x if shared else x[i]) for i, k in enumerate(chosen)]
            )
        if isinstance(index, int):
            expected = expected[0]
        _close(out, expected, f"output of ens[{index!r}]")
        if train and grad_mode == "grad":
            weights = self._randn(*expected.shape)
            (out * weights).sum().backward()
            (expected * weights).sum().backward()
            self._compare_grads()
            self.ens_opt.step()
            for opt in self.loop_opts:
                opt.step()
            self.ens_opt.zero_grad()
            for opt in self.loop_opts:
                opt.zero_grad()

    @rule(dim=st.integers(-4, 3), rank=st.integers(0, 3))
    def member_dim_anywhere(self, dim, rank):
        rank = RANKS[self.arch][rank % len(RANKS[self.arch])]
        shape = [*self._batch(rank), IN]
        dim = dim % (len(shape) + 1) if dim >= 0 else max(dim, -(len(shape) + 1))
        position = dim if dim >= 0 else len(shape) + 1 + dim
        if position == len(shape):  # the member dim must not split the features
            position, dim = position - 1, position - 1
        shape.insert(position, MEMBERS)
        x = self._randn(*shape)
        with torch.no_grad():
            out = self.ens(x, in_dims=dim)
            expected = torch.stack([m(xi) for m, xi in zip(self.models, x.movedim(dim, 0))])
        _close(out, expected, f"output with in_dims={dim}")

    @rule(tau=st.floats(0.0, 1.0))
    def polyak(self, tau):
        with torch.no_grad():
            for a, b in zip(self.target.parameters(), self.ens.parameters()):
                a.lerp_(b, tau)
            for target, model in zip(self.targets, self.models):
                for a, b in zip(target.parameters(), model.parameters()):
                    a.lerp_(b, tau)

    @rule(index=indices, rank=st.integers(0, 3))
    def target_forward(self, index, rank):
        rank = RANKS[self.arch][rank % len(RANKS[self.arch])]
        x = self._randn(*self._batch(rank), IN)
        self.target.eval()
        for t in self.targets:
            t.eval()
        with torch.no_grad():
            out = self.target[index](x)
            expected = torch.stack([self.targets[k](x) for k in _chosen(index)])
        _close(out, expected[0] if isinstance(index, int) else expected, "target output")

    @rule(order=st.permutations(list(range(MEMBERS))))
    def reload_members(self, order):
        states = self.ens.member_state_dicts()
        states = [{k: v.clone() for k, v in states[i].items()} for i in order]
        self.ens.load_member_state_dicts(states)
        saved = [copy.deepcopy(self.models[i].state_dict()) for i in order]
        for model, state in zip(self.models, saved):
            model.load_state_dict(state)

    @rule(which=st.integers(0, 9), flag=st.booleans())
    def freeze(self, which, flag):
        names = [name for name, _ in self.models[0].named_parameters()]
        name = names[which % len(names)]
        self.ens.get_parameter(f"stacked.{name}").requires_grad_(flag)
        for m in self.models:
            m.get_parameter(name).requires_grad_(flag)

    @rule(mode=st.booleans())
    def train_or_eval(self, mode):
        self.ens.train(mode)
        for m in self.models:
            m.train(mode)

    # ------------------------------------------------------------- invariants
    def _compare_grads(self):
        for name, _ in self.models[0].named_parameters():
            grad = self.ens.get_parameter(f"stacked.{name}").grad
            grads = [m.get_parameter(name).grad for m in self.models]
            if all(g is None for g in grads):
                assert grad is None or not grad.any(), f"grad of {name}"
                continue
            params = [m.get_parameter(name) for m in self.models]
            grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
            _close(grad, torch.stack(grads), f"grad of {name}")

    @invariant()
    def same_state(self):
        if not hasattr(self, "ens"):
            return
        for ens, models in ((self.ens, self.models), (self.target, self.targets)):
            state = ens.state_dict()
            for key in models[0].state_dict():
                expected = torch.stack([m.state_dict()[key] for m in models])
                _close(state[f"stacked.{key}"], expected, key)


_SETTINGS = settings(
    max_examples=8,
    stateful_step_count=12,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

for _arch in ARCHITECTURES:
    _case = type(f"Machine_{_arch}", (WorkflowsVersusLoop,), {"arch": _arch}).TestCase
    _case.settings = _SETTINGS
    globals()[f"TestWorkflowsVersusLoop_{_arch}"] = type(f"TestWorkflows_{_arch}", (_case,), {})
del _arch, _case
