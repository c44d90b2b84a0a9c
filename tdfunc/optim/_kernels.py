"""The list operations the update rules are written in, in three implementations.

An update rule (:mod:`tdfunc.optim._rules`) is written once, against these
operations on flat lists of leaves. Which implementation runs decides how:

- :data:`INPLACE` (the stateful optimizers): ``torch._foreach_*_`` ops that
  update the optimizer state and the parameters in place, one kernel per leaf
  for all members, as ``torch.optim``'s foreach path does;
- :data:`FOREACH` (the functional API when nothing needs gradients or a
  transform): out-of-place ``torch._foreach_*`` ops, so inputs are never touched;
- :data:`TENSORWISE` (under autograd, ``torch.func`` transforms or
  ``torch.compile``): out-of-place ops one tensor at a time, which every
  transform supports (``vmap`` has no batching rule for ``_foreach_*`` ops, and
  in-place ops would break the graph that gradients flow through).

Naming: ``op`` returns a fresh list; ``op_`` mutates its first list (the
optimizer state) only in :data:`INPLACE`; ``op_tmp`` mutates its first list
wherever nothing records a graph (:data:`INPLACE` and :data:`FOREACH`): the rule
uses it on lists it owns (a fresh result, or the state in :data:`INPLACE`).
Scalars are Python floats or one tensor per leaf (already shaped
``[N, 1, ...]`` by :class:`~._hyper.PerLeaf`).

``K.direction`` is the kernel for a stage that is not the last of its optimizer
(:mod:`._compose`): it may update the state in place, never the parameters, so
``descend`` returns the direction. Only :data:`INPLACE` has a different one.
"""

from __future__ import annotations

import torch


def _scaled(xs: list, value) -> list:
    """``value * xs`` as a fresh list (``value`` a list of per-leaf tensors)."""
    return torch._foreach_mul(xs, value)


class _Foreach:
    """Out-of-place ``_foreach`` ops; temporaries are updated in place."""

    inplace = False

    @property
    def direction(self):
        return self

    def add(self, xs, ys, alpha):
        if isinstance(alpha, float):
            return torch._foreach_add(xs, ys, alpha=alpha)
        return torch._foreach_add(xs, _scaled(ys, alpha))

    add_ = add

    def mul_(self, xs, scale):
        return torch._foreach_mul(xs, scale)

    def lerp_(self, xs, ys, weight):
        return torch._foreach_lerp(xs, ys, weight)

    def addcmul_(self, xs, ys, zs, value):
        if isinstance(value, float):
            return torch._foreach_addcmul(xs, ys, zs, value=value)
        return torch._foreach_addcmul(xs, _scaled(ys, value), zs)

    addcmul = addcmul_

    def addcdiv_(self, xs, ys, zs):
        return torch._foreach_addcdiv(xs, ys, zs)

    def sqrt(self, xs):
        return torch._foreach_sqrt(xs)

    def neg(self, xs):
        return torch._foreach_neg(xs)

    def maximum_(self, xs, ys):
        return torch._foreach_maximum(xs, ys)

    def div(self, xs, scale):
        return torch._foreach_div(xs, scale)

    def shift(self, xs, value):
        return torch._foreach_add(xs, value)

    # the first list is the rule's own (a fresh result, or the state in INPLACE)
    def div_tmp(self, xs, scale):
        torch._foreach_div_(xs, scale)
        return xs

    def shift_tmp(self, xs, value):
        torch._foreach_add_(xs, value)
        return xs

    def add_tmp(self, xs, ys, alpha):
        if isinstance(alpha, float):
            torch._foreach_add_(xs, ys, alpha=alpha)
        else:
            torch._foreach_add_(xs, _scaled(ys, alpha))
        return xs

    def addcmul_tmp(self, xs, ys, zs, value):
        if isinstance(value, float):
            torch._foreach_addcmul_(xs, ys, zs, value=value)
        else:
            torch._foreach_addcmul_(xs, _scaled(ys, value), zs)
        return xs

    def addcdiv_tmp(self, xs, ys, zs):
        torch._foreach_addcdiv_(xs, ys, zs)
        return xs

    def descend(self, params, num, denom, value, decay):
        """The update ``value * num / denom`` (minus ``decay * params``)."""
        updates = torch._foreach_mul(num, value)
        torch._foreach_div_(updates, denom)
        if decay is not None:
            decay_terms = torch._foreach_mul(params, decay)
            torch._foreach_sub_(updates, decay_terms)
        return updates

    def descend_add(self, params, direction, value, decay=None):
        """The update ``value * direction``."""
        return torch._foreach_mul(direction, value)


class _InPlace(_Foreach):
    """In-place ``_foreach_*_`` ops on the optimizer's own state and parameters."""

    inplace = True

    @property
    def direction(self):
        return _IN_PLACE_STATE

    add_ = _Foreach.add_tmp

    def mul_(self, xs, scale):
        torch._foreach_mul_(xs, scale)
        return xs

    def lerp_(self, xs, ys, weight):
        torch._foreach_lerp_(xs, ys, weight)
        return xs

    addcmul_ = _Foreach.addcmul_tmp
    addcdiv_ = _Foreach.addcdiv_tmp

    def maximum_(self, xs, ys):
        torch._foreach_maximum_(xs, ys)
        return xs

    def descend(self, params, num, denom, value, decay):
        """``params = params * (1 - decay) + value * num / denom``, in place."""
        if decay is not None:
            torch._foreach_mul_(params, _one_minus(decay))
        if isinstance(value, float):
            torch._foreach_addcdiv_(params, num, denom, value=value)
        else:
            # addcdiv computes self + value * t1 / t2: the same rounding as the scalar path
            torch._foreach_addcdiv_(params, _scaled(num, value), denom)
        return None

    def descend_add(self, params, direction, value, decay=None):
        if isinstance(value, float):
            torch._foreach_add_(params, direction, alpha=value)
        else:
            torch._foreach_add_(params, _scaled(direction, value))
        return None


def _one_minus(decay):
    if isinstance(decay, float):
        return 1.0 - decay
    return [1.0 - value for value in decay]


def _pairs(value, count: int) -> list:
    return [value] * count if isinstance(value, float) else value


class _Tensorwise:
    """Out-of-place ops one tensor at a time: differentiable, vmappable, compilable."""

    inplace = False

    @property
    def direction(self):
        return self

    def add(self, xs, ys, alpha):
        if isinstance(alpha, float):
            return [torch.add(x, y, alpha=alpha) for x, y in zip(xs, ys)]
        return [x + a * y for x, y, a in zip(xs, ys, alpha)]

    add_ = add

    def mul_(self, xs, scale):
        return [x * s for x, s in zip(xs, _pairs(scale, len(xs)))]

    def lerp_(self, xs, ys, weight):
        return [torch.lerp(x, y, w) for x, y, w in zip(xs, ys, _pairs(weight, len(xs)))]

    def addcmul_(self, xs, ys, zs, value):
        if isinstance(value, float):
            return [torch.addcmul(x, y, z, value=value) for x, y, z in zip(xs, ys, zs)]
        return [torch.addcmul(x, v * y, z) for x, y, z, v in zip(xs, ys, zs, value)]

    addcmul = addcmul_

    def addcdiv_(self, xs, ys, zs):
        return [torch.addcdiv(x, y, z) for x, y, z in zip(xs, ys, zs)]

    def sqrt(self, xs):
        return [torch.sqrt(x) for x in xs]

    def neg(self, xs):
        return [torch.neg(x) for x in xs]

    def maximum_(self, xs, ys):
        return [torch.maximum(x, y) for x, y in zip(xs, ys)]

    def div(self, xs, scale):
        return [x / s for x, s in zip(xs, _pairs(scale, len(xs)))]

    def div_tmp(self, xs, scale):
        return [x / s for x, s in zip(xs, _pairs(scale, len(xs)))]

    def shift(self, xs, value):
        return [x + v for x, v in zip(xs, _pairs(value, len(xs)))]

    shift_tmp = shift
    add_tmp = add
    addcmul_tmp = addcmul_
    addcdiv_tmp = addcdiv_

    def descend(self, params, num, denom, value, decay):
        updates = [(v * n) / d for n, d, v in zip(num, denom, _pairs(value, len(num)))]
        if decay is not None:
            updates = [u - c * p for u, p, c in zip(updates, params, _pairs(decay, len(params)))]
        return updates

    def descend_add(self, params, direction, value, decay=None):
        return [d * v for d, v in zip(direction, _pairs(value, len(direction)))]


class _InPlaceState(_InPlace):
    """In-place on the state; the parameters are left to the last stage."""

    @property
    def direction(self):
        return self

    descend = _Foreach.descend
    descend_add = _Foreach.descend_add


FOREACH = _Foreach()
INPLACE = _InPlace()
TENSORWISE = _Tensorwise()
_IN_PLACE_STATE = _InPlaceState()
