"""``capture_step`` on the CPU: the path a CUDA device records, run on every call.

Every case is compared with a reference computed without tdfunc (one ``torch.optim``
optimizer per member module) or with the same step function called eagerly. The
numbers of the eager step and the captured one are the same computation on the same
tensors, so they are compared exactly; against the loop of modules the batched
kernels sum in another order, so float32 rounding (about 1e-7 relative per op,
amplified by Adam's division by sqrt(v) in the first steps) is allowed.
"""

from __future__ import annotations

import copy
import functools
import types
import weakref

import pytest
import torch
from capture_loop import MEMBERS, OptimLoop, batches, members, mlp
from torch.func import grad_and_value

from tdfunc import Ensemble, TensorDict, capture_step, optim

LOOP_TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}
KEYS = ("0.weight", "0.bias", "2.weight", "2.bias")


def make_step(ensemble, opt):
    def train_step(carry, x, y):
        params, state = carry

        def loss(p):
            return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()

        grads, _ = grad_and_value(loss)(params)
        losses = ((ensemble.functional_call(params, x) - y) ** 2).mean(dim=(1, 2))
        updates, state = opt.update(grads, state, params)
        return (optim.apply_updates(params, updates), state), losses

    return train_step


def leaf(params: TensorDict, key: str) -> torch.Tensor:
    return params[tuple(key.split("."))]


OPTIMIZERS = {
    "adam": (lambda: optim.adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "sgd_momentum": (
        lambda: optim.sgd(lr=0.05, momentum=0.9, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01),
    ),
    "adamw": (
        lambda: optim.adamw(lr=0.01, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    ),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_steps_equal_one_torch_optim_per_member(name):
    ours, theirs = OPTIMIZERS[name]
    models = members()
    loop = OptimLoop(models, theirs)
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = ours()
    params = ensemble.params
    data = batches(5)
    step = capture_step(make_step(ensemble, opt), (params, opt.init(params)), *data[0])
    assert not step.captured  # no CUDA here: the same body runs on every call
    for x, y in data:
        losses = step(x, y)
        torch.testing.assert_close(losses, loop.step(x, y), **LOOP_TOLERANCE)
        for key in KEYS:
            torch.testing.assert_close(leaf(params, key), loop.stacked(key), **LOOP_TOLERANCE)
    # the ensemble's own parameters were trained: its forward gives the loop's outputs
    x = torch.randn(5, 3)
    with torch.no_grad():
        expected = torch.stack([model(x) for model in loop.models])
        torch.testing.assert_close(ensemble(x, in_dims=None), expected, **LOOP_TOLERANCE)


def test_steps_equal_the_eager_step_exactly():
    models = members()
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    eager_ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=torch.tensor([0.01, 0.02, 0.03, 0.04]))
    data = batches(4)
    step = capture_step(
        make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)), *data[0]
    )
    eager = make_step(eager_ensemble, opt)
    carry = (eager_ensemble.params.detach(), opt.init(eager_ensemble.params))
    for x, y in data:
        losses = step(x, y)
        with torch.no_grad():
            carry, expected = eager(carry, x, y)
        assert torch.equal(losses, expected)
    for mine, reference in zip(
        torch.utils._pytree.tree_leaves(step.carry), torch.utils._pytree.tree_leaves(carry)
    ):
        assert torch.equal(mine, reference)


def test_warm_up_leaves_the_carry_and_the_random_numbers_as_they_were():
    # dropout draws random masks: the first call draws what an eager first step draws
    models = members(dropout=0.5)
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    reference = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.sgd(lr=0.1)
    data = batches(2)
    before = ensemble.params.detach().clone()
    torch.manual_seed(7)
    step = capture_step(
        make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)), *data[0],
        warmup=3,
    )  # fmt: skip
    assert (ensemble.params == before).all()
    got = [step(*batch) for batch in data]
    torch.manual_seed(7)
    eager = make_step(reference, opt)
    carry = (reference.params.detach(), opt.init(reference.params))
    for batch, losses in zip(data, got):
        with torch.no_grad():
            carry, expected = eager(carry, *batch)
        assert torch.equal(losses, expected)


def test_outputs_are_not_overwritten_by_the_next_call():
    ensemble = Ensemble(mlp(), num_members=MEMBERS, in_dims=0)
    opt = optim.sgd(lr=0.1)
    data = batches(2)

    def train_step(carry, x, y):
        params, state = carry
        grads = torch.func.grad(lambda p: ((ensemble.functional_call(p, x) - y) ** 2).sum())(params)
        updates, state = opt.update(grads, state, params)
        # outputs that are the step's own buffers: the carry before the update, and x
        return (optim.apply_updates(params, updates), state), (params["0", "weight"], x)

    step = capture_step(train_step, (ensemble.params, opt.init(ensemble.params)), *data[0])
    weight_before = ensemble.stacked[0].weight.detach().clone()
    first_weight, first_x = step(*data[0])
    assert torch.equal(first_weight, weight_before)  # the value the step read, as eagerly
    assert not torch.equal(ensemble.stacked[0].weight, weight_before)  # trained
    step(*data[1])
    assert torch.equal(first_weight, weight_before)
    assert torch.equal(first_x, data[0][0])


def test_a_new_carry_that_swaps_leaves_is_written_as_returned():
    a, b = torch.ones(3), torch.full((3,), 2.0)

    def swap(carry, scale):
        first, second = carry
        return (second * scale, first), first.sum()

    step = capture_step(swap, (a, b), torch.tensor(1.0))
    step(torch.tensor(3.0))
    assert torch.equal(a, torch.full((3,), 6.0)) and torch.equal(b, torch.ones(3))
    step(torch.tensor(1.0))
    assert torch.equal(a, torch.ones(3)) and torch.equal(b, torch.full((3,), 6.0))


# ----------------------------------------------------------------- refusals
@pytest.fixture
def captured():
    ensemble = Ensemble(mlp(), num_members=MEMBERS, in_dims=0)
    opt = optim.adam(lr=0.01)
    x, y = batches(1)[0]
    step = capture_step(make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)),
                        x, y)  # fmt: skip
    return step, ensemble, opt, x, y


def test_inputs_of_another_shape_dtype_or_structure_are_refused(captured):
    step, _, _, x, y = captured
    with pytest.raises(ValueError, match=r"capture_step: the input at \[0\] has shape \[4, 7, 3\]"):
        step(x[:, :7], y[:, :7])
    with pytest.raises(ValueError, match=r"input at \[1\] has shape \[4, 8, 1\], torch.float64"):
        step(x, y.double())
    with pytest.raises(ValueError, match=r"example inputs has 2 leaves, this call 1"):
        step(x)
    with pytest.raises(ValueError, match=r"leaf 1 is \[1\] in the example inputs but \[1\]\['y'\]"):
        step(x, {"y": y})
    with pytest.raises(ValueError, match=r"input at \[1\] has float"):
        step(x, 1.0)
    step(x, y)  # the right inputs still run


def test_a_python_number_input_is_refused_at_capture():
    with pytest.raises(TypeError, match=r"capture_step: every input must be a tensor.*\[1\]"):
        capture_step(lambda carry, x, s: ((carry * s,), x), (torch.ones(2),), torch.ones(2), 0.5)


def test_replaced_or_moved_parameters_are_refused(captured):
    step, ensemble, _, x, y = captured
    state = {k: v.clone() for k, v in ensemble.state_dict().items()}
    ensemble.load_state_dict(state)  # copied in place: the capture reads the new values
    step(x, y)
    ensemble.load_state_dict(state, assign=True)  # new tensors: the capture would be stale
    with pytest.raises(RuntimeError, match=r"tensor 'stacked\.0\.weight' was replaced"):
        step(x, y)


def test_a_module_moved_to_another_dtype_is_refused(captured):
    step, ensemble, _, x, y = captured
    ensemble.double()  # param.data = ... : the same Parameter, other memory
    with pytest.raises(RuntimeError, match=r"moved to other memory|was replaced"):
        step(x, y)


def test_train_eval_switch_is_refused(captured):
    step, ensemble, _, x, y = captured
    ensemble.eval()
    with pytest.raises(RuntimeError, match=r"was in train mode .* eval mode now"):
        step(x, y)
    ensemble.train()
    step(x, y)


def test_a_changed_float_hyperparameter_is_refused(captured):
    step, _, opt, x, y = captured
    opt.hyperparameters["lr"] = 0.5
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr' of .* changed .* 0\.01.* 0\.5"):
        step(x, y)
    opt.hyperparameters["lr"] = 0.01
    step(x, y)


def test_a_tensor_hyperparameter_changed_in_place_is_honoured():
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.SGD(p, lr=0.1))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    lr = torch.tensor(0.1)
    opt = optim.sgd(lr=lr)
    data = batches(4)
    step = capture_step(make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)),
                        *data[0])  # fmt: skip
    for index, (x, y) in enumerate(data):
        if index == 2:
            lr.fill_(0.02)  # read by the next call, as a replay reads it
            for optimizer in loop.optimizers:
                optimizer.param_groups[0]["lr"] = 0.02
        step(x, y)
        loop.step(x, y)
    for key in KEYS:
        torch.testing.assert_close(leaf(ensemble.params, key), loop.stacked(key), **LOOP_TOLERANCE)
    opt.hyperparameters["lr"] = torch.tensor(0.02)  # another tensor: its address is not read
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr'.*a tensor of shape \[\]"):
        step(*data[0])


def test_a_hyperparameter_inside_a_chain_is_watched():
    ensemble = Ensemble(mlp(), num_members=MEMBERS, in_dims=0)
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.scale_by_learning_rate(0.1))
    step = capture_step(
        make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)), *batches(1)[0]
    )
    opt.transforms[1].hyperparameters["lr"] = 0.2
    with pytest.raises(RuntimeError, match=r"'lr' of opt\.transforms\[1\] changed"):
        step(*batches(1)[0])


def test_objects_the_step_cannot_be_seen_to_read_are_watched_when_named():
    ensemble = Ensemble(mlp(), num_members=MEMBERS, in_dims=0)
    opt = optim.sgd(lr=0.1)
    hidden = weakref.ref(opt)  # the step reaches it through a call: not found by looking

    def train_step(carry, x, y):
        return make_step(ensemble, hidden())(carry, x, y)

    carry = (ensemble.params, opt.init(ensemble.params))
    data = batches(1)[0]
    unwatched = capture_step(train_step, carry, *data)
    watched = capture_step(train_step, carry, *data, watch=[opt])
    opt.hyperparameters["lr"] = 0.3
    unwatched(*data)  # nothing tells it (the documented limit of finding objects)
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr' of watch\[0\] changed"):
        watched(*data)


def test_a_torch_optim_param_group_change_is_refused():
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def step_fn(carry, x):
        return (carry[0] - optimizer.param_groups[0]["lr"] * x,), carry[0].sum()

    step = capture_step(step_fn, (torch.zeros(3),), torch.ones(3))
    optimizer.param_groups[0]["lr"] = 0.2
    with pytest.raises(RuntimeError, match=r"'lr' of optimizer\.param_groups\[0\] changed"):
        step(torch.ones(3))


def test_a_carry_moved_to_other_memory_is_refused(captured):
    step, _, _, x, y = captured
    state = step.carry[1]
    state["exp_avg", "0", "weight"].data = torch.zeros_like(state["exp_avg", "0", "weight"])
    with pytest.raises(RuntimeError, match=r"carry tensor at .*exp_avg.*moved to other memory"):
        step(x, y)


def test_carries_that_cannot_be_updated_in_place_are_refused():
    with pytest.raises(ValueError, match=r"carry leaf at .* is an expanded view"):
        capture_step(lambda c, x: (c, x), (torch.ones(3).expand(4, 3),), torch.ones(1))
    base = torch.ones(6)
    with pytest.raises(ValueError, match=r"'\[0\]' and '\[1\]' share memory"):
        capture_step(lambda c, x: (c, x), (base[:4], base[3:]), torch.ones(1))
    with pytest.raises(ValueError, match=r"'\[0\]' and '\[1\]' share memory"):
        capture_step(lambda c, x: (c, x), (base[::2], base[2:3]), torch.ones(1))
    with pytest.raises(TypeError, match=r"every leaf of the carry must be a tensor.*\[1\]"):
        capture_step(lambda c, x: (c, x), (torch.ones(3), 2.0), torch.ones(1))
    with pytest.raises(ValueError, match=r"carry must be on one device"):
        capture_step(lambda c, x: (c, x), (torch.ones(3), torch.ones(3, device="meta")),
                     torch.ones(1))  # fmt: skip


def test_a_step_that_changes_its_carry_or_returns_numbers_is_refused():
    carry = (torch.ones(3),)
    with pytest.raises(ValueError, match=r"new carry leaf at .* has shape \[1, 3\]"):
        capture_step(lambda c, x: ((c[0][None],), x), carry, torch.ones(1))
    with pytest.raises(ValueError, match=r"values for \[1\], which the carry does not hold"):
        capture_step(lambda c, x: ((c[0], c[0] * 2), x), carry, torch.ones(1))
    with pytest.raises(TypeError, match=r"must return a pair \(new_carry, outputs\)"):
        capture_step(lambda c, x: c, carry, torch.ones(1))
    with pytest.raises(TypeError, match=r"every output of step_fn must be a tensor.*\[1\]"):
        capture_step(lambda c, x: (c, (x, 1.5)), carry, torch.ones(1))
    assert torch.equal(carry[0], torch.ones(3))  # a refused capture leaves the carry as it was


def test_a_tensor_swapped_inside_a_learning_rate_tree_is_refused():
    ensemble = Ensemble(mlp(), num_members=MEMBERS, in_dims=0)
    lrs = ensemble.params.apply(lambda t: torch.full_like(t, 0.1)).detach()
    opt = optim.sgd(lr=lrs)
    step = capture_step(
        make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)), *batches(1)[0]
    )
    lrs["0", "weight"].fill_(0.05)  # in place: read by the next call
    step(*batches(1)[0])
    lrs["0", "weight"] = torch.full_like(lrs["0", "weight"], 0.05)  # the same tree, a new tensor
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr' .* a pytree of 4 leaves"):
        step(*batches(1)[0])


def test_a_step_failing_during_warm_up_leaves_the_carry_as_it_was():
    carry = (torch.ones(3),)
    calls = []

    def step_fn(carry, x):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the second step fails")
        return (carry[0] + x,), x

    with pytest.raises(RuntimeError, match="second step fails"):
        capture_step(step_fn, carry, torch.ones(3), warmup=3)
    assert torch.equal(carry[0], torch.ones(3))


def test_a_new_carry_in_another_key_order_is_matched_by_key_path():
    carry = TensorDict({"a": torch.zeros(2), "b": torch.ones(2)})

    def step_fn(carry, x):
        return TensorDict({"b": carry["b"] + x, "a": carry["a"] - x}), x

    step = capture_step(step_fn, carry, torch.ones(2))
    step(torch.full((2,), 3.0))
    assert torch.equal(carry["a"], torch.full((2,), -3.0))
    assert torch.equal(carry["b"], torch.full((2,), 4.0))

    def other_keys(carry, x):
        return TensorDict({"b": carry["b"], "c": carry["a"]}), x

    with pytest.raises(ValueError, match=r"no new value for \['a'\] and values for \['c'\]"):
        capture_step(other_keys, carry, torch.ones(2))


def test_a_state_resumed_from_a_checkpoint_trains_on(tmp_path):
    # a state saved and loaded back, its keys in another order than the optimizer's
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.Adam(p, lr=0.01))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=0.01)
    data = batches(4)
    state = opt.init(ensemble.params)
    step = capture_step(make_step(ensemble, opt), (ensemble.params, state), *data[0])
    for x, y in data[:2]:
        step(x, y)
        loop.step(x, y)
    TensorDict({"state": step.carry[1]}).memmap(tmp_path / "checkpoint")
    loaded = TensorDict.load_memmap(tmp_path / "checkpoint")["state"]
    with pytest.raises(ValueError, match=r"is a memory-mapped file .* would write into that file"):
        capture_step(make_step(ensemble, opt), (ensemble.params, loaded), *data[0])
    resumed = loaded.clone()
    resumed = TensorDict(
        {key: resumed[key] for key in reversed(list(resumed.keys()))},
        batch_size=resumed.batch_size,
        device=resumed.device,
    )
    assert list(resumed.keys()) != list(state.keys())
    step = capture_step(make_step(ensemble, opt), (ensemble.params, resumed), *data[0])
    for x, y in data[2:]:
        torch.testing.assert_close(step(x, y), loop.step(x, y), **LOOP_TOLERANCE)
    for key in KEYS:
        torch.testing.assert_close(leaf(ensemble.params, key), loop.stacked(key), **LOOP_TOLERANCE)


class Trainer:
    """A step written as a method: the ensemble and the optimizer are attributes."""

    def __init__(self) -> None:
        self.ensemble = Ensemble(mlp(), num_members=MEMBERS, in_dims=0)
        self.opt = optim.adam(lr=0.01)

    def step(self, carry, x, y):
        return make_step(self.ensemble, self.opt)(carry, x, y)


def test_a_method_or_partial_is_followed_to_what_it_reads():
    trainer = Trainer()
    params = trainer.ensemble.params
    data = batches(1)[0]
    step = capture_step(trainer.step, (params, trainer.opt.init(params)), *data)
    trainer.opt.hyperparameters["eps"] = 1e-6
    with pytest.raises(RuntimeError, match=r"'eps' of .*opt changed"):
        step(*data)

    def step_fn(carry, x, y, *, ensemble, opt):
        return make_step(ensemble, opt)(carry, x, y)

    ensemble, opt = Ensemble(mlp(), num_members=MEMBERS, in_dims=0), optim.sgd(lr=0.1)
    partial = functools.partial(step_fn, ensemble=ensemble, opt=opt)
    step = capture_step(partial, (ensemble.params, opt.init(ensemble.params)), *data)
    ensemble.eval()
    with pytest.raises(RuntimeError, match=r"ensemble was in train mode"):
        step(*data)


def test_inputs_that_record_gradients_do_not_tie_the_buffers_to_their_graph():
    x = torch.ones(3, requires_grad=True)
    step = capture_step(lambda carry, x: ((carry[0] + x,), x * 2), (torch.zeros(3),), x)
    out = step(x * 3)
    assert not out.requires_grad and out.grad_fn is None
    assert torch.equal(out, torch.full((3,), 6.0))
    # the step's own input buffer would otherwise hold the caller's graph until the next call
    assert not any(buffer.requires_grad for buffer in step._input_leaves)


def test_a_changed_module_setting_is_refused():
    ensemble = Ensemble(mlp(dropout=0.5), num_members=MEMBERS, in_dims=0)
    opt = optim.sgd(lr=0.1)
    data = batches(1)[0]
    step = capture_step(make_step(ensemble, opt), (ensemble.params, opt.init(ensemble.params)),
                        *data)  # fmt: skip
    ensemble.template[2].p = 0.1  # the template's code and settings run for every member
    with pytest.raises(RuntimeError, match=r"ensemble\.template\.2\.p was 0\.5 .* is 0\.1 now"):
        step(*data)
    ensemble.template[2].p = 0.5
    step(*data)
    ensemble.chunk_size = 2  # the batched forward runs in chunks from now on
    with pytest.raises(RuntimeError, match=r"ensemble\.chunk_size was None .* is 2 now"):
        step(*data)


def test_a_consolidated_carry_shares_one_storage_without_overlap():
    carry = TensorDict({"a": torch.zeros(2, 3), "b": torch.ones(4)}).consolidate()

    def step_fn(carry, x):
        # each new leaf reads the other's old values: written in place, order matters
        return TensorDict({"a": carry["a"] + carry["b"][:1], "b": carry["b"] + carry["a"][0, 0]}), x

    step = capture_step(step_fn, carry, torch.ones(1))
    for _ in range(2):
        step(torch.ones(1))
    a, b = torch.zeros(2, 3), torch.ones(4)
    for _ in range(2):
        a, b = a + b[:1], b + a[0, 0]
    assert torch.equal(carry["a"], a) and torch.equal(carry["b"], b)


@pytest.mark.slow
def test_a_compiled_method_is_followed_to_its_object():
    trainer = Trainer()
    params = trainer.ensemble.params
    data = batches(1)[0]
    torch._dynamo.reset()
    compiled = torch.compile(trainer.step, backend="eager")  # the wrapper hides the method
    step = capture_step(compiled, (params, trainer.opt.init(params)), *data, warmup=1)
    partial = functools.partial(Trainer.step, trainer)  # self as a partial's argument
    other = capture_step(partial, (params, trainer.opt.init(params)), *data)
    trainer.ensemble.eval()
    for captured in (step, other):
        with pytest.raises(RuntimeError, match=r"eval mode now"):
            captured(*data)


def test_a_tensor_put_into_a_carry_container_does_not_split_what_the_step_reads_and_writes():
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.Adam(p, lr=0.01))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=0.01)
    state = opt.init(ensemble.params)
    data = batches(3)
    step = capture_step(make_step(ensemble, opt), (ensemble.params, state), *data[0])
    for index, (x, y) in enumerate(data):
        if index == 1:
            state["step"] = torch.zeros(MEMBERS)  # the caller's container: not the step's
            step.carry[1]["step"] = torch.zeros(MEMBERS)  # a fresh container each time
        torch.testing.assert_close(step(x, y), loop.step(x, y), **LOOP_TOLERANCE)
    assert step.carry[1]["step"].tolist() == [3.0] * MEMBERS


class FakeGraph:
    """Records as a CUDA graph does, on the CPU: recording leaves the carry as it was and
    keeps the outputs as static tensors; each replay reruns the body and rewrites them in
    place. It checks what the step does around a recording, not the recording itself."""

    def __init__(self, body, carry_leaves) -> None:
        self.body, self.carry_leaves = body, carry_leaves
        self.replays = 0

    def record(self):
        saved = [leaf.detach().clone() for leaf in self.carry_leaves]
        self.outputs = self.body()
        with torch.no_grad():
            for leaf, value in zip(self.carry_leaves, saved):
                leaf.copy_(value)
        return self.outputs, self

    def replay(self) -> None:
        self.replays += 1
        fresh = self.body()
        for static, new in zip(
            torch.utils._pytree.tree_leaves(self.outputs), torch.utils._pytree.tree_leaves(fresh)
        ):
            static.copy_(new)


def test_the_recorded_path_replays_and_returns_each_call_its_own_outputs(monkeypatch):
    from tdfunc._capture import step as module

    graphs = []
    models = members()
    loop = OptimLoop(models, lambda p: torch.optim.Adam(p, lr=0.01))
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=0)
    opt = optim.adam(lr=0.01)
    carry = (ensemble.params, opt.init(ensemble.params))
    leaves = torch.utils._pytree.tree_leaves(carry)
    monkeypatch.setattr(module, "_recorder", lambda device: _fake_recorder(leaves, graphs))
    data = batches(4)
    before = ensemble.params.detach().clone()
    step = capture_step(make_step(ensemble, opt), carry, *data[0])
    assert step.captured
    assert (ensemble.params == before).all()  # warm-up and recording left the carry as it was
    kept = [step(x, y) for x, y in data]
    for losses, (x, y) in zip(kept, data):
        torch.testing.assert_close(losses, loop.step(x, y), **LOOP_TOLERANCE)
    assert graphs[-1].replays == len(data)
    for key in KEYS:
        torch.testing.assert_close(leaf(ensemble.params, key), loop.stacked(key), **LOOP_TOLERANCE)
    opt.hyperparameters["lr"] = 0.5
    with pytest.raises(RuntimeError, match=r"hyperparameter 'lr'"):
        step(*data[0])
    assert graphs[-1].replays == len(data)  # refused before replaying


def _fake_recorder(leaves, graphs):
    def record(body):
        graph = FakeGraph(body, leaves)
        graphs.append(graph)
        return graph.record()

    return record


def test_outputs_that_change_structure_between_steps_are_refused():
    calls = []

    def step_fn(carry, x):
        calls.append(1)
        outputs = (x,) if len(calls) % 2 else (x, x)  # Python deciding what to return
        return (carry[0] + x,), outputs

    carry = (torch.zeros(2),)
    step = capture_step(step_fn, carry, torch.ones(2), warmup=1)
    with pytest.raises(ValueError, match=r"outputs of another structure than on its first step"):
        step(torch.ones(2))
    assert torch.equal(carry[0], torch.zeros(2))  # refused before the carry was written


def test_watch_takes_modules_and_optimizers_only():
    with pytest.raises(TypeError, match=r"watch\[1\] is a Tensor; watch takes modules"):
        capture_step(
            lambda c, x: (c, x), (torch.ones(2),), torch.ones(2), watch=[mlp(), torch.ones(1)]
        )


def test_a_step_that_updates_state_outside_its_carry_is_refused():
    # the whole-network pattern: backward and optimizer.step() inside the step; the
    # warm-up would leave the Adam states three steps ahead of the parameters
    models = members()
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]

    def step_fn(carry, x, y):
        for index, (model, optimizer) in enumerate(zip(models, optimizers)):
            optimizer.zero_grad()
            with torch.enable_grad():
                ((model(x[index]) - y[index]) ** 2).mean().backward()
            optimizer.step()
        return carry, x.sum()

    params = tuple(p for m in models for p in m.parameters())
    before = [p.detach().clone() for p in params]
    with pytest.raises(RuntimeError, match=r"warm-up steps changed the state of optimizers\[0\]"):
        capture_step(step_fn, params, *batches(1)[0])
    assert all(torch.equal(p, b) for p, b in zip(params, before))


def test_a_buffer_written_outside_the_carry_is_refused():
    counter = torch.nn.Module()
    counter.register_buffer("seen", torch.zeros(()))

    def step_fn(carry, x):
        counter.seen.add_(1)  # in place, outside the carry
        return (carry[0] + x,), x

    with pytest.raises(RuntimeError, match=r"changed a tensor of counter\.seen"):
        capture_step(step_fn, (torch.zeros(2),), torch.ones(2))


# Read through module globals by the steps below: a recorded step keeps what they held.
STEP_SIZE = 0.1
STEP_OPTIMIZER = optim.sgd(lr=0.1)


def _global_rate_step(ensemble, config):
    def train_step(carry, x, y):
        (params,) = carry

        def loss(p):
            return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()

        grads, value = grad_and_value(loss)(params)
        rate = STEP_SIZE * config.scale
        return (params.apply(lambda p, g: p - rate * g, grads),), value

    return train_step


class _Config:
    def __init__(self):
        self.scale = 1.0
        self.calls = 0  # not read by the step: free to change


def test_a_rebound_global_or_closed_over_value_is_refused():
    """A replay keeps the Python numbers and objects the step read at the capture: a
    global or an attribute rebound since then is refused, not silently ignored (the CPU
    path would pick the new value up, a recorded CUDA graph would not)."""
    global STEP_SIZE
    ensemble = Ensemble(*members())
    config = _Config()
    x, y = batches(1)[0]
    step = capture_step(_global_rate_step(ensemble, config), (ensemble.params,), x, y)
    step(x, y)
    config.calls += 1  # an attribute the step does not name
    step(x, y)
    try:
        STEP_SIZE = 0.5
        with pytest.raises(RuntimeError, match=r"'STEP_SIZE', which the step reads, was 0\.1"):
            step(x, y)
    finally:
        STEP_SIZE = 0.1
    step(x, y)
    config.scale = 2.0
    with pytest.raises(RuntimeError, match=r"'config\.scale'.* 1\.0 .* 2\.0 now"):
        step(x, y)
    config.scale = 1.0
    step(x, y)


def test_a_rebound_global_optimizer_is_refused():
    global STEP_OPTIMIZER
    ensemble = Ensemble(*members())

    def train_step(carry, x, y):
        params, state = carry

        def loss(p):
            return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()

        grads, value = grad_and_value(loss)(params)
        updates, state = STEP_OPTIMIZER.update(grads, state, params)
        return (optim.apply_updates(params, updates), state), value

    x, y = batches(1)[0]
    params = ensemble.params
    step = capture_step(train_step, (params, STEP_OPTIMIZER.init(params)), x, y)
    step(x, y)
    original = STEP_OPTIMIZER
    try:
        STEP_OPTIMIZER = optim.sgd(lr=0.5)  # same state structure: it would run silently
        with pytest.raises(RuntimeError, match=r"'STEP_OPTIMIZER', which the step reads"):
            step(x, y)
    finally:
        STEP_OPTIMIZER = original
    step(x, y)


def test_a_rebound_dict_entry_is_refused_only_where_the_step_names_it():
    ensemble = Ensemble(*members())
    config = {"rate": 0.1, "log_every": 10}

    def train_step(carry, x, y):
        (params,) = carry

        def loss(p):
            return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()

        grads, value = grad_and_value(loss)(params)
        return (params.apply(lambda p, g: p - config["rate"] * g, grads),), value

    x, y = batches(1)[0]
    step = capture_step(train_step, (ensemble.params,), x, y)
    config["log_every"] = 5  # not read by the step
    step(x, y)
    config["rate"] = 0.3
    with pytest.raises(RuntimeError, match=r"config\['rate'\].* 0\.1 .* 0\.3 now"):
        step(x, y)


# a user's settings module (``import settings`` then ``settings.rate``)
SETTINGS = types.ModuleType("train_settings")
SETTINGS.rate = 0.1
SETTINGS.log_every = 10


def test_a_rebound_attribute_of_a_users_module_is_refused():
    ensemble = Ensemble(*members())

    def train_step(carry, x, y):
        (params,) = carry

        def loss(p):
            return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()

        grads, value = grad_and_value(loss)(params)
        return (params.apply(lambda p, g: p - SETTINGS.rate * g, grads),), value

    x, y = batches(1)[0]
    step = capture_step(train_step, (ensemble.params,), x, y)
    SETTINGS.log_every = 5  # not read by the step
    step(x, y)
    try:
        SETTINGS.rate = 0.3
        with pytest.raises(RuntimeError, match=r"'SETTINGS\.rate'.* 0\.1 .* 0\.3 now"):
            step(x, y)
    finally:
        SETTINGS.rate = 0.1
    step(x, y)


def test_a_call_under_another_autocast_setting_is_refused():
    # the CPU would run the step in the caller's autocast; a recorded graph keeps the kernels
    # and dtypes of the capture, so the two devices would train differently
    ensemble = Ensemble(*members())
    opt = optim.sgd(lr=0.1)
    x, y = batches(1)[0]
    params = ensemble.params
    step = capture_step(make_step(ensemble, opt), (params, opt.init(params)), x, y)
    step(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(
            RuntimeError, match=r"autocast on cpu was off .* on \(torch\.bfloat16\)"
        ):
            step(x, y)
    step(x, y)
