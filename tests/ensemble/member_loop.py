"""An ensemble against a Python loop over its member modules: outputs and gradients."""

from __future__ import annotations

import copy

import torch

from tdfunc import Ensemble

MEMBERS = 3
ATOL = 1e-5


def members(make, count: int = MEMBERS) -> list:
    torch.manual_seed(0)
    return [make() for _ in range(count)]


def flat(value) -> list:
    return [v for v in torch.utils._pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def check_against_loop(models: list, args_for, in_dims=None) -> None:
    """Forward and backward of an ensemble of copies of ``models`` against the loop.

    ``args_for(i)``: member ``i``'s inputs (``None``: the shared inputs).
    """
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=in_dims)
    models = copy.deepcopy(models)  # fresh gradients on both sides
    assert "vmapped" not in ensemble.batched_summary, ensemble.batched_summary
    shared = in_dims is None
    args = args_for(None) if shared else stacked_args(args_for)
    out = ensemble(*args)
    refs = [model(*args_for(None if shared else i)) for i, model in enumerate(models)]
    got = flat(out)
    expected = [torch.stack(parts) for parts in zip(*map(flat, refs))]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, atol=ATOL, rtol=1e-4)
    # integer outputs (pooling indices) carry no gradient: they were compared above
    got, expected = zip(*[(g, e) for g, e in zip(got, expected) if e.is_floating_point()])
    weights = [torch.randn_like(e) for e in expected]
    sum((g * w).sum() for g, w in zip(got, weights)).backward()
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    for key, stacked in ensemble.params.items(True, True):
        name = ".".join(key) if isinstance(key, tuple) else key
        states = [m.state_dict(keep_vars=True)[name] for m in models]
        # buffers (running statistics) as the loop left them; parameters' gradients
        torch.testing.assert_close(stacked.detach(), torch.stack(states).detach(), msg=name)
        grads = [state.grad for state in states]
        if stacked.grad is None:
            assert all(g is None for g in grads), name
            continue
        torch.testing.assert_close(stacked.grad, torch.stack(grads), atol=ATOL, rtol=1e-4)


def stacked_args(args_for) -> tuple:
    per_member = [args_for(i) for i in range(MEMBERS)]
    return tuple(
        torch.utils._pytree.tree_map(lambda *xs: torch.stack(xs), *parts)
        for parts in zip(*per_member)
    )
