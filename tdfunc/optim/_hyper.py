"""Hyperparameters: Python numbers, per-member tensors, or per-leaf pytrees.

A hyperparameter is kept in one of three forms until the last moment:

- a Python ``float``: the update uses it as a scalar, exactly like ``torch.optim``;
- a tensor whose shape is a prefix of every leaf's shape (usually ``[N]``, one
  value per member of a stacked ensemble, or ``[]``): derived quantities
  (``1 - beta1``, ``lr / bias_correction``) are computed on this small tensor
  once per step, then viewed as ``[N, 1, ...]`` per leaf rank (:class:`PerLeaf`);
- :class:`Leaves`, one tensor per leaf (a pytree of learning rates shaped like the
  parameters, as in Meta-SGD): derived quantities are computed per leaf.

Scalar quantities derived from the step count (bias corrections) are computed in
``float64`` and rounded to the leaves' dtype once, as ``torch.optim`` computes
them in Python floats.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any, Union

import torch
import torch.utils._pytree as pytree

from .._core.helpers.tracing import compiling as _is_compiling
from .._ensemble.shared import is_marked_shared, is_shared


class Leaves:
    """One value per leaf (a learning-rate pytree flattened like the parameters)."""

    __slots__ = ("values",)

    def __init__(self, values: list) -> None:
        self.values = values


Hyper = Union[float, torch.Tensor, Leaves]  # noqa: UP007 (a runtime alias on 3.10)


def lead(tensor: torch.Tensor, rank: int) -> torch.Tensor:
    """View ``tensor`` with trailing size-1 dims up to ``rank`` (leading dims align)."""
    missing = rank - tensor.dim()
    if missing <= 0:
        return tensor
    # unpacked: concatenating torch.Size objects costs more than the reshape
    return tensor.reshape(*tensor.shape, *(1,) * missing)


def _binary(fn: Callable, left: Hyper, right: Hyper) -> Hyper:
    if type(left) is float and type(right) is float:  # the common case, first
        return fn(left, right)
    if isinstance(left, Leaves) or isinstance(right, Leaves):
        count = len(left.values) if isinstance(left, Leaves) else len(right.values)  # type: ignore[union-attr]
        lefts = left.values if isinstance(left, Leaves) else [left] * count
        rights = right.values if isinstance(right, Leaves) else [right] * count
        return Leaves([_binary(fn, a, b) for a, b in zip(lefts, rights)])
    if isinstance(left, torch.Tensor) and isinstance(right, torch.Tensor):
        rank = max(left.dim(), right.dim())
        return fn(lead(left, rank), lead(right, rank))
    return fn(left, right)


def _sub(a, b):
    # a number minus a tensor through torch.rsub: Tensor.__rsub__ is a Python-level wrapper
    if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor):
        return torch.rsub(b, a)
    return a - b


def _div(a, b):
    if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor):
        # Tensor.__rtruediv__ computes a number over a tensor as reciprocal(b) * a, which
        # rounds twice; divide, as torch.optim does with Python numbers
        return torch.div(torch.scalar_tensor(a, dtype=b.dtype, device=b.device), b)
    return a / b


def _pow(a, b):
    if isinstance(b, torch.Tensor) and not isinstance(a, torch.Tensor):
        return torch.pow(a, b)  # not Tensor.__rpow__, a Python-level wrapper
    return a**b


def mul(left: Hyper, right: Hyper) -> Hyper:
    return _binary(operator.mul, left, right)


def div(left: Hyper, right: Hyper) -> Hyper:
    return _binary(_div, left, right)


def rsub(value: float, hyper: Hyper) -> Hyper:
    """``value - hyper``."""
    return _binary(_sub, value, hyper)


def sub(hyper: Hyper, value: float) -> Hyper:
    """``hyper - value``."""
    return _binary(_sub, hyper, value)


def neg(hyper: Hyper) -> Hyper:
    return _binary(operator.mul, -1.0, hyper)


def wide(hyper: Hyper) -> Hyper:
    """``hyper`` in float64 for step-count arithmetic (Python floats already are)."""
    if isinstance(hyper, torch.Tensor):
        return hyper.to(dtype=torch.float64)  # the keyword parses faster
    if isinstance(hyper, Leaves):
        return Leaves([wide(value) for value in hyper.values])
    return hyper


def power(base: Hyper, step: float | torch.Tensor) -> Hyper:
    """``base ** step`` (``step`` a Python number or a float64 tensor)."""
    if isinstance(base, float) and not isinstance(step, torch.Tensor):
        return base**step
    return _binary(_pow, wide(base), step)


def corrections(beta1: Hyper, beta2: Hyper, step: float | torch.Tensor) -> tuple[Hyper, Hyper]:
    """Adam's bias corrections ``(beta1**t - 1, 1 - beta2**t)``, the first one negated.

    For float betas and a step tensor, both come from one ``pow`` and one
    ``addcmul`` on a ``[2, *step.shape]`` tensor, with the same roundings as two
    ``pow`` and two subtractions (``-1 + p`` is ``p - 1``; the factors are ``±1``).
    """
    if (
        type(beta1) is float
        and type(beta2) is float
        and isinstance(step, torch.Tensor)
        and not _is_compiling()
    ):
        bases, offsets, signs = _pair_constants(beta1, beta2, step.device, step.dim())
        both = torch.addcmul(offsets, signs, torch.pow(bases, step))
        return both[0], both[1]
    return sub(power(beta1, step), 1.0), rsub(1.0, power(beta2, step))


@functools.lru_cache(maxsize=32)
def _pair_constants(beta1: float, beta2: float, device: torch.device, rank: int) -> tuple:
    shape = (2,) + (1,) * rank
    options = {"dtype": torch.float64, "device": device}
    return (
        torch.tensor([beta1, beta2], **options).view(shape),
        torch.tensor([-1.0, 1.0], **options).view(shape),
        torch.tensor([1.0, -1.0], **options).view(shape),
    )


def sqrt(hyper: Hyper) -> Hyper:
    if isinstance(hyper, float):
        return hyper**0.5
    if isinstance(hyper, Leaves):
        return Leaves([sqrt(value) for value in hyper.values])
    return hyper.sqrt()


def is_zero(hyper: Hyper) -> bool:
    """True only for the Python number 0 (a tensor is never skipped: it may be learned)."""
    return not isinstance(hyper, (torch.Tensor, Leaves)) and hyper == 0


class PerLeaf:
    """Hyperparameters per leaf for one list of leaves (built once per step).

    Calling it on a hyperparameter gives a float for a float, and for a tensor
    one ``[N, 1, ...]`` view per leaf: the tensor is converted once per leaf
    dtype and viewed once per leaf rank, the views shared by the leaves of that
    rank. :class:`Leaves` values are converted to their leaf's dtype. The leaves'
    ranks and dtypes are read at the first tensor: float hyperparameters need none.
    """

    __slots__ = ("dtypes", "kinds", "leaves", "ranks")

    def __init__(self, leaves: list) -> None:
        self.leaves = leaves
        self.kinds = None

    def _read_kinds(self) -> None:
        self.kinds = kinds = [(leaf.dim(), leaf.dtype) for leaf in self.leaves]
        self.ranks = tuple(dict.fromkeys(kinds))  # distinct (rank, dtype), in order
        self.dtypes = tuple(dict.fromkeys(dtype for _, dtype in self.ranks))

    def __call__(self, hyper: Hyper) -> float | list:
        if type(hyper) is float:
            return hyper
        if isinstance(hyper, (int, float)):
            return float(hyper)
        if isinstance(hyper, Leaves):
            return [
                value.to(dtype=leaf.dtype) if isinstance(value, torch.Tensor) else value
                for value, leaf in zip(hyper.values, self.leaves)
            ]
        if self.kinds is None:
            self._read_kinds()
        converted = {dtype: hyper.to(dtype=dtype) for dtype in self.dtypes}
        views = {key: lead(converted[key[1]], key[0]) for key in self.ranks}
        return [views[key] for key in self.kinds]


# ------------------------------------------------------------------ validation
# the ranges torch.optim checks, by hyperparameter: (low, high, whether high is excluded)
RANGES: dict[str, tuple[float, float | None, bool]] = {
    "lr": (0.0, None, False),
    "eps": (0.0, None, False),
    "eps_root": (0.0, None, False),
    "weight_decay": (0.0, None, False),
    "momentum": (0.0, None, False),
    "dampening": (0.0, None, False),
    "beta1": (0.0, 1.0, True),
    "beta2": (0.0, 1.0, True),
    "alpha": (0.0, 1.0, False),
    "max_norm": (0.0, None, False),
}


def check(api: str, name: str, value: Any, kind: str | None = None) -> Any:
    """``value`` checked as the hyperparameter ``kind`` (default ``name``); ints become floats."""
    low, high, high_open = RANGES.get(kind or name, (-math.inf, None, False))
    check_number(api, name, value, low, high, high_open)
    return value if isinstance(value, torch.Tensor) else float(value)


def check_tree(api: str, name: str, value: Any, kind: str | None = None, tree: bool = False) -> Any:
    """:func:`check`, where ``tree`` also for a pytree of values (each leaf checked).

    The functional transformations check their hyperparameters here, and the
    stateful optimizers' groups by :func:`check` (``_groups.check_group``): one table
    of ranges (:data:`RANGES`), one check.
    """
    if tree and not isinstance(value, (int, float, torch.Tensor)):
        leaves, _ = pytree.tree_flatten(value)
        if len(leaves) == 1 and leaves[0] is value:  # not a container
            raise TypeError(
                f"{api}: {name} must be a float, a tensor, or a pytree of tensors shaped like "
                f"the parameters; got {type(value).__name__}."
            )
        if not leaves:
            raise ValueError(f"{api}: {name} is an empty pytree.")
        for leaf in leaves:
            check(api, f"every leaf of {name}", leaf, kind or name)
        return value
    return check(api, name, value, kind)


def check_flag(api: str, name: str, value: Any) -> bool:
    """A switch (``amsgrad``, ``maximize``) given as a bool, as ``torch.optim`` documents it."""
    if not isinstance(value, bool):
        raise TypeError(f"{api}: {name} must be True or False, got {type(value).__name__}.")
    return value


def check_momentum(
    api: str, momentum: Any, dampening: Any, nesterov: bool, needs_momentum: bool = True
) -> dict:
    """SGD's momentum options checked as ``torch.optim.SGD`` checks them.

    ``dampening`` must be a number (whether a step is a member's first is not kept
    per member); Nesterov needs ``dampening == 0`` and, where momentum may be
    switched off (``needs_momentum``), a momentum.
    """
    if isinstance(dampening, torch.Tensor):
        raise TypeError(f"{api}: dampening must be a float, got a tensor.")
    momentum = check(api, "momentum", momentum)
    dampening = check(api, "dampening", dampening)
    if nesterov and ((needs_momentum and is_zero(momentum)) or dampening != 0):
        wanted = "momentum > 0 and dampening == 0" if needs_momentum else "dampening == 0"
        raise ValueError(f"{api}: nesterov=True needs {wanted}.")
    return {"momentum": momentum, "dampening": dampening}


def check_number(
    api: str,
    name: str,
    value: Any,
    low: float = 0.0,
    high: float | None = None,
    high_open: bool = False,
) -> None:
    """``low <= value`` (and ``value < high`` or ``<= high``) for Python numbers.

    A tensor is checked for its dtype only: its values may be learned (a
    meta-learned step size can go negative), and reading them is a device sync
    on an accelerator and a graph break under ``torch.compile``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, torch.Tensor)):
        raise TypeError(f"{api}: {name} must be a float or a tensor, got {type(value).__name__}.")
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(
                f"{api}: a tensor {name} must have a floating dtype, got {value.dtype}; "
                f"e.g. torch.tensor([0.1, 0.01])."
            )
        return
    bad = math.isnan(value) or value < low
    if high is not None:
        bad = bad or (value >= high if high_open else value > high)
    if bad:
        upper = "" if high is None else f" and {'<' if high_open else '<='} {high}"
        raise ValueError(f"{api}: {name} must be >= {low}{upper}, got {value!r}.")


def check_not_shared(
    api: str, name: str, hyper: torch.Tensor, leaves: list, paths: Callable
) -> None:
    """A per-member value is refused for a tensor an Ensemble keeps shared.

    Such a tensor has no member dim, whatever its size. ``leaves`` are the parameters
    (what an Ensemble marks; the gradients where no parameters are given). Eagerly a
    shared tensor is known by its mark or its identity; under ``torch.compile`` by its
    mark only, which dynamo guards as an attribute of the tensor (fresh tensors compile
    once, a marked one is caught when traced), where an identity lookup would guard on
    every leaf's id and compile again per step. An Ensemble marks every tensor it
    declares shared; only a tensor class that refuses attributes is known by identity
    alone, and so only eagerly. Under ``vmap`` the leaves are batched wrappers, without
    the mark: nothing is known shared there.
    """
    shared = is_marked_shared if _is_compiling() else is_shared
    for index, leaf in enumerate(leaves):
        if shared(leaf):
            raise ValueError(
                f"{api}: {name} has shape {list(hyper.shape)} (one value per member), but "
                f"the leaf {paths(index)} is a tensor an Ensemble keeps shared: it has no "
                f"member dim, whatever its size. Give shared tensors a hyperparameter without "
                f"a member dim (a per-leaf tree of {name}, or a float)."
            )


def check_leading(api: str, name: str, hyper: Hyper, leaves: list, paths: Callable) -> None:
    """A tensor hyperparameter's shape must be a prefix of every leaf's shape."""
    if isinstance(hyper, torch.Tensor):
        prefix = hyper.shape
        width = len(prefix)
        for index, leaf in enumerate(leaves):
            if leaf.shape[:width] != prefix:
                raise ValueError(
                    f"{api}: {name} has shape {list(prefix)}, but the leaf {paths(index)} has "
                    f"shape {list(leaf.shape)}: a tensor hyperparameter holds one value per "
                    f"member and must match the leading dims of every parameter (here "
                    f"{list(leaf.shape[:width]) if leaf.dim() >= width else 'fewer dims'})."
                )
    elif isinstance(hyper, Leaves):
        if len(hyper.values) != len(leaves):
            raise ValueError(
                f"{api}: {name} is a pytree with {len(hyper.values)} leaves but the parameters "
                f"have {len(leaves)}; give it the parameters' structure."
            )
        for index, (value, leaf) in enumerate(zip(hyper.values, leaves)):
            if isinstance(value, torch.Tensor):
                try:
                    fits = torch.broadcast_shapes(value.shape, leaf.shape) == leaf.shape
                except RuntimeError:
                    fits = False
                if not fits:
                    raise ValueError(
                        f"{api}: the {name} leaf at {paths(index)} has shape {list(value.shape)}, "
                        f"which does not broadcast to the parameter's shape "
                        f"{list(leaf.shape)}."
                    )


def full_rank(hyper: Leaves, leaves: list) -> Leaves:
    """``hyper``'s values viewed with leading size-1 dims up to their leaf's rank.

    A per-leaf value broadcasts against its leaf from the right (``[4]`` against a
    ``[N, 4]`` leaf is one value per column), while per-member quantities (the bias
    corrections of a step count shaped like the batch) are aligned from the left by
    :func:`lead`. At the leaf's rank both line up: ``lead`` pads a ``[N]`` count to
    ``[N, 1]``, which broadcasts with ``[1, 4]`` as it should, not with ``[4]``.
    """
    values = []
    for value, leaf in zip(hyper.values, leaves):
        if isinstance(value, torch.Tensor) and value.dim() < leaf.dim():
            value = value.reshape(*(1,) * (leaf.dim() - value.dim()), *value.shape)
        values.append(value)
    return Leaves(values)
