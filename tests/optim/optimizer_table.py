"""The one table of optimizers that the contract tests run over.

A row says how to build an optimizer four ways from the same keyword arguments
(``torch.optim``'s names: ``lr``, ``betas``, ``momentum``...): functional
(``tdfunc.optim.adam``), stateful (``tdfunc.optim.Adam``), as a chain of the small
transforms, and the ``torch.optim`` reference; which state entries it keeps; and
the hyperparameter values the random tests draw from. Adding an optimizer to
``tdfunc.optim`` is one rule and one row here: every contract test picks it up.
A row named ``family-option`` is its family's optimizer with ``torch.optim``
options (``amsgrad``, ``maximize``) bound in all four builders.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from tdfunc import optim


@dataclass(frozen=True)
class Row:
    functional: Callable
    stateful: type
    chain: Callable  # the same keyword arguments -> a chain of transforms
    torch: type
    moments: tuple[str, ...]  # state entries besides the step count (torch.optim's names)
    draw: Callable  # draw(hyper, draw) -> keyword arguments; hyper(values) draws a value
    contract: dict  # the keyword arguments the fixed-value contract tests use (besides lr)
    maximize: bool = False  # whether the builders ascend (torch.optim's maximize=True)
    # the fixed cases the scenario tests run (functional and stateful over ensembles of
    # models, both pytree paths, steps of some members): a list is one value per member,
    # made a tensor of the first N values by ``realize``
    cases: tuple = ()


def _first(maximize: bool) -> list:
    # torch.optim negates the gradient before anything else reads it
    return [optim.negate()] if maximize else []


def _adam_chain(decoupled: bool) -> Callable:
    def build(
        lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=None, amsgrad=False, maximize=False
    ):
        if weight_decay is None:
            weight_decay = 1e-2 if decoupled else 0.0
        adam = optim.scale_by_adam(*betas, eps, amsgrad=amsgrad)
        decay = optim.add_decayed_weights(weight_decay)
        scale = optim.scale_by_learning_rate(lr)
        steps = [adam, decay] if decoupled else [decay, adam]
        return optim.chain(*_first(maximize), *steps, scale)

    return build


def _sgd_chain(
    lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False
):
    steps = [*_first(maximize), optim.add_decayed_weights(weight_decay)]
    if isinstance(momentum, torch.Tensor) or momentum != 0:
        steps.append(optim.scale_by_momentum(momentum, dampening, nesterov))
    return optim.chain(*steps, optim.scale_by_learning_rate(lr))


def _rmsprop_chain(
    lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False
):
    return optim.chain(
        *_first(maximize),
        optim.add_decayed_weights(weight_decay),
        optim.scale_by_rms(alpha, eps, centered, momentum),
        optim.scale_by_learning_rate(lr),
    )


def _draw_adam(hyper, draw) -> dict:
    return {
        "lr": hyper([0.5, 0.1, 1e-3]),
        "weight_decay": hyper([0.0, 0.1, 0.3]),
        "betas": (hyper([0.9, 0.3, 0.0]), hyper([0.999, 0.7])),
        "eps": draw([1e-8, 1e-3]),
    }


def _draw_sgd(hyper, draw) -> dict:
    kwargs = {
        "lr": hyper([0.5, 0.1, 1e-3]),
        "weight_decay": hyper([0.0, 0.1, 0.3]),
        "momentum": hyper([0.0, 0.5, 0.9]),
        "dampening": draw([0.0, 0.3]),
    }
    plain = not isinstance(kwargs["momentum"], torch.Tensor)
    if plain and kwargs["momentum"] > 0 and kwargs["dampening"] == 0:
        kwargs["nesterov"] = draw([False, True])
    return kwargs


def _draw_rmsprop(hyper, draw) -> dict:
    return {
        "lr": hyper([0.5, 0.1, 1e-3]),
        "weight_decay": hyper([0.0, 0.1, 0.3]),
        "alpha": hyper([0.99, 0.3]),
        "momentum": hyper([0.0, 0.9]),
        "eps": draw([1e-8, 1e-3]),
        "centered": draw([False, True]),
    }


WD = 0.05
LRS = [1e-3, 1e-2, 3e-2, 1e-1]
MOMENTA = [0.1, 0.5, 0.9, 0.99]
BETAS = ([0.8, 0.85, 0.9, 0.95], [0.9, 0.99, 0.999, 0.5])
SGD_CASES = (
    {"lr": 0.05},
    {"lr": LRS},
    {"lr": LRS, "momentum": 0.9},
    {"lr": LRS, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    {"lr": 0.05, "momentum": MOMENTA, "dampening": 0.3},
    {"lr": 0.05, "momentum": [0.0, 0.5, 0.9, 0.99], "dampening": 0.3},  # member 0: no momentum
    {"lr": LRS, "momentum": MOMENTA, "dampening": 0.3},
)
ADAM_CASES = (
    {"lr": 0.01},
    {"lr": LRS, "weight_decay": 0.1},
    {"lr": 0.01, "betas": BETAS, "weight_decay": [0.0, 0.1, 0.2, 0.3]},
    {"lr": LRS, "betas": BETAS, "weight_decay": [0.0, 0.1, 0.2, 0.3]},
    {"lr": LRS, "betas": (0.9, [0.9, 0.99, 0.999, 0.5])},
)
ADAMW_CASES = (
    {"lr": 0.01},
    {"lr": 0.1, "weight_decay": 0.1},
    {"lr": LRS, "weight_decay": [0.0, 0.01, 0.1, 1.0]},
    {"lr": LRS, "weight_decay": [0.0, 0.01, 0.1, 1.0], "eps": 1e-6},
    {"lr": 0.05, "betas": ([0.8, 0.9, 0.95, 0.9], 0.99)},
)
RMSPROP_CASES = (
    {"lr": LRS, "alpha": 0.9, "weight_decay": 0.01},
    {"lr": 0.01, "momentum": [0.1, 0.5, 0.9, 0.0], "centered": True},
    {"lr": 0.01, "momentum": 0.5, "centered": True},
)


def realize(kwargs: dict, members: int) -> dict:
    """``kwargs`` with every list (one value per member) a tensor of its first ``members``."""

    def value(v):
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return torch.tensor(v[:members]) if isinstance(v, list) else v

    return {k: value(v) for k, v in kwargs.items()}


def member_kwargs(kwargs: dict, index: int) -> dict:
    """Member ``index``'s own keyword arguments for its torch.optim optimizer (floats)."""

    def value(v):
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return float(v[index]) if isinstance(v, (list, torch.Tensor)) else v

    return {k: value(v) for k, v in kwargs.items()}


def cases(members: int = 4, where=None) -> list:
    """``(row name, realized kwargs)`` for every case of every row (``where(name, kwargs)``
    picks some), with ids."""
    out = []
    for name, row in OPTIMIZERS.items():
        for index, kwargs in enumerate(row.cases):
            if where is None or where(name, kwargs):
                out.append(pytest.param(name, realize(kwargs, members), id=f"{name}-{index}"))
    return out


ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
AMSGRAD_MOMENTS = (*ADAM_MOMENTS, "max_exp_avg_sq")


def _with(row: Row, moments: tuple | None = None, **options) -> Row:
    """``row`` with ``torch.optim`` options bound in every builder (the same for all four)."""
    bound = {
        name: functools.partial(getattr(row, name), **options)
        for name in ("functional", "stateful", "chain", "torch")
    }
    fields = {**row.__dict__, **bound, "moments": moments or row.moments}
    return Row(**{**fields, "maximize": options.get("maximize", row.maximize)})


OPTIMIZERS: dict[str, Row] = {
    "sgd": Row(
        optim.sgd, optim.SGD, _sgd_chain, torch.optim.SGD, ("momentum_buffer",), _draw_sgd,
        {"momentum": 0.9, "nesterov": True, "weight_decay": WD}, cases=SGD_CASES,
    ),
    "adam": Row(
        optim.adam, optim.Adam, _adam_chain(False), torch.optim.Adam, ADAM_MOMENTS, _draw_adam,
        {"weight_decay": WD}, cases=ADAM_CASES,
    ),
    "adamw": Row(
        optim.adamw, optim.AdamW, _adam_chain(True), torch.optim.AdamW, ADAM_MOMENTS, _draw_adam,
        {"weight_decay": WD}, cases=ADAMW_CASES,
    ),
    "rmsprop": Row(
        optim.rmsprop, optim.RMSprop, _rmsprop_chain, torch.optim.RMSprop,
        ("square_avg", "momentum_buffer", "grad_avg"), _draw_rmsprop,
        {"alpha": 0.9, "centered": True, "weight_decay": WD, "momentum": 0.5},
        cases=RMSPROP_CASES,
    ),
}  # fmt: skip
OPTIMIZERS.update({
    "adam-amsgrad": _with(OPTIMIZERS["adam"], AMSGRAD_MOMENTS, amsgrad=True, maximize=True),
    "adamw-amsgrad": _with(OPTIMIZERS["adamw"], AMSGRAD_MOMENTS, amsgrad=True),
    "sgd-maximize": _with(OPTIMIZERS["sgd"], maximize=True),
    "rmsprop-maximize": _with(OPTIMIZERS["rmsprop"], maximize=True),
})  # fmt: skip


def family(name: str) -> str:
    """The optimizer a row's name starts with (``"adam-amsgrad"`` -> ``"adam"``)."""
    return name.split("-")[0]
