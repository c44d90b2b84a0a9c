"""``torch.optim``'s implementation switches, accepted where they change nothing here.

``torch.optim``'s constructors take switches that pick an implementation rather than
an update: ``foreach``, ``capturable``, ``differentiable``, ``fused``. The stateful
optimizers always run one in-place foreach kernel per stacked parameter for all
members, with ``torch.optim``'s single-tensor arithmetic, so ``foreach`` (any value)
and the defaults of the others are accepted; a value that asks for what this step
does not do is refused with the alternative, never silently ignored.
"""

from __future__ import annotations

from typing import Any


def check(
    api: str,
    functional: str,
    *,
    foreach: Any = None,
    capturable: Any = False,
    differentiable: Any = False,
    fused: Any = None,
) -> None:
    """Refuse the implementation switches this step cannot honour, naming the alternative.

    ``functional`` names the functional optimizer (``"adam"``) that the hints point to.
    """
    for name, value, allowed in (
        ("foreach", foreach, (None, False, True)),
        ("capturable", capturable, (False, True)),
        ("differentiable", differentiable, (False, True)),
        ("fused", fused, (None, False, True)),
    ):
        if not any(value is choice for choice in allowed):
            shown = " or ".join(map(repr, allowed))
            raise TypeError(f"{api}: {name} must be {shown}, got {type(value).__name__}.")
    if capturable:
        raise ValueError(
            f"{api}: capturable=True is not supported: the step reads its step counts as "
            f"Python numbers, which a CUDA graph capture cannot replay. Compile the step "
            f"instead (torch.compile(opt.step) keeps the counts as tensors in the graph), or "
            f"capture the functional tdfunc.optim.{functional}(...).update."
        )
    if differentiable:
        raise ValueError(
            f"{api}: differentiable=True is not supported: the step updates the parameters "
            f"in place, outside autograd. To differentiate through optimizer steps, use the "
            f"functional tdfunc.optim.{functional}(...), which is pure and differentiable."
        )
    if fused:
        raise ValueError(
            f"{api}: fused=True is not supported: the step runs one foreach kernel per "
            f"stacked parameter for all members at once; leave fused unset."
        )
