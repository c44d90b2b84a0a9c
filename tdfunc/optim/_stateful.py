"""``torch.optim.Optimizer`` subclasses for stacked parameters, per-member hyperparameters.

Thin shells over the update rules of :mod:`tdfunc.optim._rules`, run with the
in-place foreach backend: one kernel per leaf updates all members. A
hyperparameter may be a float or a tensor of shape ``[N]`` (one value per
member; ``N`` the leading dim of every parameter of the group).

Learning-rate schedulers scale ``group["lr"]``. For a per-member tensor, the
schedulers of ``torch.optim.lr_scheduler`` write the new values with
``group["lr"].fill_(new)``, which a plain tensor refuses for more than one
value; so the optimizer stores tensor hyperparameters as :class:`PerMember`,
a tensor whose ``fill_`` also takes a same-shaped tensor (and copies it).
"""

from __future__ import annotations

import functools
from itertools import chain
from typing import Any

import torch
from torch.optim import optimizer as _torch_optimizer

from . import _complex, _kernels, _rules
from . import _hyper as H


class PerMember(torch.Tensor):
    """A plain tensor whose ``fill_`` also accepts a tensor of the same shape.

    Operations on it return plain tensors; ``state_dict()`` stores plain tensors.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    def fill_(self, value):  # type: ignore[override]
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            with torch.no_grad():
                return self.copy_(value)
        return super().fill_(value)


def _per_member(value: torch.Tensor) -> PerMember:
    return torch.Tensor._make_subclass(PerMember, value.detach().clone())


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
    """The shared machinery: hyperparameter checks and ``PerMember`` storage."""

    _tensor_names: tuple[str, ...] = ()

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
            if _profiling():
                label = f"Optimizer.step#{type(self).__name__}.step"
                with torch.autograd.profiler.record_function(label):
                    return _hooked(func, self, args, kwargs)
            return _hooked(func, self, args, kwargs)

        return step

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        api = type(self).__name__
        for name in self._tensor_names:
            value = group[name]
            if isinstance(value, (tuple, list)):
                group[name] = tuple(
                    self._stored(api, f"{name}[{i}]", v, group) for i, v in enumerate(value)
                )
            else:
                group[name] = self._stored(api, name, value, group)

    @staticmethod
    def _stored(api: str, name: str, value: Any, group: dict) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value.dim() > 1:
            raise ValueError(
                f"{api}: a tensor {name} must have shape [N] (one value per member) or [], "
                f"got shape {list(value.shape)}."
            )
        for param in group["params"]:
            if value.dim() == 1 and (param.dim() == 0 or param.shape[0] != value.shape[0]):
                raise ValueError(
                    f"{api}: {name} has {value.shape[0]} values, but a parameter of the group "
                    f"has shape {list(param.shape)}: a per-member {name} needs one value per "
                    f"member along dim 0 of every parameter."
                )
        # each group its own copy: a scheduler writes into it in place
        return _per_member(value)

    def state_dict(self) -> dict[str, Any]:
        packed = super().state_dict()
        for group in packed["param_groups"]:
            for name in self._tensor_names:
                group[name] = _plain(group[name])
        return packed

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for group in state_dict.get("param_groups", ()):
            self._check_loaded_group(group)
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for name in self._tensor_names:
                value = group[name]
                if isinstance(value, tuple):
                    group[name] = tuple(_rewrap(v) for v in value)
                else:
                    group[name] = _rewrap(value)

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

    def _gather(self, group: dict, fresh) -> dict:
        """``{step count: (params, grads, states)}`` for the parameters with gradients."""
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
                state.update(fresh(param))
                started.append(state)
            entries.append((param, grad, state))
        if started:
            self._on_new_states(started)
        buckets: dict = {}
        compiling = _is_compiling()
        for position, (param, grad, state) in enumerate(entries):
            step = state.get("step")
            if step is None:
                key: Any = not state.get("_started", True)
            elif compiling:
                # reading a count is a graph break: each parameter its own bucket, its
                # count a tensor in the graph (as torch.optim's compiled steps keep it)
                key = position
            else:
                key = float(step)
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = ([], [], [])
            bucket[0].append(param)
            bucket[1].append(grad)
            bucket[2].append(state)
        return buckets

    def _on_new_states(self, states: list) -> None:
        """Called with the states :meth:`_gather` has just created."""


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return value.as_subclass(torch.Tensor).detach().clone()
    return value


def _rewrap(value: Any) -> Any:
    return _per_member(value) if isinstance(value, torch.Tensor) else value


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) else value


def _fresh_adam(param: torch.Tensor) -> dict:
    return {
        "step": None,  # set by Adam._on_new_states
        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
    }


def _step_count(step: torch.Tensor) -> float | torch.Tensor:
    """The count for the rule: a Python number, or (compiling) the float64 tensor."""
    if _is_compiling():
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

    _tensor_names = ("lr", "betas", "weight_decay")
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
        api = type(self).__name__
        H.check_number(api, "lr", lr)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"{api}: betas must be a pair (beta1, beta2), got {betas!r}.")
        for index, beta in enumerate(betas):
            H.check_number(api, f"betas[{index}]", beta, 0.0, 1.0, high_open=True)
        H.check_number(api, "eps", eps)
        H.check_number(api, "weight_decay", weight_decay)
        defaults = {
            "lr": _number(lr),
            "betas": tuple(_number(b) for b in betas),
            "eps": float(eps),
            "weight_decay": _number(weight_decay),
            # saved with the state dict, so that a load into the other class is refused
            # (torch.optim.Adam saves it too)
            "decoupled_weight_decay": self._decoupled,
        }
        super().__init__(params, defaults)

    @_without_grad
    def step(self, closure=None):  # type: ignore[override]
        """One Adam step for every parameter with a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for params, grads, states in self._gather(group, _fresh_adam).values():
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
        return loss


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

    _tensor_names = ("lr", "momentum", "weight_decay")

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
        H.check_number(api, "lr", lr)
        H.check_number(api, "momentum", momentum)
        H.check_number(api, "weight_decay", weight_decay)
        if isinstance(dampening, torch.Tensor):
            raise TypeError(f"{api}: dampening must be a float, got a tensor.")
        H.check_number(api, "dampening", dampening)
        if nesterov and (H.is_zero(_number(momentum)) or dampening != 0):
            raise ValueError(f"{api}: nesterov=True needs momentum > 0 and dampening == 0.")
        defaults = {
            "lr": _number(lr),
            "momentum": _number(momentum),
            "dampening": float(dampening),
            "weight_decay": _number(weight_decay),
            "nesterov": bool(nesterov),
        }
        super().__init__(params, defaults)

    @_without_grad
    def step(self, closure=None):  # type: ignore[override]
        """One SGD step for every parameter with a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            with_momentum = not H.is_zero(group["momentum"])

            def fresh(param, with_momentum=with_momentum):
                if not with_momentum:
                    return {"_started": True}
                # zero, marked unstarted: the rule's first step makes it the gradient
                return {"momentum_buffer": torch.zeros_like(param), "_started": False}

            if with_momentum:
                self._start_buffers(group)
            for unstarted, (params, grads, states) in self._gather(group, fresh).items():
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
        return loss

    def _start_buffers(self, group: dict) -> None:
        """Give a momentum buffer to states made without one (momentum was 0 until now).

        As in ``torch.optim.SGD``, the buffer starts from this step's gradient.
        """
        for param in group["params"]:
            state = self.state.get(param)
            if state and param.grad is not None and state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(param)
                state["_started"] = False
