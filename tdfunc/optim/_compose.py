"""How transformations compose: stages, the one folding rule, and one runner.

A stage is one small transformation's rule (:mod:`tdfunc.optim._chain`): it reads
its hyperparameters by name, keeps its moments, and maps incoming updates to
outgoing ones. A named optimizer is a list of stages; :func:`chain` puts the
stages of several transformations one after the other.

The folding rule, written once here: a *scaling* stage (``scale_by_adam``,
``scale_by_rms``, ``scale_by_momentum``) directly followed by
``scale_by_learning_rate`` runs as one stage whose kernel applies the step size
where ``torch.optim`` applies it (Adam folds ``lr`` into the bias correction
before the division; a scaling applied after it would round once more). A scaling
stage that folds decoupled weight decay (``scale_by_adam``) also takes an
``add_decayed_weights`` placed between the two, which is AdamW. Any other
sequence runs stage by stage, each one's updates the next one's input.

Stages run on one of the kernels of :mod:`tdfunc.optim._kernels`. With the
in-place kernel (the stateful optimizers), only the last stage may write the
parameters: the ones before it produce a direction (``K.direction``).
"""

from __future__ import annotations

from collections.abc import Callable

# the rules descend by ``-lr``; ``lr = -1`` leaves the direction itself
UNIT = -1.0

SCALE, DECAY, LEARNING_RATE = "scale", "decay", "learning_rate"


class Stage:
    """One transformation's rule and what it declares to the folding rule.

    ``rule(K, params, updates, moments, step, h, lr, decay)`` returns the new
    updates and the new moments (a tuple, one list of leaves per name in
    ``moments``). ``lr`` is :data:`UNIT` unless a learning rate was folded into
    the stage; ``decay`` is ``None`` unless decoupled weight decay was.
    """

    __slots__ = ("folds_decay", "moments", "name", "role", "rule")

    def __init__(
        self,
        name: str,
        moments: tuple[str, ...],
        rule: Callable,
        role: str | None = None,
        folds_decay: bool = False,
    ) -> None:
        self.name = name
        self.moments = moments
        self.rule = rule
        self.role = role
        self.folds_decay = folds_decay


class Segment:
    """Stages that run as one: a scaling stage with its folded decay and learning rate."""

    __slots__ = ("decay", "learning_rate", "stage")

    def __init__(self, stage: Stage, decay: Stage | None = None, learning_rate=None) -> None:
        self.stage = stage
        self.decay = decay
        self.learning_rate = learning_rate

    def stages(self) -> tuple[Stage, ...]:
        return tuple(s for s in (self.stage, self.decay, self.learning_rate) if s is not None)


def fold(stages: tuple) -> tuple[int, ...]:
    """How many stages each segment takes, by the folding rule (see the module docstring)."""
    sizes = []
    index, count = 0, len(stages)
    while index < count:
        size = 1
        if stages[index].role == SCALE:
            after = stages[index + 1 : index + 3]
            if after and after[0].role == LEARNING_RATE:
                size = 2
            elif (
                stages[index].folds_decay
                and len(after) == 2
                and after[0].role == DECAY
                and after[1].role == LEARNING_RATE
            ):
                size = 3
        sizes.append(size)
        index += size
    return tuple(sizes)


def plan(stages: tuple) -> tuple[Segment, ...]:
    """The stages grouped into segments by :func:`fold`."""
    segments = []
    index = 0
    for size in fold(stages):
        group = stages[index : index + size]
        index += size
        if size == 1:
            segments.append(Segment(group[0]))
        else:
            segments.append(Segment(group[0], group[1] if size == 3 else None, group[-1]))
    return tuple(segments)


def run(segments: tuple, K, params: list, updates: list, moments: list, step, h: dict) -> tuple:
    """Run ``segments`` in order; returns the last updates and every stage's new moments.

    ``moments`` holds one list of leaves per moment, in stage order; ``h`` holds
    every stage's hyperparameters by name (already resolved per leaf).
    """
    new_moments: list = []
    offset = 0
    last = len(segments) - 1
    for index, segment in enumerate(segments):
        stage = segment.stage
        own = moments[offset : offset + len(stage.moments)]
        offset += len(stage.moments)
        kernel = K if index == last else K.direction
        lr = UNIT if segment.learning_rate is None else h["lr"]
        decay = None if segment.decay is None else h["weight_decay"]
        updates, new = stage.rule(kernel, params, updates, own, step, h, lr, decay)
        new_moments.extend(new)
    return updates, new_moments
