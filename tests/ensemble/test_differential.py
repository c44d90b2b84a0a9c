"""Differential test: an Ensemble against a list of N ordinary modules.

A hypothesis state machine drives both through random sequences of what users
do (forwards with shared and per-member inputs, backward and optimizer steps,
freezing and unfreezing, train/eval, in-place edits of ``ens.params`` under
``no_grad``, ``load_state_dict``, dtype changes, ``deepcopy``) and compares
outputs, gradients, parameters and buffers after every step. Member-level moves
join them: subsets ``ens[index]`` (forward and gradients), ``ens.member(k)``
copies, ``load_member_state_dicts`` with missing keys and other dtypes, and
refused loads. The reference is plain ``torch.nn`` and ``torch.optim``, member by
member.
"""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from torch import nn

from tdfunc import Ensemble

MEMBERS = 3


class _Residual(nn.Module):
    """A custom forward: a residual block with a parameter read directly."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.hidden = nn.Linear(6, 6)
        self.gain = nn.Parameter(torch.ones(6))
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + F.silu(self.hidden(h)) * self.gain
        return self.out(h)


class _CrossAttention(nn.Module):
    """A custom forward around attention: cross attention on a learned memory, the
    attention weights used downstream, and a position table sliced by the length."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(6, 4) * 0.1)
        self.memory = nn.Parameter(torch.randn(3, 4))
        self.attn = nn.MultiheadAttention(4, 2, kdim=4, vdim=4, batch_first=True)
        self.out = nn.Linear(4, 2)

    def forward(self, x):  # x: [B, T, 4]
        # bounded activations: SGD with momentum on reloaded random weights stays finite
        h = torch.tanh(x + self.pos[: x.size(1)])
        memory = torch.tanh(self.memory).expand(x.size(0), -1, -1)
        mixed, weights = self.attn(h, memory, memory)
        return torch.tanh(self.out(torch.tanh(mixed) + h)) * weights.amax(-1, keepdim=True)


class _Transformer(nn.Module):
    """``nn.Transformer`` (encoder, decoder, final norms) under a bounded head. A norm's
    ``eps`` of 0.1 bounds how much it scales rounding up: random reloads can leave a
    sample's features almost equal, where the default ``eps`` magnifies float32's
    rounding past any tolerance, in the loop as in the ensemble."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Transformer(4, 2, 1, 1, 8, dropout=0.0, batch_first=True,
                                   norm_first=True, layer_norm_eps=0.1)  # fmt: skip
        self.head = nn.Linear(4, 2)

    def forward(self, x):  # x: [B, T, 4]; the decoder reads the first two tokens
        return torch.tanh(self.head(self.body(x, x[:, :2])))


# name -> (constructor, input shape per sample, has dropout)
ARCHITECTURES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), (4,), False),
    "dropout": (
        lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 2)),
        (4,),
        True,
    ),
    "batchnorm": (
        # no bias before the norm: its gradient is zero up to rounding, which Adam would amplify
        lambda: nn.Sequential(
            nn.Linear(4, 6, bias=False), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)
        ),
        (4,),
        False,
    ),
    "conv1d": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 3, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(15, 2)
        ),
        (2, 5),
        False,
    ),
    "custom": (_Residual, (4,), False),
    "conv_transpose": (  # pooling and a transposed convolution after a convolution
        lambda: nn.Sequential(
            nn.Conv1d(2, 3, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.ConvTranspose1d(3, 2, 2, stride=2),
            nn.Flatten(),
            nn.Linear(12, 2),
        ),
        (2, 6),
        False,
    ),
    "instance_norm": (  # running statistics per member; no bias before the norm (as above)
        lambda: nn.Sequential(
            nn.Conv1d(2, 4, 3, padding=1, bias=False),
            nn.InstanceNorm1d(4, affine=True, track_running_stats=True),
            nn.Tanh(),
            nn.Flatten(),
            nn.Linear(20, 2),
        ),
        (2, 5),
        False,
    ),
    "attention": (_CrossAttention, (3, 4), False),
    "transformer": (_Transformer, (3, 4), False),
    # wide enough (batch x features >= 4096) for the shared-input matmul path, which
    # contiguous weights take (after the assign_contiguous rule)
    "wide": (lambda: nn.Sequential(nn.Linear(1024, 8), nn.ReLU(), nn.Linear(8, 2)), (1024,), False),
}


def _chosen(index) -> list[int]:
    """The member positions an index of ``ens[index]`` selects, as a list does."""
    members = list(range(MEMBERS))
    if isinstance(index, int):
        return [members[index]]
    if isinstance(index, slice):
        return members[index]
    if isinstance(index, torch.Tensor) and index.dtype == torch.bool:
        return index.nonzero().flatten().tolist()
    return [members[int(i)] for i in index]


MEMBER_INDICES = st.one_of(
    st.integers(-MEMBERS, MEMBERS - 1),
    st.builds(
        slice,
        st.one_of(st.none(), st.integers(-MEMBERS, MEMBERS - 1)),
        st.one_of(st.none(), st.integers(-MEMBERS, MEMBERS)),
        st.one_of(st.none(), st.sampled_from([1, 2, -1])),
    ).filter(lambda s: len(range(MEMBERS)[s]) > 0),
    st.lists(st.integers(-MEMBERS, MEMBERS - 1), min_size=1, max_size=4),
    st.lists(st.booleans(), min_size=MEMBERS, max_size=MEMBERS).filter(any).map(torch.tensor),
    st.lists(st.integers(-MEMBERS, MEMBERS - 1), min_size=1, max_size=4).map(torch.tensor),
)


def _close(actual, expected, what: str) -> None:
    if actual is None or expected is None:
        assert actual is None and expected is None, f"{what}: {actual} vs {expected}"
        return
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} vs {expected.dtype}"
    # Every sequence starts in float32, and float64 state keeps the float32 rounding of
    # the steps before a dtype change (amplified by the training since), so both dtypes
    # get float32's tolerance: a real bug is off by far more than rounding.
    tolerance = 2e-4
    # Rounding error scales with the terms that were summed, not with the result: an entry
    # that cancels to near zero (a batch-norm weight's gradient over a batch of two) carries
    # the error of its large neighbours, and how large depends on the CPU's kernels.
    scale = max(1.0, expected.detach().abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual,
        expected,
        rtol=tolerance,
        atol=tolerance * scale,
        msg=lambda detail: f"{what}: {detail}",
    )


class EnsembleVersusLoop(RuleBasedStateMachine):
    arch: str = "mlp"
    chunk_size: int | None = None

    @initialize(optimizer=st.sampled_from(["sgd", "adam"]), seed=st.integers(0, 2**16))
    def build(self, optimizer, seed):
        make, self.sample_shape, self.has_dropout = ARCHITECTURES[self.arch]
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.models = [make() for _ in range(MEMBERS)]
        self.ens = Ensemble(*copy.deepcopy(self.models), chunk_size=self.chunk_size)
        self.optimizer_kind = optimizer
        self._new_optimizers()
        self.dtype = torch.float32

    def _new_optimizers(self) -> None:
        def make(params):
            if self.optimizer_kind == "sgd":
                return torch.optim.SGD(params, lr=0.05, momentum=0.9)
            # eps well above rounding noise: Adam divides tiny gradients by their own size
            return torch.optim.Adam(params, lr=0.01, eps=1e-4)

        self.ens_opt = make(self.ens.parameters())
        self.loop_opts = [make(m.parameters()) for m in self.models]

    def _randn(self, *shape):
        return torch.randn(*shape, generator=self.generator, dtype=torch.float64).to(self.dtype)

    # ------------------------------------------------------------------ rules
    def _input(self, *shape):
        # unit norm per sample: SGD steps stay stable for the wide architecture
        return self._randn(*shape, *self.sample_shape) / math.prod(self.sample_shape) ** 0.5

    @precondition(lambda self: not (self.has_dropout and self.ens.training))
    @rule(shared=st.booleans(), batch=st.integers(2, 5), train=st.booleans())
    def forward(self, shared, batch, train):
        if shared:
            x = self._input(batch)
            out = self.ens(x)
            expected = torch.stack([m(x) for m in self.models])
        else:
            x = self._input(MEMBERS, batch)
            self.ens.in_dims = 0
            try:
                out = self.ens(x)
            finally:
                self.ens.in_dims = None
            expected = torch.stack([m(xi) for m, xi in zip(self.models, x)])
        _close(out, expected, "output")
        assert out.requires_grad == expected.requires_grad, "output requires_grad"
        if train and expected.requires_grad:
            weights = self._randn(*expected.shape[1:])
            (out * weights).square().sum().backward()
            (expected * weights).square().sum().backward()
            self._compare_grads()
            self.ens_opt.step()
            for opt in self.loop_opts:
                opt.step()
            self.ens_opt.zero_grad()
            for opt in self.loop_opts:
                opt.zero_grad()

    @rule(flag=st.booleans(), which=st.integers(0, 7))
    def requires_grad(self, flag, which):
        names = [name for name, _ in self.models[0].named_parameters()]
        name = names[which % len(names)] if which < len(names) else None
        if name is None:  # the whole model
            self.ens.requires_grad_(flag)
            for m in self.models:
                m.requires_grad_(flag)
        else:
            self.ens.get_parameter(f"stacked.{name}").requires_grad_(flag)
            for m in self.models:
                m.get_parameter(name).requires_grad_(flag)

    @precondition(lambda self: not (self.has_dropout and self.ens.training))
    @rule(which=st.integers(0, 7), shared=st.booleans(), batch=st.integers(2, 5))
    def frozen_forward(self, which, shared, batch):
        """The actor update of SAC: freeze the critics, run them, unfreeze, train them."""
        self.requires_grad(False, which)
        self.forward(shared, batch, False)
        self.requires_grad(True, which)
        self.forward(shared, batch, True)

    @rule(mode=st.booleans())
    def train_or_eval(self, mode):
        self.ens.train(mode)
        for m in self.models:
            m.train(mode)

    @rule(which=st.integers(0, 15), scale=st.floats(-1, 1))
    def edit_in_place(self, which, scale):
        floating = [
            key for key, value in self.models[0].state_dict().items() if value.is_floating_point()
        ]
        key = floating[which % len(floating)]
        stacked = self.ens.params.get(tuple(key.split(".")))
        delta = self._randn(*stacked.shape) * scale
        if key.endswith("running_var"):  # a variance stays positive
            delta = delta.abs()
        with torch.no_grad():
            stacked.add_(delta)
            for k, m in enumerate(self.models):
                m.state_dict()[key].add_(delta[k])

    @rule(scale=st.floats(0.1, 2))
    def load_state_dict(self, scale):
        state = self.ens.state_dict()
        new = {
            key: self._randn(*value.shape) * scale if value.is_floating_point() else value + 1
            for key, value in state.items()
        }
        for key in new:
            if key.endswith("running_var"):  # a variance stays positive
                new[key] = new[key].abs() + 0.5
        self.ens.load_state_dict(new)
        for k, m in enumerate(self.models):
            m.load_state_dict({key[len("stacked.") :]: value[k] for key, value in new.items()})

    @rule()
    def assign_contiguous(self):
        """The ensemble's tensors replaced by contiguous copies (the layout N modules'
        weights stack to), as a checkpoint written elsewhere would load: it runs on
        them (a wide shared input then takes the merged-weight matmul) and trains
        them. New parameters start without gradients or optimizer state, on both sides."""
        state = {k: v.detach().contiguous().clone() for k, v in self.ens.state_dict().items()}
        self.ens.load_state_dict(state, assign=True)
        for model in self.models:
            model.zero_grad(set_to_none=True)
        self._new_optimizers()

    @rule(double=st.booleans())
    def change_dtype(self, double):
        self.dtype = torch.float64 if double else torch.float32
        self.ens.to(self.dtype)
        for m in self.models:
            m.to(self.dtype)
        self._new_optimizers()  # optimizer state is per dtype

    @rule()
    def deepcopy(self):
        self.ens, self.ens_opt = copy.deepcopy((self.ens, self.ens_opt))
        pairs = copy.deepcopy(list(zip(self.models, self.loop_opts)))
        self.models = [m for m, _ in pairs]
        self.loop_opts = [o for _, o in pairs]

    @precondition(lambda self: not (self.has_dropout and self.ens.training))
    @rule(index=MEMBER_INDICES, shared=st.booleans(), batch=st.integers(2, 4))
    def subset_forward(self, index, shared, batch):
        """``ens[index]`` against the selected modules; gradients reach only their rows."""
        chosen = _chosen(index)
        x = self._input(batch) if shared else self._input(len(chosen), batch)
        run = self.ens[index]
        repeats = not isinstance(index, (int, slice)) and len(set(chosen)) != len(chosen)
        running = any(name.endswith("running_mean") for name, _ in self.ens.named_buffers())
        if repeats and running and self.ens.training:
            before = self.ens.state_dict()
            before = {key: value.clone() for key, value in before.items()}
            with pytest.raises(ValueError, match="repeats members"):
                run(x, in_dims=None if shared else 0)
            for key, value in self.ens.state_dict().items():
                assert torch.equal(value, before[key]), f"{key} changed by a refused call"
            return
        out = run(x, in_dims=None if shared else 0)
        expected = torch.stack(
            [self.models[k](x if shared else x[i]) for i, k in enumerate(chosen)]
        )
        if isinstance(index, int):
            expected = expected[0]
        _close(out, expected, f"output of ens[{index!r}]")
        if not expected.requires_grad:
            return
        weights = self._randn(*expected.shape)
        (out * weights).square().sum().backward()
        (expected * weights).square().sum().backward()
        for name, _ in self.models[0].named_parameters():
            grad = self.ens.get_parameter(f"stacked.{name}").grad
            params = [m.get_parameter(name) for m in self.models]
            if all(p.grad is None for p in params):
                assert grad is None or not grad.any(), f"grad of {name}"
                continue
            rows = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
            _close(grad, torch.stack(rows), f"grad of {name} through ens[{index!r}]")
        # No step: an optimizer over the stacked tensors moves the unselected rows
        # too (momentum on zero gradients), which a loop of N optimizers does not.
        self.ens_opt.zero_grad()
        for opt in self.loop_opts:
            opt.zero_grad()

    @precondition(lambda self: not (self.has_dropout and self.ens.training))
    @rule(k=st.integers(-MEMBERS, MEMBERS - 1), batch=st.integers(2, 4))
    def member_copy(self, k, batch):
        """``ens.member(k)`` is models[k] as a standalone copy: training it leaves the ensemble."""
        member = self.ens.member(k)
        reference = self.models[k]
        assert member.training == reference.training
        state, expected_state = member.state_dict(), reference.state_dict()
        assert list(state) == list(expected_state)
        for key, value in expected_state.items():
            _close(state[key], value, f"member({k}).{key}")
        x = self._input(batch)
        # on a copy: a forward in training mode updates the reference's statistics
        _close(member(x), copy.deepcopy(reference)(x), f"member({k}) output")
        with torch.no_grad():
            for param in member.parameters():
                param.add_(1.0)  # the invariant checks that the ensemble did not move

    @rule(
        holes=st.lists(st.tuples(st.integers(0, MEMBERS - 1), st.integers(0, 15)), max_size=4),
        double=st.booleans(),
    )
    def load_member_states(self, holes, double):
        """Per-member state dicts with keys missing here and there, maybe in another dtype,
        loaded with strict=False: each member as its own module.load_state_dict."""
        states = []
        for model in self.models:
            state = {}
            for key, value in model.state_dict().items():
                if value.is_floating_point():
                    new = self._randn(*value.shape)
                    new = new.abs() + 0.5 if key.endswith("running_var") else new
                    state[key] = new.to(torch.float64 if double else value.dtype)
                else:
                    state[key] = value + 1
            states.append(state)
        keys = list(states[0])
        for member, which in holes:
            states[member].pop(keys[which % len(keys)], None)
        self.ens.load_member_state_dicts(states, strict=False)
        for model, state in zip(self.models, states):
            model.load_state_dict(state, strict=False)

    @rule(member=st.integers(0, MEMBERS - 1), which=st.integers(0, 15), kind=st.integers(0, 3))
    def load_member_states_refused(self, member, which, kind):
        """A bad value in one state dict: a clear error, and no member changed (module
        loads would have half loaded; the ensemble checks everything first)."""
        states = [{k: v.clone() + 1 for k, v in m.state_dict().items()} for m in self.models]
        key = list(states[member])[which % len(states[member])]
        shape = states[member][key].shape
        bad = ["a string", None, [1.0, 2.0], torch.zeros(*shape, 2)][kind]
        states[member][key] = bad
        error = ValueError if kind == 3 else TypeError
        with pytest.raises(error, match=rf"state dict {member} holds .*'{re.escape(key)}'"):
            self.ens.load_member_state_dicts(states)

    # ------------------------------------------------------------- invariants
    def _compare_grads(self) -> None:
        for name, _ in self.models[0].named_parameters():
            grad = self.ens.get_parameter(f"stacked.{name}").grad
            grads = [m.get_parameter(name).grad for m in self.models]
            if grad is None or any(g is None for g in grads):
                assert grad is None and all(g is None for g in grads), f"grad of {name}"
                continue
            _close(grad, torch.stack(grads), f"grad of {name}")

    @invariant()
    def same_state(self):
        if not hasattr(self, "ens"):
            return
        assert self.ens.training == self.models[0].training
        state = self.ens.state_dict()
        for key in self.models[0].state_dict():
            stacked = state[f"stacked.{key}"]
            expected = torch.stack([m.state_dict()[key] for m in self.models])
            _close(stacked, expected, key)
        for name, param in self.models[0].named_parameters():
            assert self.ens.get_parameter(f"stacked.{name}").requires_grad == param.requires_grad
        self._compare_grads()


_SETTINGS = settings(
    max_examples=6,
    stateful_step_count=14,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# one test per architecture, with chunking off and on (chunks of 2 of 3 members)
for _arch in ARCHITECTURES:
    for _chunk in (None, 2):
        _machine = type(
            f"Machine_{_arch}_{_chunk}",
            (EnsembleVersusLoop,),
            {"arch": _arch, "chunk_size": _chunk},
        )
        _case = _machine.TestCase
        _case.settings = _SETTINGS
        _name = f"TestEnsembleVersusLoop_{_arch}_{'chunked' if _chunk else 'whole'}"
        globals()[_name] = type(_name, (_case,), {})
del _arch, _chunk, _machine, _case, _name


def test_every_architecture_runs_batched():
    """The machines above check the batched path, not a vmap fallback."""
    for name, (make, _, _) in ARCHITECTURES.items():
        summary = Ensemble(*[make() for _ in range(MEMBERS)]).batched_summary
        assert "vmapped" not in summary, f"{name}: {summary}"


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_fast_path_equals_general_path(arch, monkeypatch):
    """``Ensemble._run``'s fast path (one shared tensor, the registered parameters)
    and its general twin (the same call with ``in_dims`` given, and through
    ``functional_call``) agree with each other and with the members run one by one,
    outputs and gradients."""
    from tdfunc._ensemble import ensemble as ensemble_module

    make, sample_shape, has_dropout = ARCHITECTURES[arch]
    torch.manual_seed(0)
    models = [make() for _ in range(MEMBERS)]
    ens = Ensemble(*copy.deepcopy(models))
    if has_dropout:
        ens.eval()
        for model in models:
            model.eval()
    x = torch.randn(5, *sample_shape)
    general_calls = []
    general = ensemble_module.lead_inputs

    def spy(*args, **kwargs):
        general_calls.append(1)
        return general(*args, **kwargs)

    monkeypatch.setattr(ensemble_module, "lead_inputs", spy)
    runs = {
        "fast": lambda: ens(x),
        "general": lambda: ens(x, in_dims=None),
        "functional_call": lambda: ens.functional_call(ens.params, x),
    }
    expected = torch.stack([model(x) for model in models])
    expected.square().sum().backward()
    expected_grads = {
        name: torch.stack([model.get_parameter(name).grad for model in models])
        for name, _ in models[0].named_parameters()
    }
    for route, run in runs.items():
        del general_calls[:]
        ens.zero_grad(set_to_none=True)
        out = run()
        assert bool(general_calls) == (route != "fast"), route
        _close(out, expected, f"{route} output")
        out.square().sum().backward()
        for name, grad in expected_grads.items():
            _close(ens.get_parameter(f"stacked.{name}").grad, grad, f"{route} grad of {name}")
