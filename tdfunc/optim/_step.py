"""One step of the stateful optimizers: of every member, or of some (``members=``).

The hooks of ``torch.optim`` run around it, gradients are off inside it, and the
parameters with gradients are gathered in buckets that share a step count (one
foreach call per bucket).
"""

from __future__ import annotations

import functools
from itertools import chain
from typing import Any

import torch
from torch.optim import optimizer as _torch_optimizer

from .._core.helpers.tracing import compiling as _is_compiling
from ._groups import member_rows

_profiling = torch._C._autograd._profiler_enabled


def _hooked(step, self, args: tuple, kwargs: dict):
    """``step`` between the step pre-hooks and post-hooks, as ``torch.optim`` runs it."""
    pre_hooks = _torch_optimizer._global_optimizer_pre_hooks
    post_hooks = _torch_optimizer._global_optimizer_post_hooks
    own_pre, own_post = self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks
    if not (pre_hooks or post_hooks or own_pre or own_post):
        out = step(*args, **kwargs)
        self._optimizer_step_code()
        return out
    for hook in chain(pre_hooks.values(), own_pre.values()):
        result = hook(self, args, kwargs)
        if result is not None:
            if not (isinstance(result, tuple) and len(result) == 2):
                raise RuntimeError(
                    f"{type(self).__name__}.step: a step pre-hook must return None or a tuple "
                    f"(new_args, new_kwargs), got {result!r}."
                )
            args, kwargs = result
    out = step(*args, **kwargs)
    self._optimizer_step_code()
    for hook in chain(own_post.values(), post_hooks.values()):
        hook(self, args, kwargs)
    return out


def _without_grad(step):
    """``step`` run with gradients off, as under ``torch.no_grad()`` (minus its per-call object)."""

    @functools.wraps(step)
    def run(*args, **kwargs):
        previous = torch.is_grad_enabled()
        _set_grad_enabled(False)
        try:
            return step(*args, **kwargs)
        finally:
            _set_grad_enabled(previous)

    return run


_set_grad_enabled = torch._C._set_grad_enabled


class Steps:
    """``step`` (all members or some), with ``torch.optim``'s hooks around it."""

    param_groups: list
    state: Any

    @staticmethod
    def profile_hook_step(func):  # type: ignore[override]
        """Wrap ``step`` with the step hooks, and label it only while a profiler records.

        ``torch.optim.Optimizer`` enters a ``record_function`` on every step,
        which costs about as much as all the Python work of a foreach step
        over a few stacked leaves; the hooks and the label are the same here.
        """

        @functools.wraps(func)
        def step(*args, **kwargs):
            self = args[0]
            # the profiler's state is no tensor: a graph break if read while compiling
            if not _is_compiling() and _profiling():
                label = f"Optimizer.step#{type(self).__name__}.step"
                with torch.autograd.profiler.record_function(label):
                    return _hooked(func, self, args, kwargs)
            return _hooked(func, self, args, kwargs)

        return step

    @_without_grad
    def step(self, closure=None, *, members: Any = None):  # type: ignore[override]
        """One step for every parameter with a gradient; returns ``closure()`` if given.

        Args:
            closure: as in ``torch.optim``.
            members: step only these members (indices, a slice, a bool mask of
                shape ``[N]``, or ``ensemble[...]``): the others keep their
                parameters and state, as if their optimizers had not stepped.
                Groups declared without a member dim step whole.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        resolved = self._resolved()
        self._check_states(resolved)
        for group, hypers in resolved:
            self._prepare(group)
            if members is None or not group["member_dim"]:
                for params, grads, states in self._gather(group).values():
                    self._update(hypers, params, grads, states)
            else:
                self._update_rows(group, hypers, members)
        return loss

    def _entries(self, group: dict) -> list:
        """``(param, grad, state)`` for the parameters with gradients; new states made."""
        state_of = self.state
        entries = []
        started = []
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__}: sparse gradients are not supported.")
            state = state_of[param]
            if not state:
                state.update(self._fresh(group, param))
                started.append(state)
            entries.append((param, grad, state))
        if started:
            self._on_new_states(started)
        return entries

    def _gather(self, group: dict) -> dict:
        """``{step count: (params, grads, states)}`` for the parameters with gradients."""
        buckets: dict = {}
        compiling = _is_compiling()
        for position, (param, grad, state) in enumerate(self._entries(group)):
            step = state.get("step")
            if step is None:
                key: Any = not state.get("_started", True)
            elif compiling:
                # reading a count is a graph break: each parameter its own bucket, its
                # count a tensor in the graph (as torch.optim's compiled steps keep it)
                key = position
            elif step.dim():  # counts per member (after steps of some members)
                key = tuple(step.tolist())
            else:
                key = float(step)
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = ([], [], [])
            bucket[0].append(param)
            bucket[1].append(grad)
            bucket[2].append(state)
        return buckets

    def _update_rows(self, group: dict, hypers: dict, members: Any) -> None:
        """Step the rows ``members`` selects: on gathered copies, written back."""
        entries = self._entries(group)
        if not entries:
            return
        api = f"{type(self).__name__}.step"
        count = entries[0][0].shape[0]
        rows = member_rows(api, members, count)
        self._check_rows(api, group)
        hypers = {key: _rows_of(value, rows) for key, value in hypers.items()}
        for param, grad, state in entries:
            step = state.get("step")
            if isinstance(step, torch.Tensor) and step.dim() == 0:
                # each member counts its own steps from now on (bias corrections differ)
                state["step"] = step.expand(count).clone()
            sub_state = {k: _rows_of(v, rows) for k, v in state.items()}
            sub_param = param.detach().index_select(0, rows)
            self._update(hypers, [sub_param], [grad.index_select(0, rows)], [sub_state])
            param.detach().index_copy_(0, rows, sub_param)
            for key, value in sub_state.items():
                if isinstance(value, torch.Tensor) and value.dim():
                    state[key].index_copy_(0, rows, value)
                else:
                    state[key] = value

    def _check_rows(self, api: str, group: dict) -> None:
        """Refuse what a step of some members cannot follow (none by default)."""

    def _check_states(self, resolved: list) -> None:
        """Refuse, before any group steps, states that this step cannot continue.

        ``resolved``: ``(group, plan)`` per group, as :meth:`_resolved` gives them.
        """

    def _prepare(self, group: dict) -> None:
        """Called with each group before its step."""

    def _fresh(self, group: dict, param: torch.Tensor) -> dict:
        raise NotImplementedError

    def _update(self, plan: dict, params: list, grads: list, states: list) -> None:
        raise NotImplementedError

    def _on_new_states(self, states: list) -> None:
        """Called with the states :meth:`_entries` has just created."""


def _rows_of(value: Any, rows: torch.Tensor) -> Any:
    """The selected members' values: rows of an ``[N, ...]`` tensor, anything else as is."""
    if isinstance(value, tuple):
        return tuple(_rows_of(v, rows) for v in value)
    if isinstance(value, torch.Tensor) and value.dim():
        return value.as_subclass(torch.Tensor).index_select(0, rows.to(value.device))
    return value


def _step_count(step: torch.Tensor) -> float | torch.Tensor:
    """The count for the rule: a Python number, or the float64 tensor (compiling, per member)."""
    if _is_compiling() or step.dim():
        return step.to(dtype=torch.float64)
    return float(step)


def _advance(steps: list) -> None:
    """Add 1 to every step counter: one add when they are, in order, one tensor's elements."""
    if _is_compiling():
        torch._foreach_add_(steps, 1.0)
        return
    base = steps[0]._base
    if base is not None and base.dim() == 1 and base.numel() == len(steps):
        start = base.storage_offset()
        stride = base.stride(0)
        for index, step in enumerate(steps):
            if step._base is not base or step.storage_offset() != start + index * stride:
                break
        else:
            base.add_(1.0)
            return
    torch._foreach_add_(steps, 1.0)
