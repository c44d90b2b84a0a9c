"""One table of functional optimizers, named and composed, and the contract each keeps.

Every entry is checked against ``torch.optim`` run per member on ordinary tensors,
for purity, for derivatives through inner steps (finite differences), for ``vmap``
over members against a loop, and each chain against its named optimizer.
"""

from __future__ import annotations

import pytest
import torch
from optimizer_table import OPTIMIZERS

from tdfunc import TensorDict, optim

N = 3
SHAPES = {"a": (4,), "b": (2, 3)}


def _clip_then(cls):
    """A torch reference that clips each member's gradients before its optimizer steps."""
    return ("clip", cls)


def _named(row):
    return lambda lr: row.functional(lr, **row.contract)


def _chained(row):
    return lambda lr: row.chain(lr, **row.contract)


# id: (torch optimizer, its per-member kwargs given lr, the functional optimizer given lr):
# every optimizer of the table, named and spelled as a chain, then chains of other shapes
TABLE = {}
for _name, _row in OPTIMIZERS.items():
    TABLE[_name] = (_row.torch, _row.contract, _named(_row))
    TABLE[f"{_name}-chain"] = (_row.torch, _row.contract, _chained(_row))
TABLE.update({
    "sgd-dampening-chain": (
        torch.optim.SGD,
        dict(momentum=0.8, dampening=0.3),
        lambda lr: optim.chain(
            optim.scale_by_momentum(0.8, dampening=0.3), optim.scale_by_learning_rate(lr)
        ),
    ),
    "rmsprop-plain-chain": (
        torch.optim.RMSprop,
        dict(),
        lambda lr: optim.chain(optim.scale_by_rms(), optim.scale_by_learning_rate(lr)),
    ),
    "clip-sgd-chain": (
        _clip_then(torch.optim.SGD),
        dict(),
        lambda lr: optim.chain(
            optim.clip_by_global_norm(0.5, per_member=True), optim.scale_by_learning_rate(lr)
        ),
    ),
})  # fmt: skip
# chain id -> named id: the same numbers, bit for bit
PAIRS = {f"{name}-chain": name for name in OPTIMIZERS}
LR = [0.1, 0.05, 0.2]


def tol(dtype):
    if dtype in (torch.float64, torch.complex128):
        return {"rtol": 1e-11, "atol": 1e-12}
    return {"rtol": 1e-5, "atol": 1e-6}


def stacked(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn((N, *s), generator=g, dtype=torch.float64).to(dtype)
        if not dtype.is_complex
        else torch.randn((N, *s), generator=g, dtype=dtype)
        for k, s in SHAPES.items()
    }


def run(opt, params, grads_seq, members=None):
    state = opt.init(params)
    for grads in grads_seq:
        updates, state = opt.update(grads, state, params, members=members)
        params = optim.apply_updates(params, updates)
    return params


def torch_reference(entry, params, grads_seq, lrs=LR):
    """Each member stepped by its own torch optimizer over ordinary tensors."""
    cls, kwargs, _ = entry
    clip = isinstance(cls, tuple)
    if clip:
        cls = cls[1]
    out = {k: [] for k in params}
    for i in range(N):
        member = {k: v[i].clone().requires_grad_(True) for k, v in params.items()}
        opt = cls(list(member.values()), lr=lrs[i], **kwargs)
        for grads in grads_seq:
            for k, p in member.items():
                p.grad = grads[k][i].clone()
            if clip:
                torch.nn.utils.clip_grad_norm_(list(member.values()), 0.5)
            opt.step()
        for k, p in member.items():
            out[k].append(p.detach())
    return {k: torch.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
@pytest.mark.parametrize("name", list(TABLE))
def test_matches_torch_optim_per_member(name, dtype):
    entry = TABLE[name]
    params = stacked(dtype, 0)
    grads_seq = [stacked(dtype, s) for s in (1, 2, 3)]
    lr = torch.tensor(LR, dtype=torch.float64)
    ours = run(entry[2](lr), TensorDict(params, batch_size=[N]), [
        TensorDict(g, batch_size=[N]) for g in grads_seq
    ])  # fmt: skip
    expected = torch_reference(entry, params, grads_seq)
    for k in SHAPES:
        torch.testing.assert_close(ours[k], expected[k], **tol(dtype))


@pytest.mark.parametrize("name", list(TABLE))
def test_pure_inputs_not_mutated(name):
    params = TensorDict(stacked(torch.float32, 0), batch_size=[N])
    grads = TensorDict(stacked(torch.float32, 1), batch_size=[N])
    opt = TABLE[name][2](0.1)
    state = opt.init(params)
    before = [t.clone() for t in (params, grads)]
    state_before = [s.clone() for s in state] if isinstance(state, tuple) else state.clone()
    opt.update(grads, state, params)
    for old, new in zip(before, (params, grads)):
        assert (old == new).all()
    if isinstance(state, tuple):
        for old, new in zip(state_before, state):
            assert (old == new).all()
    else:
        assert (state_before == state).all()


@pytest.mark.parametrize("name", list(TABLE))
def test_differentiable_through_three_steps(name):
    """The gradient through three inner steps agrees with finite differences."""
    opt = TABLE[name][2](0.1)
    target = stacked(torch.float64, 7)
    row = OPTIMIZERS.get(name.removesuffix("-chain"))
    # an ascending optimizer is given the negated gradient: the same bounded descent
    sign = -1.0 if row is not None and row.maximize else 1.0

    def outer(a, b):
        params = TensorDict({"a": a, "b": b}, batch_size=[N])
        state = opt.init(params)
        for _ in range(3):
            grads = TensorDict(
                {k: sign * (params[k] ** 3 - target[k]) for k in SHAPES}, batch_size=[N]
            )
            updates, state = opt.update(grads, state, params)
            params = optim.apply_updates(params, updates)
        return sum((params[k] ** 2).sum() for k in SHAPES)

    start = stacked(torch.float64, 5)
    inputs = tuple(start[k].clone().requires_grad_(True) for k in SHAPES)
    assert torch.autograd.gradcheck(outer, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name", list(TABLE))
def test_vmap_over_members_equals_loop(name):
    opt = TABLE[name][2](0.1)
    if name.startswith("clip"):  # each vmapped call is one member: its global norm is its own
        opt = optim.chain(optim.clip_by_global_norm(0.5), optim.scale_by_learning_rate(0.1))
    params = stacked(torch.float32, 0)
    grads_seq = [stacked(torch.float32, s) for s in (1, 2)]

    def one(p, g1, g2):
        return run(opt, p, [g1, g2])

    batched = torch.func.vmap(one)(params, *grads_seq)
    for i in range(N):
        member = run(
            opt,
            {k: v[i] for k, v in params.items()},
            [{k: v[i] for k, v in g.items()} for g in grads_seq],
        )
        for k in SHAPES:
            torch.testing.assert_close(batched[k][i], member[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chained", list(PAIRS))
def test_chain_equals_named(chained, dtype):
    lr = torch.tensor(LR, dtype=torch.float64)
    params = TensorDict(stacked(dtype, 0), batch_size=[N])
    grads_seq = [TensorDict(stacked(dtype, s), batch_size=[N]) for s in (1, 2, 3, 4)]
    ours = run(TABLE[chained][2](lr), params, grads_seq)
    named = run(TABLE[PAIRS[chained]][2](lr), params, grads_seq)
    for k in SHAPES:
        # the chain folds the step size where the named optimizer does: the same bits
        assert torch.equal(ours[k], named[k])


@pytest.mark.parametrize("name", list(TABLE))
def test_members_subset_steps_only_those_members(name):
    opt = TABLE[name][2](0.1)
    params = TensorDict(stacked(torch.float64, 0), batch_size=[N])
    grads_seq = [TensorDict(stacked(torch.float64, s), batch_size=[N]) for s in (1, 2)]
    mask = torch.tensor([True, False, True])
    ours = run(opt, params, grads_seq, members=mask)
    full = run(opt, params, grads_seq)
    for k in SHAPES:
        torch.testing.assert_close(ours[k][mask], full[k][mask], rtol=1e-12, atol=1e-12)
        assert torch.equal(ours[k][~mask], params[k][~mask])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex128])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_stateful_matches_torch_optim_per_member(name, dtype):
    row = OPTIMIZERS[name]
    params = stacked(dtype, 0)
    grads_seq = [stacked(dtype, s) for s in (1, 2, 3)]
    tensors = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    opt = row.stateful(list(tensors.values()), lr=torch.tensor(LR), **row.contract)
    for grads in grads_seq:
        for k, p in tensors.items():
            p.grad = grads[k].clone()
        opt.step()
    # the stateful optimizer keeps lr as given (float32), as the loop's optimizers read it
    lr32 = [float(v) for v in torch.tensor(LR)]
    expected = torch_reference((row.torch, row.contract, None), params, grads_seq, lr32)
    for k in SHAPES:
        torch.testing.assert_close(tensors[k].detach(), expected[k], **tol(dtype))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_stateful_is_bit_identical_to_torch_optim(name, dtype, foreach):
    """Float hyperparameters: torch.optim's arithmetic in its order, the same bits, both paths."""
    row = OPTIMIZERS[name]
    kwargs = {"lr": 0.1, **row.contract}
    params = stacked(dtype, 0)
    grads_seq = [stacked(dtype, s) for s in (1, 2, 3)]
    ours = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    theirs = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    opt = row.stateful(list(ours.values()), **kwargs)
    reference = row.torch(list(theirs.values()), foreach=foreach, **kwargs)
    for grads in grads_seq:
        for k in SHAPES:
            ours[k].grad, theirs[k].grad = grads[k].clone(), grads[k].clone()
        opt.step()
        reference.step()
    for k in SHAPES:
        assert torch.equal(ours[k].detach(), theirs[k].detach()), k
        for moment in row.moments:
            if reference.state[theirs[k]].get(moment) is not None:
                assert torch.equal(opt.state[ours[k]][moment], reference.state[theirs[k]][moment])


@pytest.mark.parametrize("direction", ["torch-to-tdfunc", "tdfunc-to-torch"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_state_dicts_cross_with_torch_optim(name, direction):
    """Two steps by one library, saved, loaded into the other, two more: as one run of torch's."""
    row = OPTIMIZERS[name]
    kwargs = {"lr": 0.1, **row.contract}
    start, grads_seq = (
        stacked(torch.float64, 0)["b"],
        [stacked(torch.float64, s)["b"] for s in (1, 2, 3, 4)],
    )
    reference = torch.nn.Parameter(start.clone())
    theirs = row.torch([reference], foreach=False, **kwargs)
    ours = torch.nn.Parameter(start.clone())
    first, second = (row.torch, row.stateful)
    if direction == "tdfunc-to-torch":
        first, second = second, first
    opt = first([ours], **kwargs)
    for index, grad in enumerate(grads_seq):
        if index == 2:
            saved = opt.state_dict()
            opt = second([ours], **kwargs)
            opt.load_state_dict(saved)
        ours.grad, reference.grad = grad.clone(), grad.clone()
        opt.step()
        theirs.step()
    torch.testing.assert_close(ours.detach(), reference.detach(), rtol=1e-12, atol=1e-12)


def test_chain_errors_name_the_api():
    with pytest.raises(TypeError, match="chain: argument 1"):
        optim.chain(optim.scale_by_adam(), object())
    with pytest.raises(ValueError, match="scale_by_adam: b1"):
        optim.scale_by_adam(b1=1.5)
    with pytest.raises(ValueError, match="clip_by_global_norm: max_norm"):
        optim.clip_by_global_norm(-1.0)
    opt = optim.chain(optim.add_decayed_weights(0.1), optim.scale_by_learning_rate(0.1))
    params = {"w": torch.ones(2)}
    state = opt.init(params)
    with pytest.raises(ValueError, match="weight decay needs the parameters"):
        opt.update(params, state)
    with pytest.raises(ValueError, match="tuple of 2 states"):
        opt.update(params, state[0], params)


def test_clip_per_member_equals_global_clip_under_vmap():
    params = stacked(torch.float64, 0)
    grads = stacked(torch.float64, 1)
    clip = optim.clip_by_global_norm(0.5)

    def one(p, g):
        return clip.update(g, clip.init(p), p)[0]

    expected = torch.func.vmap(one)(params, grads)
    per_member = optim.clip_by_global_norm(0.5, per_member=True)
    tp, tg = TensorDict(params, batch_size=[N]), TensorDict(grads, batch_size=[N])
    ours = per_member.update(tg, per_member.init(tp), tp)[0]
    for k in SHAPES:
        torch.testing.assert_close(ours[k], expected[k], rtol=1e-12, atol=1e-12)


def test_clip_per_member_refuses_unstacked_parameters():
    """A leaf's dim 0 is not a member dim unless the state says so: an error, not a guess."""
    clip = optim.clip_by_global_norm(0.5, per_member=True)
    params = {"w": torch.ones(3, 2)}
    with pytest.raises(ValueError, match=r"per_member=True.*batch size \[N\]"):
        clip.update(params, clip.init(params), params)


COMPILED = {
    **{name: TABLE[name][2] for name in TABLE if name.split("-")[0] in OPTIMIZERS},
    "clip-adamw-chain": lambda lr: optim.chain(
        optim.clip_by_global_norm(1.0, per_member=True),
        optim.scale_by_adam(),
        optim.add_decayed_weights(0.01),
        optim.scale_by_learning_rate(lr),
    ),
}


@pytest.mark.parametrize("name", list(COMPILED))
def test_compiles_once_without_graph_breaks(name):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    opt = COMPILED[name](torch.tensor([0.1, 0.2]))
    params = TensorDict({"w": torch.randn(2, 3)}, batch_size=[2])
    state = eager_state = opt.init(params)
    counter = CompileCounter()
    step = torch.compile(opt.update, backend=counter, fullgraph=True)
    for seed in range(3):
        grads = TensorDict(
            {"w": torch.randn(2, 3, generator=torch.Generator().manual_seed(seed))}, [2]
        )
        updates, state = step(grads, state, params)
        expected, eager_state = opt.update(grads, eager_state, params)
        torch.testing.assert_close(updates["w"], expected["w"])
    assert counter.frame_count == 1


def test_replaced_hyperparameters_are_range_checked():
    t = optim.scale_by_learning_rate(0.1)
    params = {"w": torch.ones(2)}
    state = t.init(params)
    t.hyperparameters["lr"] = -1.0
    with pytest.raises(ValueError, match=r"scale_by_learning_rate.*lr must be >= 0\.0"):
        t.update(params, state, params)
