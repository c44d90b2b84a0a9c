"""The ways of running N members that every ensemble benchmark times: tdfunc's
``Ensemble``, ``torch.func`` (``stack_module_state`` + ``functional_call`` in ``vmap``)
and a Python loop. Each returns a zero-argument callable; a benchmark adds its own
hand-written batched form beside them.
"""

from __future__ import annotations

import copy

import torch
from torch.func import functional_call, grad, stack_module_state

from tdfunc import Ensemble


def _meta_copy(models: list):
    return copy.deepcopy(models[0]).to("meta")


def forward_of(kind: str, models: list, x: torch.Tensor):
    """Every member's output on the shared input ``x``, computed the ``kind`` way."""
    if kind == "tdfunc_ensemble":
        ensemble = Ensemble(*models)
        return lambda: ensemble(x)
    if kind == "torch_func":
        params, buffers = stack_module_state(models)
        base = _meta_copy(models)

        def one(params, buffers, x):
            return functional_call(base, (params, buffers), (x,))

        vmapped = torch.vmap(one, in_dims=(0, 0, None))
        return lambda: vmapped(params, buffers, x)
    if kind == "loop":
        return lambda: torch.stack([m(x) for m in models])
    raise ValueError(kind)


def train_step_of(kind: str, models: list, x: torch.Tensor):
    """One forward and backward of every member's loss (``output.square().sum()``)."""
    if kind == "tdfunc_ensemble":
        ensemble = Ensemble(*models)
        return lambda: ensemble(x).square().sum().backward()
    if kind == "torch_func":
        params, buffers = stack_module_state(models)
        base = _meta_copy(models)

        def loss(params, buffers, x):
            return functional_call(base, (params, buffers), (x,)).square().sum()

        vmapped = torch.vmap(grad(loss), in_dims=(0, 0, None))
        return lambda: vmapped(params, buffers, x)
    if kind == "loop":

        def step():
            for m in models:
                m(x).square().sum().backward()

        return step
    raise ValueError(kind)
