"""The registry of batched layer implementations, and ``register_batched``.

A *batched implementation* runs one layer for all N members of an ensemble at
once: it receives the layer's stacked parameters and buffers (``[N, ...]``) and
member-leading inputs (``[N, B, ...]``) and returns member-leading outputs.

Internally every entry is a *planner*: ``planner(module, slots, context)``
returns a step ``step(leaves, *inputs)`` (or ``None`` when this module's
configuration cannot be batched, so it runs under ``vmap``). ``slots`` maps
the module's own parameter and buffer names to positions in ``leaves``, the
flat tuple of stacked tensors of the ensemble; resolving them when the plan is
built keeps dict lookups and introspection off the per-call path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from .verify import checked_step

__all__ = [
    "BatchContext",
    "is_plain_sequential",
    "is_torch_layer",
    "planner_for",
    "register_batched",
    "register_planner",
]


class BatchContext:
    """What the steps of one ensemble share: its ``randomness`` (read at call time),
    and the *derived leaves*: views of the stacked tensors that a step needs in
    another layout (``weight.mT``), computed once per call instead of once per use,
    and kept by the ensemble across calls while its parameters stay the same objects.
    """

    __slots__ = ("derivations", "leaf_count", "positions", "randomness")

    def __init__(self, leaf_count: int = 0, randomness: str = "different") -> None:
        self.randomness = randomness
        self.leaf_count = leaf_count
        self.derivations: list[tuple[Callable, int]] = []
        self.positions: dict[tuple[Callable, int], int] = {}

    def derived(self, function: Callable, position: int) -> int:
        """The position (in the extended leaves) of ``function(leaves[position])``."""
        key = (function, position)
        if key not in self.positions:
            self.positions[key] = self.leaf_count + len(self.derivations)
            self.derivations.append(key)
        return self.positions[key]

    def extend(self, leaves: tuple) -> tuple:
        """``leaves`` followed by the derived leaves."""
        if not self.derivations:
            return leaves
        return leaves + tuple([function(leaves[i]) for function, i in self.derivations])


LayerPlanner = Callable[[nn.Module, dict, BatchContext], Any]

_PLANNERS: dict[type, LayerPlanner] = {}


def register_planner(
    *module_types: type, falls_back: str = "", mode_free: bool = False
) -> Callable[[LayerPlanner], LayerPlanner]:
    """Decorator: the built-in layers' planners (see the module docstring).

    ``falls_back`` names the configurations whose planner returns ``None`` (they
    run under vmap), for the published table of layers (``layer_table``).
    ``mode_free``: the planner does not read the module's train/eval flag (its
    step reads it when it runs, or never), so a plan need not be rebuilt when the
    flag changes; without it the ensemble watches the flag on every call.
    """

    def decorate(planner: LayerPlanner) -> LayerPlanner:
        if falls_back:
            planner.falls_back = falls_back  # type: ignore[attr-defined]
        if mode_free:
            planner.mode_free = True  # type: ignore[attr-defined]
        for module_type in module_types:
            _PLANNERS[module_type] = planner
        return planner

    return decorate


def planner_for(module: nn.Module) -> LayerPlanner | None:
    """The planner registered for exactly ``type(module)`` (a subclass may change
    ``forward``, so it is not assumed to batch like its parent)."""
    return _PLANNERS.get(type(module))


def is_plain_sequential(module: nn.Module) -> bool:
    """An ``nn.Sequential`` with torch's own forward: the chain of its children."""
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


def is_torch_layer(module: nn.Module) -> bool:
    """A layer of ``torch.nn`` (never traced: batched by a planner or vmapped)."""
    return type(module).__module__.startswith("torch.nn.")


def register_batched(module_type: type, fn: Callable | None = None, *, trusted: bool = False):
    """Register a batched implementation of ``module_type`` for :class:`~tdfunc.Ensemble`.

    ``fn(module, params, *inputs)`` runs the layer for all members at once:
    ``module`` is the template instance (read its hyper-parameters, not its
    tensors), ``params`` maps the module's parameter and buffer names to the
    stacked tensors ``[N, ...]`` (its own as ``"weight"``, its submodules' as
    ``"inner.weight"``), and each input is member-leading ``[N, B, ...]``
    (non-tensor inputs pass as they are). It returns the member-leading output.
    Works as a decorator too: ``@register_batched(MyLayer)``.

    The first call for each input signature (shapes, dtypes, devices, training
    mode) is checked: the output must carry the member dim and equal the
    module run alone on the first and the last member, and buffers it updates
    in place must match too; a difference raises ``ValueError``. Pass
    ``trusted=True`` to skip the check, for a function that is right but
    cannot match member by member (one that draws random numbers).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tdfunc import Ensemble, register_batched
        >>> class Scale(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.weight = nn.Parameter(torch.ones(3))
        ...     def forward(self, x):
        ...         return x * self.weight
        >>> @register_batched(Scale)
        ... def scale(module, params, x):  # x: [N, B, 3], weight: [N, 3]
        ...     return x * params["weight"].unsqueeze(1)
        >>> ensemble = Ensemble(*[nn.Sequential(nn.Linear(2, 3), Scale()) for _ in range(4)])
        >>> ensemble(torch.randn(5, 2)).shape
        torch.Size([4, 5, 3])
        >>> ensemble.batched_summary
        '2/2 layers batched'
    """
    if not isinstance(module_type, type) or not issubclass(module_type, nn.Module):
        raise TypeError(
            f"register_batched: expected an nn.Module subclass, got {module_type!r}. "
            f"Use register_batched(MyLayer, fn) or @register_batched(MyLayer)."
        )
    if fn is None:
        return lambda function: register_batched(module_type, function, trusted=trusted)
    if not callable(fn):
        raise TypeError(
            f"register_batched: fn must be callable as fn(module, params, *inputs), got "
            f"{type(fn).__name__}."
        )
    label = f"register_batched({module_type.__name__}, {getattr(fn, '__name__', fn)!r})"

    def planner(module: nn.Module, slots: dict, context: BatchContext):
        names = tuple(slots)
        positions = tuple(slots.values())

        def step(leaves, *inputs, **kwargs):
            params = {name: leaves[i] for name, i in zip(names, positions)}
            return fn(module, params, *inputs, **kwargs)

        if trusted:
            return step
        return checked_step(step, module, names, positions, label)

    planner.subtree = True  # type: ignore[attr-defined]  # gets its submodules' tensors too
    planner.mode_free = True  # type: ignore[attr-defined]  # fn reads the module when called
    _PLANNERS[module_type] = planner
    return fn
