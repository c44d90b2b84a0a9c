"""Small gradient transformations that compose with :func:`chain`, as optax's do.

Each is a :class:`~tdfunc.optim.GradientTransformation` (``init``/``update``, pure,
differentiable, vmappable, per-member tensor hyperparameters along dim 0) made of
one stage (:mod:`tdfunc.optim._compose`) whose rule is in :mod:`tdfunc.optim._rules`:
``scale_by_adam`` returns the Adam direction, and ``scale_by_learning_rate`` turns
a direction into a descent step. The named optimizers (:mod:`tdfunc.optim._named`)
are lists of these stages. Hyperparameters are checked by the ranges of
``_hyper.RANGES``, as everywhere in ``tdfunc.optim``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import _compose, _rules
from . import _hyper as H
from ._transform import GradientTransformation, _brief


# ------------------------------------------------------------------ stages
def _adam_rule(K, params, updates, moments, step, h, lr, decay, *, amsgrad=False):
    updates, exp_avg, exp_avg_sq, max_exp_avg_sq = _rules.adam(
        K, params, updates, moments[0], moments[1], step, lr=lr, beta1=h["beta1"],
        beta2=h["beta2"], eps=h["eps"], decay=decay, eps_root=h["eps_root"],
        max_exp_avg_sq=moments[2] if amsgrad else None,
    )  # fmt: skip
    if amsgrad:
        return updates, (exp_avg, exp_avg_sq, max_exp_avg_sq)
    return updates, (exp_avg, exp_avg_sq)


def _rms_rule(K, params, updates, moments, step, h, lr, decay, *, centered, with_momentum):
    grad_avg = moments[1] if centered else None
    buffer = moments[-1] if with_momentum else None
    momentum = h["momentum"] if with_momentum else 0.0
    updates, square_avg, grad_avg, buffer = _rules.rms(
        K, params, updates, moments[0], grad_avg, buffer, lr=lr, alpha=h["alpha"], eps=h["eps"],
        momentum=momentum,
    )  # fmt: skip
    return updates, (square_avg,) + ((grad_avg,) if centered else ()) + (
        (buffer,) if with_momentum else ()
    )


def _momentum_rule(K, params, updates, moments, step, h, lr, decay, *, nesterov):
    updates, buffer = _rules.momentum(
        K, params, updates, moments[0], step, lr=lr, momentum=h["momentum"],
        dampening=h["dampening"], nesterov=nesterov,
    )  # fmt: skip
    return updates, (buffer,)


# rules are module functions (options bound by ``partial``): transformations pickle
def adam_stage(amsgrad: bool = False) -> _compose.Stage:
    """The Adam moments and direction; folds a learning rate and decoupled weight decay.

    ``amsgrad`` keeps ``torch.optim``'s ``max_exp_avg_sq`` as a third moment.
    """
    if amsgrad:
        moments = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        rule = functools.partial(_adam_rule, amsgrad=True)
    else:
        moments, rule = ("exp_avg", "exp_avg_sq"), _adam_rule
    return _compose.Stage("scale_by_adam", moments, rule, _compose.SCALE, folds_decay=True)


def rms_stage(centered: bool, with_momentum: bool = False) -> _compose.Stage:
    """RMSprop's moments (and momentum) and direction; folds a learning rate."""
    moments = ("square_avg",) + (("grad_avg",) if centered else ())
    moments += ("momentum_buffer",) if with_momentum else ()
    rule = functools.partial(_rms_rule, centered=bool(centered), with_momentum=bool(with_momentum))
    return _compose.Stage("scale_by_rms", moments, rule, _compose.SCALE)


def momentum_stage(nesterov: bool) -> _compose.Stage:
    """SGD's momentum buffer; folds a learning rate."""
    rule = functools.partial(_momentum_rule, nesterov=bool(nesterov))
    return _compose.Stage("scale_by_momentum", ("momentum_buffer",), rule, _compose.SCALE)


def _decay_rule(K, params, updates, moments, step, h, lr, decay):
    weight_decay = h["weight_decay"]
    if H.is_zero(weight_decay):
        return list(updates), ()
    return K.add(updates, params, H.PerLeaf(updates)(weight_decay)), ()


def _learning_rate_rule(K, params, updates, moments, step, h, lr, decay):
    return K.descend_add(params, updates, H.PerLeaf(updates)(H.neg(h["lr"]))), ()


def _negate_rule(K, params, updates, moments, step, h, lr, decay):
    return K.neg(updates), ()


DECAYED_WEIGHTS = _compose.Stage("add_decayed_weights", (), _decay_rule, _compose.DECAY)
LEARNING_RATE = _compose.Stage(
    "scale_by_learning_rate", (), _learning_rate_rule, _compose.LEARNING_RATE
)
# torch.optim's ``maximize=True``: the gradient negated first, before weight decay is added
NEGATE = _compose.Stage("negate", (), _negate_rule)


def momentum_fixed(with_momentum: bool, api: str, hypers: dict) -> None:
    """The state holds a momentum buffer only if momentum was on when the optimizer was made."""
    momentum = hypers["momentum"]
    if not with_momentum and not H.is_zero(momentum):
        raise ValueError(
            f"{api}: hyperparameters['momentum'] was set to {_brief(momentum)}, but the "
            f"optimizer was made with momentum=0 and its state has no momentum buffer; make "
            f"a new optimizer with the momentum (and a new state with its init)."
        )


# ------------------------------------------------------------------ transformations
def scale_by_adam(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-8,
    *,
    eps_root: float = 0.0,
    amsgrad: bool = False,
) -> GradientTransformation:
    """The bias-corrected Adam direction ``m_hat / (sqrt(v_hat) + eps)``.

    ``amsgrad=True`` divides by the running maximum of the second moment instead
    (``torch.optim.Adam(amsgrad=True)``; the state keeps it as ``max_exp_avg_sq``).
    """
    api = "tdfunc.optim.scale_by_adam"
    hypers = {
        "beta1": H.check_tree(api, "b1", b1, "beta1"),
        "beta2": H.check_tree(api, "b2", b2, "beta2"),
        "eps": H.check_tree(api, "eps", eps),
        "eps_root": H.check_tree(api, "eps_root", eps_root),
    }
    amsgrad = H.check_flag(api, "amsgrad", amsgrad)
    return GradientTransformation("scale_by_adam", (adam_stage(amsgrad),), hypers)


def negate() -> GradientTransformation:
    """``-updates``: gradient ascent, as ``torch.optim``'s ``maximize=True``.

    Put it first, where ``torch.optim`` negates the gradient (before weight decay):
    ``chain(negate(), add_decayed_weights(wd), scale_by_adam(), scale_by_learning_rate(lr))``
    is ``adam(lr, weight_decay=wd, maximize=True)``, bit for bit.
    """
    return GradientTransformation("negate", (NEGATE,), {})


def scale_by_rms(
    alpha: Any = 0.99, eps: Any = 1e-8, centered: bool = False, momentum: Any = 0.0
) -> GradientTransformation:
    """The RMSprop direction ``g / (sqrt(E[g^2] (- E[g]^2 if centered)) + eps)``.

    With ``momentum``, RMSprop's momentum buffer of that direction (as
    ``torch.optim.RMSprop`` keeps it) is the direction instead.
    """
    api = "tdfunc.optim.scale_by_rms"
    hypers = {
        "alpha": H.check_tree(api, "alpha", alpha),
        "eps": H.check_tree(api, "eps", eps),
        "momentum": H.check_tree(api, "momentum", momentum),
    }
    with_momentum = not H.is_zero(hypers["momentum"])
    check = functools.partial(momentum_fixed, with_momentum)
    return GradientTransformation(
        "scale_by_rms", (rms_stage(centered, with_momentum),), hypers, check
    )


def scale_by_momentum(
    momentum: Any = 0.9, dampening: float = 0.0, nesterov: bool = False
) -> GradientTransformation:
    """``torch.optim.SGD``'s momentum buffer (dampened, or Nesterov) as the direction."""
    api = "tdfunc.optim.scale_by_momentum"
    hypers = H.check_momentum(api, momentum, dampening, nesterov, needs_momentum=False)
    return GradientTransformation("scale_by_momentum", (momentum_stage(nesterov),), hypers)


def add_decayed_weights(weight_decay: Any = 0.0) -> GradientTransformation:
    """``updates + weight_decay * params``: needs ``params`` in ``update``."""
    api = "tdfunc.optim.add_decayed_weights"
    hypers = {"weight_decay": H.check_tree(api, "weight_decay", weight_decay)}
    return GradientTransformation("add_decayed_weights", (DECAYED_WEIGHTS,), hypers)


def scale_by_learning_rate(lr: Any = 1e-3) -> GradientTransformation:
    """``-lr * updates``: a direction made a descent step (``lr`` may be a pytree)."""
    api = "tdfunc.optim.scale_by_learning_rate"
    hypers = {"lr": H.check_tree(api, "lr", lr, tree=True)}
    return GradientTransformation("scale_by_learning_rate", (LEARNING_RATE,), hypers)


def clip_by_global_norm(max_norm: Any, *, per_member: bool = False) -> GradientTransformation:
    """Scale the updates so that their global norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_`` scales: by ``max_norm / (norm + 1e-6)``
    where that is below 1. ``per_member=True`` takes one norm per member of
    parameters stacked along dim 0 (each member clipped as its own model would be).
    """
    api = "tdfunc.optim.clip_by_global_norm"
    hypers = {"max_norm": H.check_tree(api, "max_norm", max_norm)}
    rule = functools.partial(_clip_rule, per_member=bool(per_member))
    stage = _compose.Stage("clip_by_global_norm", (), rule)
    return GradientTransformation("clip_by_global_norm", (stage,), hypers)


def _clip_rule(K, params, grads, moments, step, h, lr, decay, *, per_member):
    api = "tdfunc.optim.clip_by_global_norm"
    if not grads:
        return [], ()
    if per_member:
        # the members are the state's: the step count has one entry per member only for a
        # TensorDict of stacked parameters; a leaf's dim 0 alone could be anything
        if step.dim() != 1:
            raise ValueError(
                f"{api}(per_member=True).update: needs stacked parameters in a TensorDict "
                f"with batch size [N] (one step count per member); the step count has "
                f"shape {list(step.shape)}. Under vmap each call sees one member: use "
                f"per_member=False there."
            )
        squares = [g.abs().pow(2).reshape(step.shape[0], -1).sum(1) for g in grads]
    else:
        squares = [g.abs().pow(2).sum() for g in grads]
    norm = torch.stack(squares).sum(0).sqrt()
    limit = h["max_norm"]
    if isinstance(limit, torch.Tensor):
        limit = limit.to(norm.dtype)
    scale = torch.clamp(limit / (norm + 1e-6), max=1.0)
    return [g * H.lead(scale.to(g.dtype), g.dim()) for g in grads], ()


# ------------------------------------------------------------------ chain
_OPAQUE = _compose.Stage("", (), None)


def _stage_of(transform: Any) -> _compose.Stage:
    """The one stage of a one-stage transformation; anything else folds with nothing."""
    stages = (
        getattr(transform, "_stages", None) if type(transform) is GradientTransformation else None
    )
    return stages[0] if stages is not None and len(stages) == 1 else _OPAQUE


class Chain:
    """Transformations applied in order; the state is the tuple of their states.

    Neighbours that the folding rule of :mod:`tdfunc.optim._compose` joins (a
    scaling followed by the learning rate) run as one, so that a chain gives the
    numbers of the named optimizer it spells.
    """

    def __init__(self, transforms: tuple) -> None:
        for index, t in enumerate(transforms):
            if not (hasattr(t, "init") and hasattr(t, "update")):
                raise TypeError(
                    f"tdfunc.optim.chain: argument {index} is a {type(t).__name__}, not a "
                    f"transformation with init and update."
                )
        self.transforms = transforms

    @property
    def transforms(self) -> tuple:
        return self._transforms

    @transforms.setter
    def transforms(self, transforms: tuple) -> None:
        # which neighbours run as one is decided with the sequence, and only with it
        self._transforms = tuple(transforms)
        self._sizes = _compose.fold(tuple(map(_stage_of, self._transforms)))

    def __repr__(self) -> str:
        return f"tdfunc.optim.chain({', '.join(map(repr, self.transforms))})"

    def init(self, params: Any) -> tuple:
        return tuple(t.init(params) for t in self.transforms)

    def update(
        self, updates: Any, state: tuple, params: Any = None, *, members: Any = None
    ) -> tuple[Any, tuple]:
        if not isinstance(state, tuple) or len(state) != len(self.transforms):
            raise ValueError(
                f"tdfunc.optim.chain(...).update: the state must be a tuple of "
                f"{len(self.transforms)} states, one per transformation; got "
                f"{type(state).__name__}. Make it with opt.init(params) of this chain."
            )
        new_states: list = []
        index = 0
        for size in self._sizes:
            lead, followers = self.transforms[index], self.transforms[index + 1 : index + size]
            updates, lead_state = (
                lead._update(updates, state[index], params, members, followers)
                if followers
                else lead.update(updates, state[index], params, members=members)
            )
            new_states.append(lead_state)
            for offset, follower in enumerate(followers, start=index + 1):
                new_states.append(follower._advanced(state[offset], members))
            index += size
        return updates, tuple(new_states)


def chain(*transforms: Any) -> Chain:
    """Compose transformations: each one's updates are the next one's input.

    Example:
        >>> import torch
        >>> from tdfunc.optim import apply_updates
        >>> opt = chain(add_decayed_weights(0.1), scale_by_learning_rate(0.5))
        >>> params = {"w": torch.ones(2)}
        >>> updates, _ = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> apply_updates(params, updates)["w"]
        tensor([0.4500, 0.4500])
    """
    return Chain(tuple(transforms))
