"""``torch.optim.Optimizer`` subclasses for stacked parameters, per-member hyperparameters.

Thin shells over the stage lists of the named optimizers (:mod:`tdfunc.optim._named`),
run with the in-place foreach kernel: one kernel per leaf updates all members. A
hyperparameter may be a float or a tensor of shape ``[N]`` (one value per
member; ``N`` the leading dim of every parameter of the group); every way it
enters is checked by :func:`~._groups.check_group` (:mod:`._param_groups`).

``step(members=...)`` steps only the given members, as a loop that steps only
their optimizers would: the other members' parameters and state (moments,
step counts) stay as they are, whatever their gradients hold (:mod:`._step`).
"""

from __future__ import annotations

from itertools import repeat
from operator import is_
from typing import Any

import torch

from .._ensemble.members import optimizer_groups
from . import _complex, _compose, _kernels, _named, _options
from . import _hyper as H
from ._groups import PerMember as PerMember
from ._param_groups import ParamGroups
from ._state_dict import StateDict
from ._step import Steps, _advance, _step_count


class _Stacked(Steps, ParamGroups, StateDict, torch.optim.Optimizer):
    """The shared machinery: groups checked at every door, steps of all or some members."""

    def __init__(self, params, defaults: dict) -> None:
        # an Ensemble declares which of its parameters carry the member dim
        groups = optimizer_groups(params)
        self._checked: list = []
        super().__init__(params if groups is None else groups, defaults)

    # (switch, state entry it needs, what the entry keeps): a state made while the switch
    # was off has no such entry, and torch.optim cannot continue it once it is on
    _needs: tuple = ()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("state", {})
        for saved in state_dict.get("param_groups", ()):
            for flag, entry, kept in self._needs:
                if not saved.get(flag):
                    continue
                for index in saved.get("params", ()):
                    state = states.get(index)
                    if state and entry not in state:
                        raise _state_missing(
                            f"{type(self).__name__}.load_state_dict",
                            (flag, entry, kept),
                            f"parameter {index} of the state dict",
                        )
        super().load_state_dict(state_dict)

    def _check_states(self, resolved: list) -> None:
        # Every group before any steps: a refused step leaves every state as it was.
        # A state without an entry that a switch needs is made only by a step while
        # the switch is off, or comes with a load (a new self.state): a group's states
        # are walked when a switch was off at its last check, or the states were
        # replaced, and the states found lacking are kept (checked again while they
        # have no gradient, as torch.optim skips those).
        if not self._needs:
            return
        states = self.state
        checked = self.__dict__.setdefault("_states_checked", {})
        for group, plan in resolved:
            key = id(group)
            needed = tuple(need for need in self._needs if plan[need[0]])
            if not needed:
                checked.pop(key, None)
                continue
            seen = checked.get(key)
            # the states themselves, by identity (one C-level pass): a state put in by
            # hand (opt.state.update(...)) is seen before any group steps
            found = tuple(map(dict.get, repeat(states), group["params"]))
            if (
                seen is None
                or seen[0] is not group
                or seen[1] is not states
                or seen[2] != needed
                or len(found) != len(seen[4])
                or not all(map(is_, found, seen[4]))
            ):
                lacking = tuple(
                    (param, need)
                    for param, state in zip(group["params"], found)
                    if state
                    for need in needed
                    if need[1] not in state
                )
                seen = checked[key] = (group, states, needed, lacking, found)
            for param, need in seen[3]:
                state = states.get(param)
                if state and param.grad is not None and need[1] not in state:
                    where = f"a parameter of shape {list(param.shape)}"
                    raise _state_missing(f"{type(self).__name__}.step", need, where)

    def _moment(self, plan: dict, states: list, params: list, need: tuple) -> list:
        """The entry ``need`` names, of every state (a clear error where one lacks it)."""
        try:
            return [state[need[1]] for state in states]
        except KeyError:  # a state written into self.state by hand
            where = f"a parameter of shape {list(params[0].shape)}"
            raise _state_missing(f"{type(self).__name__}.step", need, where) from None

    def _run(self, segments: tuple, hypers: dict, params, grads, moments: list, step) -> None:
        """The segments on the in-place kernel; complex leaves as real pairs (as torch.optim)."""
        if _complex.any_complex(params):
            params, grads = _complex.as_real(params), _complex.as_real(grads)
            moments = [_complex.as_real(moment) for moment in moments]
        _compose.run(segments, _kernels.INPLACE, params, grads, moments, step, hypers)


def _decays(views: dict) -> bool:
    """Whether weight decay changes anything (a tensor may be learned: never skipped)."""
    return not H.is_zero(views["weight_decay"])


def _fresh_adam(group: dict, param: torch.Tensor) -> dict:
    state = {
        "step": None,  # set by Adam._on_new_states
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }
    if group["amsgrad"]:
        state["max_exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    return state


def _state_missing(api: str, need: tuple, where: str) -> ValueError:
    flag, entry, kept = need
    return ValueError(
        f"{api}: {flag}=True, but the state of {where} has no {entry!r} (it was made "
        f"while {flag} was off). The {kept} of the earlier steps is unknown, and "
        f"torch.optim cannot continue such a state either: keep {flag} as the state was "
        f"made, or start a new optimizer with {flag}=True."
    )


_AMSGRAD = ("amsgrad", "max_exp_avg_sq", "running maximum of the second moment")
_CENTERED = ("centered", "grad_avg", "running average of the gradients")


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
        amsgrad: as in ``torch.optim.Adam``: divide by the running maximum of the
            second moment (kept as ``max_exp_avg_sq``).
        maximize: as in ``torch.optim.Adam``: ascend the gradient.
        foreach: accepted, as ``torch.optim``'s implementation switch: the step
            always runs foreach kernels with the single-tensor arithmetic.
        capturable: refused when True (compile the step instead).
        differentiable: refused when True (use the functional optimizer).
        fused: refused when True (leave it unset).

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
    _flags = ("amsgrad", "maximize")
    _needs = (_AMSGRAD,)
    _fresh = staticmethod(_fresh_adam)
    _decoupled = False

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
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        api = type(self).__name__
        _options.check(
            api, api.lower(), foreach=foreach, capturable=capturable,
            differentiable=differentiable, fused=fused,
        )  # fmt: skip
        if decoupled_weight_decay is not self._decoupled:
            H.check_flag(api, "decoupled_weight_decay", decoupled_weight_decay)
            other = "AdamW" if decoupled_weight_decay else "Adam"
            raise ValueError(
                f"{api}: decoupled_weight_decay={decoupled_weight_decay} is "
                f"tdfunc.optim.{other}'s weight decay; use tdfunc.optim.{other}."
            )
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            # saved with the state dict, so that a load into the other class is refused
            # (torch.optim.Adam saves it too)
            "decoupled_weight_decay": self._decoupled,
        }
        super().__init__(params, defaults)

    def _plan(self, views: dict) -> dict:
        beta1, beta2 = views["betas"]
        amsgrad = views["amsgrad"]
        return {
            "lr": views["lr"], "beta1": beta1, "beta2": beta2, "eps": views["eps"],
            "weight_decay": views["weight_decay"], "eps_root": 0.0, "amsgrad": amsgrad,
            "segments": _named.ADAM_SEGMENTS[
                self._decoupled, amsgrad, views["maximize"], _decays(views)
            ],
        }  # fmt: skip

    def _update(self, plan: dict, params: list, grads: list, states: list) -> None:
        moments = [
            [state["exp_avg"] for state in states],
            [state["exp_avg_sq"] for state in states],
        ]
        if plan["amsgrad"]:
            moments.append(self._moment(plan, states, params, _AMSGRAD))
        steps = [state["step"] for state in states]
        _advance(steps)
        self._run(plan["segments"], plan, params, grads, moments, _step_count(steps[0]))


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
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
            maximize=maximize, foreach=foreach, capturable=capturable,
            differentiable=differentiable, fused=fused, decoupled_weight_decay=True,
        )  # fmt: skip


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
    _flags = ("maximize",)

    def __init__(
        self,
        params,
        lr: Any = 1e-3,
        momentum: Any = 0.0,
        dampening: float = 0.0,
        weight_decay: Any = 0.0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        _options.check(
            "SGD", "sgd", foreach=foreach, differentiable=differentiable, fused=fused
        )  # fmt: skip
        checked = H.check_momentum(type(self).__name__, momentum, dampening, nesterov)
        momentum, dampening = checked["momentum"], checked["dampening"]
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": bool(nesterov),
            "maximize": maximize,
        }
        super().__init__(params, defaults)

    def _fresh(self, group: dict, param: torch.Tensor) -> dict:
        if H.is_zero(group["momentum"]):
            return {"_started": True}
        # zero, marked unstarted: the rule's first step makes it the gradient
        return {"momentum_buffer": torch.zeros_like(param), "_started": False}

    def _prepare(self, group: dict) -> None:
        # A state without a buffer is made only by a step while momentum is 0, or comes
        # with a load (a new self.state): the group's states are walked when momentum
        # was 0 at the last step, or the states were replaced; the ones found without
        # a buffer are kept until a step with their gradient starts it.
        checked = self.__dict__.setdefault("_buffers_checked", {})
        key = id(group)
        if H.is_zero(group["momentum"]):
            checked.pop(key, None)
            return
        states = self.state
        seen = checked.get(key)
        if seen is None or seen[0] is not group or seen[1] is not states:
            lacking = [
                param
                for param in group["params"]
                if states.get(param) and states[param].get("momentum_buffer") is None
            ]
            seen = checked[key] = (group, states, lacking)
        if seen[2]:
            seen[2][:] = self._start_buffers(seen[2])

    def _check_rows(self, api: str, group: dict) -> None:
        if group["dampening"] != 0 and not H.is_zero(group["momentum"]):
            # the first step's gradient is not damped, and whether a step is a member's
            # first is kept per parameter, not per member
            raise ValueError(
                f"{api}: members= with dampening={group['dampening']} is not supported; "
                f"step all members, or use dampening=0."
            )

    def _plan(self, views: dict) -> dict:
        with_momentum = not H.is_zero(views["momentum"])
        flags = (with_momentum, views["nesterov"], views["maximize"], _decays(views))
        return {**views, "with_momentum": with_momentum, "segments": _named.SGD_SEGMENTS[flags]}

    def _update(self, plan: dict, params: list, grads: list, states: list) -> None:
        with_momentum = plan["with_momentum"]
        unstarted = not states[0].get("_started", True)
        moments = []
        if with_momentum:
            buffers = [state.get("momentum_buffer") for state in states]
            if any(buffer is None for buffer in buffers):
                # a state edited by hand since the last check: started from this step's
                # gradient, as torch.optim does, in a step of its own
                self._start_buffers(params)
                started = [i for i, state in enumerate(states) if state.get("_started", True)]
                fresh = [i for i, state in enumerate(states) if not state.get("_started", True)]
                for part in (started, fresh):
                    if part:
                        pick = [params[i] for i in part], [grads[i] for i in part]
                        self._update(plan, *pick, [states[i] for i in part])
                return
            moments.append(buffers)
        self._run(plan["segments"], plan, params, grads, moments, 1 if unstarted else 2)
        for state in states:
            state["_started"] = True

    def _start_buffers(self, params: list) -> list:
        """Give a momentum buffer to the states of ``params`` made without one (momentum
        was 0 until now); returns those still without (no gradient in this step).

        As in ``torch.optim.SGD``, the buffer starts from this step's gradient.
        """
        waiting = []
        for param in params:
            state = self.state.get(param)
            if state and state.get("momentum_buffer") is None:
                if param.grad is None:
                    waiting.append(param)
                    continue
                state["momentum_buffer"] = torch.zeros_like(param)
                state["_started"] = False
        return waiting


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
    _flags = ("maximize",)
    _needs = (_CENTERED,)

    def __init__(
        self,
        params,
        lr: Any = 1e-2,
        alpha: Any = 0.99,
        eps: float = 1e-8,
        weight_decay: Any = 0.0,
        momentum: Any = 0.0,
        centered: bool = False,
        capturable: bool = False,
        foreach: bool | None = None,
        maximize: bool = False,
        differentiable: bool = False,
    ) -> None:
        _options.check(
            "RMSprop", "rmsprop", foreach=foreach, capturable=capturable,
            differentiable=differentiable,
        )  # fmt: skip
        defaults = {
            "lr": lr,
            "alpha": alpha,
            "eps": eps,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "centered": bool(centered),
            "maximize": maximize,
        }
        super().__init__(params, defaults)

    def _fresh(self, group: dict, param: torch.Tensor) -> dict:
        state = {"step": torch.zeros(()), "square_avg": torch.zeros_like(param)}
        if not H.is_zero(group["momentum"]):
            state["momentum_buffer"] = torch.zeros_like(param)
        if group["centered"]:
            state["grad_avg"] = torch.zeros_like(param)
        return state

    def _plan(self, views: dict) -> dict:
        with_momentum = not H.is_zero(views["momentum"])
        flags = (views["centered"], with_momentum, views["maximize"], _decays(views))
        segments = _named.RMSPROP_SEGMENTS[flags]
        return {**views, "with_momentum": with_momentum, "segments": segments}

    def _update(self, plan: dict, params: list, grads: list, states: list) -> None:
        with_momentum = plan["with_momentum"]
        if with_momentum:
            for state, param in zip(states, params):
                # momentum switched on after the first steps: its buffer starts at zero
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(param)
        moments = [[state["square_avg"] for state in states]]
        if plan["centered"]:
            moments.append(self._moment(plan, states, params, _CENTERED))
        if with_momentum:
            moments.append([state["momentum_buffer"] for state in states])
        _advance([state["step"] for state in states])  # once nothing can be refused
        self._run(plan["segments"], plan, params, grads, moments, None)
