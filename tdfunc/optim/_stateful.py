"""``torch.optim.Optimizer`` subclasses for stacked parameters, per-member hyperparameters.

Thin shells over the update rules of :mod:`tdfunc.optim._rules`, run with the
in-place foreach backend: one kernel per leaf updates all members. A
hyperparameter may be a float or a tensor of shape ``[N]`` (one value per
member; ``N`` the leading dim of every parameter of the group); every way it
enters is checked by :func:`~._groups.check_group`.

``step(members=...)`` steps only the given members, as a loop that steps only
their optimizers would: the other members' parameters and state (moments,
step counts) stay as they are, whatever their gradients hold.
"""

from __future__ import annotations

import contextlib
import functools
from itertools import chain
from typing import Any

import torch
from torch.optim import optimizer as _torch_optimizer

from .._ensemble.members import optimizer_groups
from . import _complex, _kernels, _rules
from . import _hyper as H
from ._groups import PerMember as PerMember
from ._groups import check_group, member_rows, plain

_profiling = torch._C._autograd._profiler_enabled
_is_compiling = torch.compiler.is_compiling


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


class _Stacked(torch.optim.Optimizer):
    """The shared machinery: groups checked at every door, steps of all or some members."""

    # group keys that may hold per-member tensors -> their range kind (a tuple for betas)
    _hypers: dict[str, Any] = {}
    # group keys that must be Python numbers
    _numbers: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict) -> None:
        # an Ensemble declares which of its parameters carry the member dim
        groups = optimizer_groups(params)
        self._checked: list = []
        super().__init__(params if groups is None else groups, defaults)

    @property
    def param_groups(self) -> list:  # type: ignore[override]
        """The groups; a plain per-member tensor written into one is checked and kept here.

        ``torch.optim.lr_scheduler`` reads the groups through this attribute and
        writes a tensor hyperparameter with ``fill_``, which only a kept
        :class:`PerMember` accepts per member: a value written between steps is
        checked and kept before anyone reads it.
        """
        attributes = self.__dict__
        if "param_groups" in attributes:  # restored by torch.optim's __setstate__
            attributes["_groups"] = attributes.pop("param_groups")
        groups = attributes["_groups"]
        if not _is_compiling():
            for group in groups:
                for name in self._hypers:
                    value = group.get(name)
                    if isinstance(value, torch.Tensor) and not isinstance(value, PerMember):
                        # a bad value is refused by the next step; the groups stay readable
                        with contextlib.suppress(TypeError, ValueError):
                            check_group(type(self).__name__, group, self._hypers, self._numbers)
                        break
        return groups

    @param_groups.setter
    def param_groups(self, groups: list) -> None:
        self.__dict__["_groups"] = groups

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

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("member_dim", True)
        check_group(type(self).__name__, group, self._hypers, self._numbers)
        # resolved now, eagerly: a compiled step then finds them ready
        self._checked = []
        self._resolved()

    def _resolved(self) -> list[dict]:
        """Each group's hyperparameters for the rules, checked again where one was replaced.

        ``group["lr"] = value`` between steps is a door too (the group is the plain
        dict that ``torch.optim`` and ``torch.compile`` expect, so it cannot check
        writes itself). A group is checked again when any of its values is new
        (identity), a few comparisons per step. Per-member tensors are handed to the
        rules as plain tensors sharing the kept :class:`PerMember`'s memory (a
        scheduler's ``fill_`` reaches them): ``torch.compile`` traces plain tensors.
        """
        # torch.optim's __getstate__ leaves it out of copies and pickles: made again here
        checked = self.__dict__.setdefault("_checked", [])
        groups = self.param_groups
        if len(checked) != len(groups):
            checked[:] = [None] * len(groups)
        out = []
        for index, group in enumerate(groups):
            seen = checked[index]
            if seen is None or seen[0] is not group or not _same_values(seen[1], group):
                check_group(f"{type(self).__name__}.step", group, self._hypers, self._numbers)
                seen = checked[index] = (group, dict(group), _plain_views(group))
            out.append(seen[2])
        return out

    def state_dict(self) -> dict[str, Any]:
        packed = super().state_dict()
        for group in packed["param_groups"]:
            for name in self._hypers:
                group[name] = plain(group[name])
        return packed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        api = f"{type(self).__name__}.load_state_dict"
        saved_groups = state_dict.get("param_groups", ())
        for saved, group in zip(saved_groups, self.param_groups):
            self._check_loaded_group(saved)
            # checked against the parameters it will drive, before anything is loaded
            trial = {**saved, "params": group["params"]}
            trial.setdefault("member_dim", group.get("member_dim", True))
            check_group(api, trial, self._hypers, self._numbers)
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.setdefault("member_dim", True)
            check_group(api, group, self._hypers, self._numbers)
        self._checked = []
        self._resolved()

    # options of torch.optim's optimizers that change the update and that this class does
    # not implement: a state dict saved with one set would be followed without it
    _unsupported_options: tuple[str, ...] = ("maximize",)

    def _check_loaded_group(self, group: dict) -> None:
        api = f"{type(self).__name__}.load_state_dict"
        for name in self._unsupported_options:
            if group.get(name):
                raise ValueError(
                    f"{api}: the state dict was saved with {name}={group[name]!r}, which "
                    f"{type(self).__name__} does not implement; load it into the torch.optim "
                    f"optimizer that saved it, or save it with {name}=False."
                )

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
        for group, hypers in zip(self.param_groups, self._resolved()):
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

    def _prepare(self, group: dict) -> None:
        """Called with each group before its step."""

    def _fresh(self, group: dict, param: torch.Tensor) -> dict:
        raise NotImplementedError

    def _update(self, group: dict, params: list, grads: list, states: list) -> None:
        raise NotImplementedError

    def _on_new_states(self, states: list) -> None:
        """Called with the states :meth:`_entries` has just created."""


def _same_values(seen: dict, group: dict) -> bool:
    """``group`` holds what ``seen`` recorded: the same tensors, equal numbers and flags.

    Keys added since are not read by the rules (``torch.compile`` adds
    ``capturable`` to the groups of an optimizer whose step it traces).
    """
    if _is_compiling():  # traced once per guard set: the plain comparison, which dynamo follows
        for key, value in seen.items():
            if key not in group or not _same(value, group[key]):
                return False
        return True
    for key, value in seen.items():
        current = group.get(key, _MISSING)
        # identity first: the common case, and all a step costs when nothing changed
        if current is not value and (current is _MISSING or not _same(value, current)):
            return False
    return True


_MISSING = object()


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, PerMember) and isinstance(right, PerMember):
        serial = getattr(left, "serial", None)
        return serial is not None and serial == getattr(right, "serial", None)
    if isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor):
        return left is right
    if isinstance(left, (tuple, list)) and isinstance(right, (tuple, list)):
        return len(left) == len(right) and all(map(_same, left, right))
    # numbers by value and type (True == 1 == 1.0); equal numbers give equal steps
    return type(left) is type(right) and left == right


def _plain_views(group: dict) -> dict:
    """The group without its params, per-member tensors as plain tensors on their memory."""
    out = {}
    for key, value in group.items():
        if key == "params":
            continue
        if isinstance(value, tuple):
            value = tuple(_plain_view(v) for v in value)
        out[key] = _plain_view(value)
    return out


def _plain_view(value: Any) -> Any:
    if isinstance(value, PerMember):
        return value.as_subclass(torch.Tensor)
    return value


def _rows_of(value: Any, rows: torch.Tensor) -> Any:
    """The selected members' values: rows of an ``[N, ...]`` tensor, anything else as is."""
    if isinstance(value, tuple):
        return tuple(_rows_of(v, rows) for v in value)
    if isinstance(value, torch.Tensor) and value.dim():
        return value.as_subclass(torch.Tensor).index_select(0, rows.to(value.device))
    return value


def _fresh_adam(group: dict, param: torch.Tensor) -> dict:
    return {
        "step": None,  # set by Adam._on_new_states
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }


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


class Adam(_Stacked):
    """Adam for stacked parameters; ``lr``, ``betas`` and ``weight_decay`` may be per member.

    With float hyperparameters every member follows ``torch.optim.Adam``
    exactly; a tensor ``lr`` of shape ``[N]`` gives member ``i`` the learning
    rate ``lr[i]`` (as do ``betas`` and ``weight_decay``). One in-place foreach
    kernel per leaf updates all members.

    Args:
        params: the stacked parameters (e.g. ``ensemble.parameters()``) or param groups.
        lr: as in ``torch.optim.Adam``; a float or an ``[N]`` tensor.
        betas: as in ``torch.optim.Adam``; floats or ``[N]`` tensors.
        eps: as in ``torch.optim.Adam``.
        weight_decay: as in ``torch.optim.Adam``; a float or an ``[N]`` tensor.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tdfunc import Ensemble
        >>> ensemble = Ensemble(nn.Linear(2, 1), num_members=3)
        >>> opt = Adam(ensemble.parameters(), lr=torch.tensor([1e-3, 1e-2, 1e-1]))
        >>> ensemble(torch.randn(5, 2)).sum().backward()
        >>> opt.step()
        >>> opt.zero_grad()
    """

    _hypers = {"lr": "lr", "betas": ("beta1", "beta2"), "weight_decay": "weight_decay"}
    _numbers = ("eps",)
    _fresh = staticmethod(_fresh_adam)
    _decoupled = False
    _unsupported_options = ("maximize", "amsgrad")

    def _check_loaded_group(self, group: dict) -> None:
        super()._check_loaded_group(group)
        decoupled = group.get("decoupled_weight_decay")
        if decoupled is not None and bool(decoupled) != self._decoupled:
            saved, other = ("AdamW", "Adam") if decoupled else ("Adam", "AdamW")
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state dict was saved with "
                f"decoupled_weight_decay={decoupled!r} ({saved}'s weight decay); load it "
                f"into tdfunc.optim.{saved}, not {other}."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.setdefault("decoupled_weight_decay", self._decoupled)
        for state in self.state.values():
            step = state.get("step")
            if step is not None and not isinstance(step, torch.Tensor):
                # older torch.optim state dicts hold the count as a Python number
                state["step"] = torch.tensor(float(step), dtype=torch.float32)

    def _on_new_states(self, states: list) -> None:
        # the step counters of parameters started together are the elements of one
        # tensor (each its own 0-dim float32 tensor, as in torch.optim): one add per step
        counts = torch.zeros(len(states))
        for index, state in enumerate(states):
            state["step"] = counts[index]

    def __init__(
        self,
        params,
        lr: Any = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: Any = 0.0,
    ) -> None:
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            # saved with the state dict, so that a load into the other class is refused
            # (torch.optim.Adam saves it too)
            "decoupled_weight_decay": self._decoupled,
        }
        super().__init__(params, defaults)

    def _update(self, group: dict, params: list, grads: list, states: list) -> None:
        beta1, beta2 = group["betas"]
        steps = [state["step"] for state in states]
        _advance(steps)
        exp_avgs = [state["exp_avg"] for state in states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in states]
        if _complex.any_complex(params):
            params, grads, exp_avgs, exp_avg_sqs = map(
                _complex.as_real, (params, grads, exp_avgs, exp_avg_sqs)
            )
        _rules.adam(
            _kernels.INPLACE,
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            _step_count(steps[0]),
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled=self._decoupled,
        )


class AdamW(Adam):
    """AdamW (decoupled weight decay) for stacked parameters; see :class:`Adam`.

    Example:
        >>> import torch
        >>> p = torch.nn.Parameter(torch.ones(2, 3))
        >>> opt = AdamW([p], lr=0.1, weight_decay=torch.tensor([0.0, 1.0]))
        >>> p.grad = torch.zeros(2, 3)
        >>> opt.step()
        >>> p[:, 0]
        tensor([1.0000, 0.9000], grad_fn=<SelectBackward0>)
    """

    _decoupled = True

    def __init__(
        self,
        params,
        lr: Any = 1e-3,
        betas: tuple = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: Any = 1e-2,
    ) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


class SGD(_Stacked):
    """SGD (optional Nesterov momentum, dampening, weight decay) for stacked parameters.

    ``lr``, ``momentum`` and ``weight_decay`` may be per-member ``[N]`` tensors;
    with floats every member follows ``torch.optim.SGD`` exactly.

    Example:
        >>> import torch
        >>> p = torch.nn.Parameter(torch.zeros(2, 3))
        >>> opt = SGD([p], lr=torch.tensor([0.1, 1.0]), momentum=0.9)
        >>> p.grad = torch.ones(2, 3)
        >>> opt.step()
        >>> p[:, 0]
        tensor([-0.1000, -1.0000], grad_fn=<SelectBackward0>)
    """

    _hypers = {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"}
    _numbers = ("dampening",)

    def __init__(
        self,
        params,
        lr: Any = 1e-3,
        momentum: Any = 0.0,
        dampening: float = 0.0,
        weight_decay: Any = 0.0,
        nesterov: bool = False,
    ) -> None:
        api = type(self).__name__
        if isinstance(dampening, torch.Tensor):
            raise TypeError(f"{api}: dampening must be a float, got a tensor.")
        momentum = H.check(api, "momentum", momentum)
        dampening = H.check(api, "dampening", dampening)
        if nesterov and (H.is_zero(momentum) or dampening != 0):
            raise ValueError(f"{api}: nesterov=True needs momentum > 0 and dampening == 0.")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": bool(nesterov),
        }
        super().__init__(params, defaults)

    def _fresh(self, group: dict, param: torch.Tensor) -> dict:
        if H.is_zero(group["momentum"]):
            return {"_started": True}
        # zero, marked unstarted: the rule's first step makes it the gradient
        return {"momentum_buffer": torch.zeros_like(param), "_started": False}

    def _prepare(self, group: dict) -> None:
        if not H.is_zero(group["momentum"]):
            self._start_buffers(group)

    def _check_rows(self, api: str, group: dict) -> None:
        if group["dampening"] != 0 and not H.is_zero(group["momentum"]):
            # the first step's gradient is not damped, and whether a step is a member's
            # first is kept per parameter, not per member
            raise ValueError(
                f"{api}: members= with dampening={group['dampening']} is not supported; "
                f"step all members, or use dampening=0."
            )

    def _update(self, group: dict, params: list, grads: list, states: list) -> None:
        with_momentum = not H.is_zero(group["momentum"])
        unstarted = not states[0].get("_started", True)
        buffers = [state["momentum_buffer"] for state in states] if with_momentum else None
        if _complex.any_complex(params):
            params, grads, buffers = map(_complex.as_real, (params, grads, buffers))
        _rules.sgd(
            _kernels.INPLACE,
            params,
            grads,
            buffers,
            1 if unstarted else 2,
            lr=group["lr"],
            momentum=group["momentum"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            weight_decay=group["weight_decay"],
        )
        for state in states:
            state["_started"] = True

    def _start_buffers(self, group: dict) -> None:
        """Give a momentum buffer to states made without one (momentum was 0 until now).

        As in ``torch.optim.SGD``, the buffer starts from this step's gradient.
        """
        for param in group["params"]:
            state = self.state.get(param)
            if state and param.grad is not None and state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(param)
                state["_started"] = False


class RMSprop(_Stacked):
    """RMSprop for stacked parameters; ``lr``, ``alpha``, ``weight_decay``, ``momentum`` per member.

    With float hyperparameters every member follows ``torch.optim.RMSprop``
    exactly (the rule of :func:`tdfunc.optim.rmsprop`).

    Example:
        >>> import torch
        >>> p = torch.nn.Parameter(torch.zeros(2, 3))
        >>> opt = RMSprop([p], lr=torch.tensor([0.01, 0.1]))
        >>> p.grad = torch.ones(2, 3)
        >>> opt.step()
        >>> p[:, 0]
        tensor([-0.1000, -1.0000], grad_fn=<SelectBackward0>)
    """

    _hypers = {"lr": "lr", "alpha": "alpha", "weight_decay": "weight_decay", "momentum": "momentum"}
    _numbers = ("eps",)

    def __init__(
        self,
        params,
        lr: Any = 1e-2,
        alpha: Any = 0.99,
        eps: float = 1e-8,
        weight_decay: Any = 0.0,
        momentum: Any = 0.0,
        centered: bool = False,
    ) -> None:
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": bool(centered),
        }
        super().__init__(params, defaults)

    def _fresh(self, group: dict, param: torch.Tensor) -> dict:
        state = {"step": torch.zeros(()), "square_avg": torch.zeros_like(param)}
        if not H.is_zero(group["momentum"]):
            state["momentum_buffer"] = torch.zeros_like(param)
        if group["centered"]:
            state["grad_avg"] = torch.zeros_like(param)
        return state

    def _update(self, group: dict, params: list, grads: list, states: list) -> None:
        _advance([state["step"] for state in states])
        with_momentum = not H.is_zero(group["momentum"])
        if with_momentum:
            for state, param in zip(states, params):
                # momentum switched on after the first steps: its buffer starts at zero
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(param)
        square_avg = [state["square_avg"] for state in states]
        grad_avg = [state["grad_avg"] for state in states] if group["centered"] else None
        buffers = [state["momentum_buffer"] for state in states] if with_momentum else None
        if _complex.any_complex(params):
            params, grads, square_avg, grad_avg, buffers = map(
                _complex.as_real, (params, grads, square_avg, grad_avg, buffers)
            )
        _rules.rmsprop(
            _kernels.INPLACE,
            params,
            grads,
            square_avg,
            grad_avg,
            buffers,
            lr=group["lr"],
            alpha=group["alpha"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
        )
