"""The named optimizers, each a list of the stages of :mod:`tdfunc.optim._chain`.

``adam`` is ``add_decayed_weights``, ``scale_by_adam``, ``scale_by_learning_rate``;
``adamw`` moves the decay after the Adam direction (decoupled); ``sgd`` puts
``scale_by_momentum`` before the learning rate, and ``rmsprop`` keeps its momentum
inside ``scale_by_rms``. The folding rule (:mod:`tdfunc.optim._compose`) runs each
scaling with its learning rate as one kernel, in ``torch.optim``'s order of
operations. The
stateful optimizers (:mod:`tdfunc.optim._stateful`) run the same stage lists with
the in-place kernel.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from . import _compose
from . import _hyper as H
from ._chain import (
    DECAYED_WEIGHTS,
    LEARNING_RATE,
    NEGATE,
    adam_stage,
    momentum_fixed,
    momentum_stage,
    rms_stage,
)
from ._transform import GradientTransformation


def _adam_stages(decoupled: bool, amsgrad: bool, maximize: bool) -> tuple:
    adam = adam_stage(amsgrad)
    stages = (adam, DECAYED_WEIGHTS) if decoupled else (DECAYED_WEIGHTS, adam)
    return _maximized(maximize, stages + (LEARNING_RATE,))


def _sgd_stages(with_momentum: bool, nesterov: bool, maximize: bool) -> tuple:
    if not with_momentum:
        return _maximized(maximize, (DECAYED_WEIGHTS, LEARNING_RATE))
    return _maximized(maximize, (DECAYED_WEIGHTS, momentum_stage(nesterov), LEARNING_RATE))


def _rmsprop_stages(centered: bool, with_momentum: bool, maximize: bool) -> tuple:
    stages = (DECAYED_WEIGHTS, rms_stage(centered, with_momentum), LEARNING_RATE)
    return _maximized(maximize, stages)


def _maximized(maximize: bool, stages: tuple) -> tuple:
    # torch.optim negates the gradient before anything else reads it
    return (NEGATE, *stages) if maximize else stages


def _tables(make) -> tuple[dict, dict]:
    """The stages by every option that changes them, and the stateful steps' segments.

    The segments are keyed by the same options and whether weight decay is on: with
    ``weight_decay`` the number 0, ``add_decayed_weights`` adds nothing, and a step
    leaves it out (one stage call fewer; the same numbers).
    """
    stages = {flags: make(*flags) for flags in itertools.product(_FLAGS, repeat=3)}
    segments = {}
    for flags, own in stages.items():
        without = tuple(stage for stage in own if stage is not DECAYED_WEIGHTS)
        segments[(*flags, True)] = _compose.plan(own)
        segments[(*flags, False)] = _compose.plan(without)
    return stages, segments


_FLAGS = (False, True)
# made once: the stateful optimizers look theirs up when a group's values change (also
# while torch.compile traces the step)
ADAM, ADAM_SEGMENTS = _tables(_adam_stages)  # (decoupled, amsgrad, maximize)
SGD, SGD_SEGMENTS = _tables(_sgd_stages)  # (with momentum, nesterov, maximize)
RMSPROP, RMSPROP_SEGMENTS = _tables(_rmsprop_stages)  # (centered, with momentum, maximize)


def adam(
    lr: Any = 1e-3,
    betas: tuple = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: Any = 0.0,
    amsgrad: bool = False,
    *,
    maximize: bool = False,
    eps_root: float = 0.0,
) -> GradientTransformation:
    """Adam, as ``torch.optim.Adam`` computes it (L2 weight decay added to the gradient).

    Every hyperparameter may be a float, or a tensor whose shape is a prefix of
    every parameter's shape: ``lr=torch.tensor([...])`` with one value per
    member of parameters stacked along dim 0. ``lr`` may also be a pytree shaped
    like the parameters (per-parameter learning rates). ``eps_root`` is added
    to the bias-corrected second moment under the square root (as in optax): set
    it (e.g. ``1e-16``) when differentiating through steps where a gradient entry
    can be exactly zero, where ``sqrt`` has no derivative.

    ``amsgrad=True`` divides by the running maximum of the second moment (the
    state keeps ``max_exp_avg_sq``) and ``maximize=True`` ascends the gradient, as
    the same options of ``torch.optim.Adam``.

    The same as ``chain(add_decayed_weights(weight_decay), scale_by_adam(*betas, eps,
    amsgrad=amsgrad), scale_by_learning_rate(lr))`` (after ``negate()`` to maximize),
    with one state.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict
        >>> from tdfunc.optim import apply_updates
        >>> params = TensorDict({"w": torch.ones(3, 2)}, batch_size=[3])
        >>> opt = adam(lr=torch.tensor([0.1, 0.01, 0.0]))
        >>> state = opt.init(params)
        >>> updates, state = opt.update(params.apply(torch.ones_like), state, params)
        >>> apply_updates(params, updates)["w"][:, 0]
        tensor([0.9000, 0.9900, 1.0000])
    """
    return _adam(
        "adam", lr, betas, eps, weight_decay, eps_root, False, amsgrad, maximize
    )  # fmt: skip


def adamw(
    lr: Any = 1e-3,
    betas: tuple = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: Any = 1e-2,
    amsgrad: bool = False,
    *,
    maximize: bool = False,
    eps_root: float = 0.0,
) -> GradientTransformation:
    """AdamW: Adam with decoupled weight decay, as ``torch.optim.AdamW``.

    Hyperparameters and options as in :func:`adam`; the same as ``chain(scale_by_adam(
    *betas, eps, amsgrad=amsgrad), add_decayed_weights(weight_decay),
    scale_by_learning_rate(lr))`` (after ``negate()`` to maximize), with one state.

    Example:
        >>> import torch
        >>> from tdfunc import TensorDict
        >>> from tdfunc.optim import apply_updates
        >>> params = TensorDict({"w": torch.ones(2)})
        >>> opt = adamw(lr=0.1, weight_decay=0.5)
        >>> updates, _ = opt.update(params.apply(torch.zeros_like), opt.init(params), params)
        >>> apply_updates(params, updates)["w"]
        tensor([0.9500, 0.9500])
    """
    return _adam(
        "adamw", lr, betas, eps, weight_decay, eps_root, True, amsgrad, maximize
    )  # fmt: skip


def _adam(
    name, lr, betas, eps, weight_decay, eps_root, decoupled, amsgrad, maximize
) -> GradientTransformation:
    api = f"tdfunc.optim.{name}"
    flags = (
        decoupled,
        H.check_flag(api, "amsgrad", amsgrad),
        H.check_flag(api, "maximize", maximize),
    )
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"{api}: betas must be a pair (beta1, beta2), got {betas!r}.")
    hypers = {
        "lr": H.check_tree(api, "lr", lr, tree=True),
        "beta1": H.check_tree(api, "betas[0]", betas[0], "beta1"),
        "beta2": H.check_tree(api, "betas[1]", betas[1], "beta2"),
        "eps": H.check_tree(api, "eps", eps),
        "weight_decay": H.check_tree(api, "weight_decay", weight_decay),
        "eps_root": H.check_tree(api, "eps_root", eps_root),
    }
    return GradientTransformation(name, ADAM[flags], hypers)


def sgd(
    lr: Any = 1e-3,
    momentum: Any = 0.0,
    nesterov: bool = False,
    weight_decay: Any = 0.0,
    dampening: float = 0.0,
    *,
    maximize: bool = False,
) -> GradientTransformation:
    """SGD with optional (Nesterov) momentum and L2 weight decay, as ``torch.optim.SGD``.

    ``lr``, ``momentum`` and ``weight_decay`` may be per-member tensors (see
    :func:`adam`); ``lr`` may be a pytree shaped like the parameters (Meta-SGD).
    The same as ``chain(add_decayed_weights(weight_decay), scale_by_momentum(momentum,
    dampening, nesterov), scale_by_learning_rate(lr))`` (without the momentum when it
    is 0), with one state; ``maximize=True`` ascends (``negate()`` first in the chain).

    Example:
        >>> import torch
        >>> from tdfunc.optim import apply_updates
        >>> params = {"w": torch.ones(2)}
        >>> opt = sgd(lr={"w": torch.tensor([0.1, 0.5])})
        >>> updates, _ = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> apply_updates(params, updates)["w"]
        tensor([0.9000, 0.5000])
    """
    api = "tdfunc.optim.sgd"
    hypers = {
        "lr": H.check_tree(api, "lr", lr, tree=True),
        "momentum": None,
        "weight_decay": H.check_tree(api, "weight_decay", weight_decay),
        "dampening": None,
    }
    hypers.update(H.check_momentum(api, momentum, dampening, nesterov))
    with_momentum = not H.is_zero(hypers["momentum"])
    check = functools.partial(momentum_fixed, with_momentum)
    stages = SGD[with_momentum, bool(nesterov), H.check_flag(api, "maximize", maximize)]
    return GradientTransformation("sgd", stages, hypers, check)


def rmsprop(
    lr: Any = 1e-2,
    alpha: Any = 0.99,
    eps: float = 1e-8,
    weight_decay: Any = 0.0,
    momentum: Any = 0.0,
    centered: bool = False,
    *,
    maximize: bool = False,
) -> GradientTransformation:
    """RMSprop, as ``torch.optim.RMSprop``; hyperparameters as in :func:`adam`.

    The same as ``chain(add_decayed_weights(weight_decay), scale_by_rms(alpha, eps,
    centered, momentum), scale_by_learning_rate(lr))``, with one state;
    ``maximize=True`` ascends (``negate()`` first in the chain).

    Example:
        >>> import torch
        >>> params = {"w": torch.ones(2)}
        >>> opt = rmsprop(lr=0.01)
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> sorted(state)
        ['square_avg', 'step']
    """
    api = "tdfunc.optim.rmsprop"
    hypers = {
        "lr": H.check_tree(api, "lr", lr, tree=True),
        "alpha": H.check_tree(api, "alpha", alpha),
        "eps": H.check_tree(api, "eps", eps),
        "weight_decay": H.check_tree(api, "weight_decay", weight_decay),
        "momentum": H.check_tree(api, "momentum", momentum),
    }
    with_momentum = not H.is_zero(hypers["momentum"])
    check = functools.partial(momentum_fixed, with_momentum)
    stages = RMSPROP[bool(centered), with_momentum, H.check_flag(api, "maximize", maximize)]
    return GradientTransformation("rmsprop", stages, hypers, check)
