"""Checking a registered batched implementation against the module it replaces.

A function given to ``register_batched`` is trusted to be the batched form of
its module; a wrong one (a dropped member dim, a transposed weight) would give
wrong numbers with no error. So on its first call for each input signature
(shapes, dtypes and devices of the inputs and stacked tensors, training mode)
its output is compared with the template module run alone on the first and
the last member (``torch.func.functional_call`` with that member's tensors,
under ``no_grad``, with the random number generators restored afterwards):

- every tensor of the output must carry the member dim first, and member
  ``k``'s slice must equal the module's output for member ``k``;
- buffers the function updates in place (running statistics) must end where
  the module's own update takes them.

A mismatch raises. Calls that are traced or transformed (``torch.compile``,
``torch.export``, ``torch.func`` transforms) run unchecked and leave the check
to the next plain call. ``register_batched(..., trusted=True)`` skips the
check (a layer that draws random numbers cannot match member by member).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from .cache import tracing


def _signature(leaves: tuple, positions: tuple, inputs: tuple, kwargs: dict, training: bool):
    values = pytree.tree_leaves((inputs, kwargs))
    return (
        training,
        tuple(sorted(kwargs)),
        tuple(
            (tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else type(v)
            for v in values
        ),
        tuple((tuple(leaves[i].shape), leaves[i].dtype, leaves[i].device) for i in positions),
    )


def _member(value: Any, index: int) -> Any:
    return pytree.tree_map(lambda v: v[index] if isinstance(v, torch.Tensor) else v, value)


def _tolerance(dtype: torch.dtype) -> float:
    if dtype == torch.float64 or dtype == torch.complex128:
        return 1e-9
    if dtype == torch.float32 or dtype == torch.complex64:
        return 1e-4
    return 1e-2


def _mismatch(got: torch.Tensor, expected: torch.Tensor) -> str | None:
    if tuple(got.shape) != tuple(expected.shape):
        return f"shape {tuple(got.shape)} instead of {tuple(expected.shape)}"
    got, expected = got.detach(), expected.detach()
    if not (got.is_floating_point() or got.is_complex()):
        return None if torch.equal(got, expected) else "different values"
    tolerance = _tolerance(got.dtype)
    scale = max(1.0, float(expected.abs().max())) if expected.numel() else 1.0
    if torch.allclose(got, expected.to(got.dtype), rtol=tolerance, atol=tolerance * scale):
        return None
    difference = float((got - expected).abs().max())
    return f"values off by up to {difference:.3g}"


def checked_step(
    step: Callable, module: nn.Module, names: tuple, positions: tuple, label: str
) -> Callable:
    """``step`` (a registered function's step) with the first-use check of the module docstring."""
    seen: set = set()

    def check(leaves: tuple, *inputs, **kwargs):
        if tracing():
            return step(leaves, *inputs, **kwargs)
        signature = _signature(leaves, positions, inputs, kwargs, module.training)
        if signature in seen:
            return step(leaves, *inputs, **kwargs)
        members = _count(leaves, positions, inputs)
        chosen = sorted({0, members - 1}) if members else []
        before = [[leaves[i][k].detach().clone() for i in positions] for k in chosen]
        out = step(leaves, *inputs, **kwargs)
        _compare(out, leaves, inputs, kwargs, chosen, before, members, module, names, positions,
                 label)  # fmt: skip
        seen.add(signature)
        return out

    return check


def _count(leaves: tuple, positions: tuple, inputs: tuple) -> int:
    if positions:
        return leaves[positions[0]].shape[0]
    for value in pytree.tree_leaves(inputs):
        if isinstance(value, torch.Tensor):
            return value.shape[0]
    return 0


def _compare(out, leaves, inputs, kwargs, chosen, before, members, module, names, positions,
             label) -> None:  # fmt: skip
    hint = (
        f"The function must return member-leading outputs ([{members}, ...]) equal to running "
        f"the module on each member alone. If it is right but cannot match member by member "
        f"(it draws random numbers), register it with trusted=True."
    )
    flat_out, spec = pytree.tree_flatten(out)
    for tensor in flat_out:
        if isinstance(tensor, torch.Tensor) and (tensor.dim() == 0 or tensor.shape[0] != members):
            raise ValueError(
                f"{label}: the batched implementation returned a tensor of shape "
                f"{tuple(tensor.shape)} for an ensemble of {members} members: its first dim "
                f"must be the member dim ({members}). {hint}"
            )
    devices = sorted(
        {v.device.index or 0 for v in (*leaves, *pytree.tree_leaves(inputs))
         if isinstance(v, torch.Tensor) and v.device.type == "cuda"}
    )  # fmt: skip
    for k, tensors in zip(chosen, before):
        params = dict(zip(names, tensors))
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                expected = torch.func.functional_call(
                    module, params, _member(inputs, k), _member(kwargs, k), tie_weights=False
                )
        except Exception as error:
            raise RuntimeError(
                f"{label}: cannot check the batched implementation: running the module on "
                f"member {k} alone failed ({type(error).__name__}: {error}). Register it with "
                f"trusted=True to skip the check."
            ) from error
        flat_expected, expected_spec = pytree.tree_flatten(expected)
        if expected_spec != spec:
            raise ValueError(
                f"{label}: the batched implementation returned {spec} where the module gives "
                f"{expected_spec} for one member. {hint}"
            )
        for position, (got, want) in enumerate(zip(flat_out, flat_expected)):
            if not isinstance(want, torch.Tensor):
                continue
            problem = _mismatch(got[k], want)
            if problem is not None:
                where = f"output {position}" if len(flat_out) > 1 else "the output"
                raise ValueError(
                    f"{label}: for member {k}, {where} of the batched implementation differs "
                    f"from running the module on member {k} alone: {problem}. {hint}"
                )
        for name, position, state in zip(names, positions, tensors):
            problem = _mismatch(leaves[position][k], state)
            if problem is not None:
                raise ValueError(
                    f"{label}: for member {k}, the tensor {name!r} after the batched "
                    f"implementation differs from its value after running the module on "
                    f"member {k} alone (an in-place update): {problem}. {hint}"
                )
