"""An ensemble of attention modules against a Python loop over ordinary modules.

Unlike ``member_loop.check_against_loop`` the calls take keyword arguments, may
return ``None`` among their outputs, and can run in eval mode or without gradients.
"""

from __future__ import annotations

import copy

import torch
from member_loop import flat

from tdfunc import Ensemble

ATOL = 2e-5


def member_value(value, dim, index):
    if isinstance(value, torch.Tensor) and dim is not None:
        return value.select(dim, index)
    return value


def compare(got, expected, atol=ATOL):
    """``got`` (member-leading) equals the members' outputs stacked, ``None``s included."""
    got_leaves, got_spec = torch.utils._pytree.tree_flatten(got)
    parts = [torch.utils._pytree.tree_flatten(e) for e in expected]
    assert all(spec == got_spec for _, spec in parts), (got_spec, parts[0][1])
    for position, value in enumerate(got_leaves):
        if value is None:
            assert all(leaves[position] is None for leaves, _ in parts)
            continue
        stacked = torch.stack([leaves[position] for leaves, _ in parts])
        assert value.shape == stacked.shape, (value.shape, stacked.shape)
        torch.testing.assert_close(value, stacked, atol=atol, rtol=1e-4, equal_nan=True)


def check(models, args, kwargs=None, in_dims=None, train=True, grad=True, batched=True,
          atol=ATOL):  # fmt: skip
    """Outputs and parameter gradients of an ensemble of copies of ``models`` against
    the loop. ``args``: the ensemble's positional inputs (``in_dims`` says which carry
    the member dim); ``kwargs``: shared keyword inputs."""
    kwargs = kwargs or {}
    ensemble = Ensemble(*copy.deepcopy(models), in_dims=in_dims).train(train)
    loop = [copy.deepcopy(m).train(train) for m in models]
    if batched:
        assert "vmapped" not in ensemble.batched_summary, ensemble.batched_summary
    dims = in_dims if isinstance(in_dims, tuple) else (in_dims,) * len(args)
    with torch.set_grad_enabled(grad):
        out = ensemble(*args, **kwargs)
        expected = [
            m(*[member_value(a, d, i) for a, d in zip(args, dims)], **kwargs)
            for i, m in enumerate(loop)
        ]
    compare(out, expected, atol)
    if not grad:
        return ensemble, out
    got = flat(out)
    refs = [torch.stack(parts) for parts in zip(*map(flat, expected))]
    weights = [torch.randn_like(r) for r in refs]
    total = sum(((g * w).nan_to_num()).sum() for g, w in zip(got, weights))
    total.backward()
    sum(((e * w).nan_to_num()).sum() for e, w in zip(refs, weights)).backward()
    for name, stacked in ensemble.named_parameters():
        name = name[len("stacked.") :]
        grads = [m.get_parameter(name).grad for m in loop]
        if stacked.grad is None:
            assert all(g is None for g in grads), name
            continue
        torch.testing.assert_close(stacked.grad, torch.stack(grads), atol=atol, rtol=1e-4, msg=name)
    return ensemble, out
