"""Small gradient transformations that compose with :func:`chain`, as optax's do.

Each is a :class:`~tdfunc.optim.GradientTransformation` (``init``/``update``, pure,
differentiable, vmappable, per-member tensor hyperparameters along dim 0) whose
rule is the named optimizers' rule from :mod:`tdfunc.optim._rules` with a unit
step: ``scale_by_adam`` returns the Adam direction, and ``scale_by_learning_rate``
turns a direction into a descent step. Hyperparameters are checked by the same
ranges as the named optimizers (``_hyper.RANGES``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import _hyper as H
from . import _rules
from ._transform import GradientTransformation, _hyper

# the rules descend by ``-lr``; a unit step with ``lr = -1`` leaves the direction itself
_UNIT = -1.0


def scale_by_adam(
    b1: Any = 0.9, b2: Any = 0.999, eps: Any = 1e-8, *, eps_root: float = 0.0
) -> GradientTransformation:
    """The bias-corrected Adam direction ``m_hat / (sqrt(v_hat) + eps)``."""
    api = "tdfunc.optim.scale_by_adam"
    hypers = {
        "beta1": _hyper(api, "b1", b1, "beta1"),
        "beta2": _hyper(api, "b2", b2, "beta2"),
        "eps": _hyper(api, "eps", eps),
        "eps_root": _hyper(api, "eps_root", eps_root),
    }

    def rule(K, params, grads, moments, step, h):
        updates, exp_avg, exp_avg_sq = _rules.adam(
            K, params, grads, moments[0], moments[1], step, lr=_UNIT, beta1=h["beta1"],
            beta2=h["beta2"], eps=h["eps"], weight_decay=0.0, decoupled=False,
            eps_root=h["eps_root"],
        )  # fmt: skip
        return updates, (exp_avg, exp_avg_sq)

    return GradientTransformation("scale_by_adam", ("exp_avg", "exp_avg_sq"), hypers, rule)


def scale_by_rms(
    alpha: Any = 0.99, eps: Any = 1e-8, centered: bool = False
) -> GradientTransformation:
    """The RMSprop direction ``g / (sqrt(E[g^2] (- E[g]^2 if centered)) + eps)``."""
    api = "tdfunc.optim.scale_by_rms"
    hypers = {"alpha": _hyper(api, "alpha", alpha), "eps": _hyper(api, "eps", eps)}
    moments = ("square_avg",) + (("grad_avg",) if centered else ())

    def rule(K, params, grads, state, step, h):
        updates, square_avg, grad_avg, _ = _rules.rmsprop(
            K, params, grads, state[0], state[1] if centered else None, None, lr=_UNIT,
            alpha=h["alpha"], eps=h["eps"], weight_decay=0.0, momentum=0.0,
        )  # fmt: skip
        return updates, (square_avg,) + ((grad_avg,) if centered else ())

    return GradientTransformation("scale_by_rms", moments, hypers, rule)


def scale_by_momentum(
    momentum: Any = 0.9, dampening: float = 0.0, nesterov: bool = False
) -> GradientTransformation:
    """``torch.optim.SGD``'s momentum buffer (dampened, or Nesterov) as the direction."""
    api = "tdfunc.optim.scale_by_momentum"
    hypers = {
        "momentum": _hyper(api, "momentum", momentum),
        "dampening": _hyper(api, "dampening", dampening),
    }
    if isinstance(hypers["dampening"], torch.Tensor):
        raise TypeError(f"{api}: dampening must be a float, got a tensor.")
    if nesterov and not H.is_zero(hypers["dampening"]):
        raise ValueError(f"{api}: nesterov=True needs dampening == 0.")

    def rule(K, params, grads, moments, step, h):
        updates, buffer = _rules.sgd(
            K, params, grads, moments[0], step, lr=_UNIT, momentum=h["momentum"],
            dampening=h["dampening"], nesterov=nesterov, weight_decay=0.0,
        )  # fmt: skip
        return updates, (buffer,)

    return GradientTransformation("scale_by_momentum", ("momentum_buffer",), hypers, rule)


def add_decayed_weights(weight_decay: Any = 0.0) -> GradientTransformation:
    """``updates + weight_decay * params``: needs ``params`` in ``update``."""
    api = "tdfunc.optim.add_decayed_weights"
    hypers = {"weight_decay": _hyper(api, "weight_decay", weight_decay)}

    def rule(K, params, grads, moments, step, h):
        decay = h["weight_decay"]
        if H.is_zero(decay):
            return list(grads), ()
        return K.add(grads, params, H.PerLeaf(grads)(decay)), ()

    return GradientTransformation("add_decayed_weights", (), hypers, rule)


def scale_by_learning_rate(lr: Any = 1e-3) -> GradientTransformation:
    """``-lr * updates``: a direction made a descent step (``lr`` may be a pytree)."""
    api = "tdfunc.optim.scale_by_learning_rate"
    hypers = {"lr": _hyper(api, "lr", lr, tree=True)}

    def rule(K, params, grads, moments, step, h):
        return K.descend_add(params, grads, H.PerLeaf(grads)(H.neg(h["lr"]))), ()

    return GradientTransformation("scale_by_learning_rate", (), hypers, rule)


def clip_by_global_norm(max_norm: Any, *, per_member: bool = False) -> GradientTransformation:
    """Scale the updates so that their global norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_`` scales: by ``max_norm / (norm + 1e-6)``
    where that is below 1. ``per_member=True`` takes one norm per member of
    parameters stacked along dim 0 (each member clipped as its own model would be).
    """
    api = "tdfunc.optim.clip_by_global_norm"
    hypers = {"max_norm": _hyper(api, "max_norm", max_norm)}

    def rule(K, params, grads, moments, step, h):
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

    return GradientTransformation("clip_by_global_norm", (), hypers, rule)


class Chain:
    """Transformations applied in order; the state is the tuple of their states."""

    def __init__(self, transforms: tuple) -> None:
        for index, t in enumerate(transforms):
            if not (hasattr(t, "init") and hasattr(t, "update")):
                raise TypeError(
                    f"tdfunc.optim.chain: argument {index} is a {type(t).__name__}, not a "
                    f"transformation with init and update."
                )
        self.transforms = transforms

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
        new_states = []
        for t, s in zip(self.transforms, state):
            updates, s = t.update(updates, s, params, members=members)
            new_states.append(s)
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
