"""The update rules of the scaling stages, written once for every kernel (:mod:`._kernels`).

Each rule takes flat lists of leaves (parameters, incoming updates, state) and
the hyperparameters (:mod:`tdfunc.optim._hyper`), and returns the outgoing
updates (``None`` where the kernel updated the parameters in place) and the new
state lists. ``step`` is the step count *after* this update: a Python number (the
stateful optimizers) or a float64 tensor (the functional API, where it lives in
the state so that ``vmap`` and ``torch.compile`` see no Python value change).

``lr`` is the step size folded into the rule (:mod:`._compose`), or ``-1`` for the
direction itself. Weight decay added to the gradient is a stage of its own
(``add_decayed_weights``), placed before these rules, as ``torch.optim`` adds it
first. The formulas follow ``torch.optim``'s (the single-tensor implementations):
the same operations in the same order, so that scalar hyperparameters give the
same numbers.
"""

from __future__ import annotations

import torch

from . import _hyper as H


def adam(
    K, params, grads, exp_avg, exp_avg_sq, step, *, lr, beta1, beta2, eps, decay, eps_root,
    max_exp_avg_sq=None,
):  # fmt: skip
    """The Adam step ``-lr * m_hat / (sqrt(v_hat) + eps)``, minus ``lr * decay * params``.

    ``decay`` is AdamW's decoupled weight decay (``None``: none). With
    ``max_exp_avg_sq`` (AMSGrad), the running maximum of the second moment takes
    its place in the denominator, as in ``torch.optim.Adam(amsgrad=True)``.
    """
    # every hyperparameter first, then the kernels back to back: small operations
    # between big kernels run on caches the kernels have just evicted. Derived values
    # (1 - beta1, lr * weight_decay) are computed in float64, as torch.optim computes them
    # in Python floats: a float32 tensor hyperparameter would round them before a float64
    # leaf sees them.
    per_leaf = H.PerLeaf(grads)
    if decay is not None and not H.is_zero(decay):
        decay = per_leaf(H.mul(H.wide(lr), H.wide(decay)))
    else:
        decay = None
    average_weight = per_leaf(H.rsub(1.0, H.wide(beta1)))
    square_decay = per_leaf(beta2)
    square_weight = per_leaf(H.rsub(1.0, H.wide(beta2)))
    # -lr / (1 - beta1**t) as lr / (beta1**t - 1): the same bits (IEEE negation is
    # exact), one operation fewer on tensor hyperparameters
    neg_correction1, correction2 = H.corrections(beta1, beta2, step)
    neg_step_size = per_leaf(H.div(H.wide(lr), neg_correction1))
    # eps_root (optax's name) keeps sqrt differentiable where the second moment is 0; as in
    # optax it is added to the bias-corrected second moment: sqrt(v / (1 - beta2**t) + eps_root)
    root_eps = None if H.is_zero(eps_root) else per_leaf(eps_root)
    if root_eps is None:
        root_correction2 = per_leaf(H.sqrt(correction2))
    else:
        correction2 = per_leaf(correction2)
    eps = per_leaf(eps)

    exp_avg = K.lerp_(exp_avg, grads, average_weight)
    exp_avg_sq = K.addcmul_tmp(K.mul_(exp_avg_sq, square_decay), grads, grads, square_weight)
    second = exp_avg_sq
    if max_exp_avg_sq is not None:
        second = max_exp_avg_sq = K.maximum_(max_exp_avg_sq, exp_avg_sq)
    if root_eps is None:
        denom = K.shift_tmp(K.div_tmp(K.sqrt(second), root_correction2), eps)
    else:
        corrected = K.shift_tmp(K.div(second, correction2), root_eps)
        denom = K.shift_tmp(K.sqrt(corrected), eps)
    updates = K.descend(params, exp_avg, denom, neg_step_size, decay)
    return updates, exp_avg, exp_avg_sq, max_exp_avg_sq


def momentum(K, params, grads, momentum_buffer, step, *, lr, momentum, dampening, nesterov):
    """``torch.optim.SGD``'s (Nesterov) momentum with dampening, then the step ``-lr * buffer``.

    The momentum buffer starts at zero: ``0 * momentum + grad`` is exactly the
    ``grad.clone()`` that ``torch.optim.SGD`` starts from; with dampening the
    first step's gradient is not damped (a weight of 1 instead of ``1 - dampening``).
    """
    per_leaf = H.PerLeaf(grads)
    if H.is_zero(dampening):
        weight: H.Hyper = 1.0
    elif isinstance(step, torch.Tensor):
        # ``1 - dampening`` stays in float64 (``step`` is float64), the Python number
        # torch.optim uses: a float32 weight would be off by ~1e-8 on float64 leaves
        weight = torch.where(step == 1, 1.0, torch.full_like(step, 1.0 - dampening))
    else:
        weight = 1.0 if step == 1 else 1.0 - dampening
    if isinstance(momentum, torch.Tensor) and not H.is_zero(dampening):
        # a member without momentum takes plain gradient steps (no dampening), as in torch
        weight = H._binary(_undamped_without_momentum, weight, momentum)
    momentum_buffer = K.add_tmp(
        K.mul_(momentum_buffer, per_leaf(momentum)), grads, per_leaf(weight)
    )
    grads = K.add(grads, momentum_buffer, per_leaf(momentum)) if nesterov else momentum_buffer
    # negation is exact: -lr needs no float64 detour
    updates = K.descend_add(params, grads, per_leaf(H.neg(lr)))
    return updates, momentum_buffer


def _undamped_without_momentum(weight, momentum: torch.Tensor) -> torch.Tensor:
    """``weight``, or 1 where ``momentum`` is 0; in float64, as a Python number would be."""
    if not isinstance(weight, torch.Tensor):
        weight = torch.tensor(weight, dtype=torch.float64, device=momentum.device)
    return torch.where(momentum == 0, 1.0, weight.to(dtype=torch.float64))


def rms(K, params, grads, square_avg, grad_avg, momentum_buffer, *, lr, alpha, eps, momentum):
    """RMSprop's step ``-lr * g / (sqrt(E[g^2] - E[g]^2) + eps)``, or ``-lr`` times its momentum.

    ``grad_avg`` (``E[g]``) is ``None`` unless centered, ``momentum_buffer`` unless
    momentum: RMSprop's momentum accumulates ``g / avg`` in one ``addcdiv``, as
    ``torch.optim.RMSprop`` does (the direction made first, then a momentum transform
    over it, gives the same numbers with two more passes over memory).
    """
    per_leaf = H.PerLeaf(grads)
    square_weight = per_leaf(H.rsub(1.0, H.wide(alpha)))

    square_avg = K.addcmul_tmp(K.mul_(square_avg, per_leaf(alpha)), grads, grads, square_weight)
    if grad_avg is not None:
        grad_avg = K.lerp_(grad_avg, grads, square_weight)
        avg = K.sqrt(K.addcmul(square_avg, grad_avg, grad_avg, -1.0))
    else:
        avg = K.sqrt(square_avg)
    avg = K.shift_tmp(avg, per_leaf(eps))
    neg_lr = per_leaf(H.neg(lr))
    if momentum_buffer is not None:
        momentum_buffer = K.addcdiv_tmp(K.mul_(momentum_buffer, per_leaf(momentum)), grads, avg)
        updates = K.descend_add(params, momentum_buffer, neg_lr)
    else:
        updates = K.descend(params, grads, avg, neg_lr, None)
    return updates, square_avg, grad_avg, momentum_buffer
