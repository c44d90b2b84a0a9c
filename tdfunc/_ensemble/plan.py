"""A batched plan of a template module: what runs batched, what runs under vmap.

``build_batched_plan(template, slot_index, context)`` walks the template once, when the
ensemble is built:

- a module whose type has a batched implementation becomes that step;
- a plain ``nn.Sequential`` becomes the chain of its children's steps;
- a module with its own ``forward`` is traced with ``torch.fx`` and rewritten to
  the member-leading layout (``trace.py``); what the trace cannot batch runs under
  ``vmap`` for that submodule or that op only;
- anything else (an unregistered layer, code that cannot be traced) runs under
  ``vmap`` with ``torch.func.functional_call``, for that submodule only.

The result is one function ``run(leaves, *inputs, **kwargs)``, a report of
which layers are batched and which are vmapped, and the modules whose train/eval
flag the plan read while it was built (a traced ``forward`` that branches on
``self.training``, a planner not registered ``mode_free``): the plan holds for as
long as their flags are those it was built with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from .._core.helpers.codegen import define
from .._modules.slots import iter_slots
from . import attention as _attention  # noqa: F401  (attention)
from . import embedding_bag, instance_norm, pairwise, sample_layers, transposed_conv  # noqa: F401
from . import layers as _layers  # noqa: F401  (registers the built-in layers)
from . import recurrent as _recurrent  # noqa: F401  (the recurrent ones)
from . import transformer as _transformer  # noqa: F401  (transformer layers and stacks)
from .explain import BATCHED, TRACED, VMAP, Route
from .registry import BatchContext, is_plain_sequential, is_torch_layer, planner_for
from .trace import WholeForward, traced_step


class Report:
    """Which leaf modules (and ops) run batched and which run under vmap."""

    __slots__ = ("batched", "routes", "vmapped", "whole")

    def __init__(self) -> None:
        self.batched: list[str] = []
        self.vmapped: list[tuple[str, str]] = []  # (name, why)
        self.whole: str | None = None  # the reason the whole forward runs under vmap
        self.routes: list[Route] = []  # every submodule's and vmapped op's path (explain.py)

    def summary(self) -> str:
        if self.whole is not None:
            return f"forward vmapped ({self.whole})"
        batched = len(self.batched)
        layers = batched + sum(1 for name, _ in self.vmapped if not name.startswith("op "))
        if layers:
            text = f"{batched}/{layers} layers batched"
        else:  # a forward of ops on its own tensors, no submodule: "0/0" would say nothing
            traced = any(route.route == TRACED for route in self.routes)
            text = "no layers" + ("; forward traced" if traced else "")
            if not self.vmapped:
                text += ", every op batched"
        if self.vmapped:
            text += "; " + ", ".join(f"`{name}` vmapped" for name, _ in self.vmapped)
        return text


class Planner:
    """Builds steps for the modules of one template (see the module docstring)."""

    def __init__(self, template: nn.Module, slot_index: dict, context: BatchContext) -> None:
        self.template = template
        self.slot_index = slot_index  # (id(module), attribute name) -> leaf position
        self.context = context
        self.report = Report()
        self.untraceable: dict[int, str] = {}  # id(module) -> why
        self.checked: set[int] = set()  # ids of the modules tried with torch.fx
        self.modal: dict[int, nn.Module] = {}  # id -> module whose flag the plan read

    def own_slots(self, module: nn.Module) -> dict:
        return {
            slot.name: self.slot_index[(id(module), slot.name)]
            for slot in iter_slots(module, recurse=False)
            if slot.value is not None
        }

    def subtree_slots(self, module: nn.Module) -> dict:
        """``own_slots`` plus the submodules' tensors, by dotted name."""
        return {
            slot.path: self.slot_index[(id(slot.module), slot.name)]
            for slot in iter_slots(module)
            if slot.value is not None
        }

    def module_step(self, module: nn.Module, path: str) -> Callable:
        """The step for ``module`` at ``path`` (``""`` for the template itself)."""
        hooks = _hooks_of(module)
        if hooks:
            # a batched form (or a chain of the children) never calls the module, so its
            # hooks would not run: a loop of the members runs them on every call
            return self.vmapped_step(module, path, f"it has {hooks}")
        planner = planner_for(module)
        if planner is not None:
            if not getattr(planner, "mode_free", False):
                self.watch(module)
            subtree = getattr(planner, "subtree", False)  # register_batched's planners
            slots = self.subtree_slots(module) if subtree else self.own_slots(module)
            step = planner(module, slots, self.context)
            if step is not None:
                self.report.batched.append(path or type(module).__name__)
                self.report.routes.append(Route(path, type(module).__name__, BATCHED))
                return step
            limits = getattr(planner, "falls_back", "")
            why = "this configuration has no batched form" + (f" ({limits})" if limits else "")
            return self.vmapped_step(module, path, why)
        if is_plain_sequential(module):
            steps = tuple(
                self.module_step(child, f"{path}.{name}" if path else name)
                for name, child in module._modules.items()
                if child is not None
            )
            return _chain(steps)
        if is_torch_layer(module) or id(module) in self.untraceable:
            why = self.untraceable.get(id(module), f"no batched {type(module).__name__}")
            return self.vmapped_step(module, path, why)
        # a custom forward: trace and rewrite it; the code may read any submodule's flag
        self.watch(module)
        return traced_step(self, module, path)

    def watch(self, module: nn.Module) -> None:
        """Key the plan on the train/eval flags of ``module`` and its submodules."""
        for inner in module.modules():
            self.modal.setdefault(id(inner), inner)

    def vmapped_step(self, module: nn.Module, path: str, why: str) -> Callable:
        self.report.vmapped.append((path or type(module).__name__, why))
        self.report.routes.append(Route(path, type(module).__name__, VMAP, why))
        names, positions = [], []
        for slot in iter_slots(module):
            if slot.value is not None:
                names.append(slot.path)
                positions.append(self.slot_index[(id(slot.module), slot.name)])
        return vmapped_call(module, tuple(names), tuple(positions), self.context)


def _hooks_of(module: nn.Module) -> str:
    """The kinds of hooks ``module`` holds (``""`` for none)."""
    kinds = [
        kind
        for kind, hooks in (
            ("forward pre-hooks", module._forward_pre_hooks),
            ("forward hooks", module._forward_hooks),
        )
        if hooks
    ]
    return " and ".join(kinds)


def _refuse_backward_hooks(template: nn.Module) -> None:
    """Module backward hooks cannot run per member on any route: refuse them."""
    for path, module in template.named_modules():
        if module._backward_hooks or module._backward_pre_hooks:
            raise ValueError(
                f"Ensemble: the submodule {path or '<template>'!r} ({type(module).__name__}) "
                f"has backward hooks: torch.func.vmap does not run them once per member as "
                f"a loop of the members would, and the batched kernels never call the "
                f"module. Remove them, or hook the ensemble's output (or a tensor, with "
                f"tensor.register_hook) instead."
            )


# longest chain run as generated straight-line code (bounded source, bounded compile cost)
_STRAIGHT_LINE_STEPS = 64


def _chain(steps: tuple) -> Callable:
    if len(steps) == 1:
        return steps[0]
    # An activation after a layer is called directly (``pointwise``, set by the
    # elementwise planners): one Python frame less per layer, which at small
    # sizes is a visible part of the forward.
    pairs: list = []
    for step in steps:
        pointwise = getattr(step, "pointwise", None)
        if pointwise is not None and pairs and pairs[-1][1] is None:
            pairs[-1][1] = pointwise
        else:
            pairs.append([step, None])
    if len(pairs) > _STRAIGHT_LINE_STEPS:
        # a deep chain: a loop, so that no generated source grows with the model
        frozen = tuple((step, after) for step, after in pairs)

        def chain(leaves, x):
            for step, after in frozen:
                x = step(leaves, x)
                if after is not None:
                    x = after(x)
            return x

        return chain
    # straight-line code: no loop; a Linear's common case (a rank-3 input with rows of
    # its own per member) runs inline, without the step's frame
    constants: dict = {"baddbmm": torch.baddbmm, "bmm": torch.bmm}
    lines = ["def chain(leaves, x):"]
    if all(getattr(step, "matmul_operands", None) is not None for step, _ in pairs):
        # A chain of Linear layers (and elementwise functions): once the first one
        # runs inline, every later input is a fresh [N, B, out] result with rows of
        # its own, so the rest runs inline without asking again. The lines after
        # this branch are its general twin (each layer asks); the ensemble-vs-loop
        # tests (tests/ensemble/test_differential.py) run MLPs through both.
        _, _, stored = pairs[0][0].matmul_operands
        lines += [
            "    stride = x.stride()",
            f"    if len(stride) == 3 and (stride[0] or not leaves[{stored}].is_contiguous()):",
        ]
        for number, (step, after) in enumerate(pairs):
            bias, weight, _ = step.matmul_operands
            call = (
                f"bmm(x, leaves[{weight}])"
                if bias is None
                else f"baddbmm(leaves[{bias}], x, leaves[{weight}])"
            )
            if after is not None:
                constants[f"a{number}"] = after
                call = f"a{number}({call})"
            lines.append(f"        x = {call}")
        lines.append("        return x")
    for number, (step, after) in enumerate(pairs):
        constants[f"s{number}"] = step
        call = f"s{number}(leaves, x)"
        operands = getattr(step, "matmul_operands", None)
        if operands is not None:
            bias, weight, stored = operands
            inline = (
                f"bmm(x, leaves[{weight}])"
                if bias is None
                else f"baddbmm(leaves[{bias}], x, leaves[{weight}])"
            )
            # an input shared by the members (stride 0) may take the step's one
            # matmul instead, which it does only for a contiguous stored weight
            lines += [
                "    stride = x.stride()",
                f"    x = {inline} if len(stride) == 3 and (stride[0] or not "
                f"leaves[{stored}].is_contiguous()) else {call}",
            ]
            call = "x"
        if after is not None:
            constants[f"a{number}"] = after
            call = f"a{number}({call})"
        if call != "x":
            lines.append(f"    x = {call}")
    lines.append("    return x")
    return define(lines, "ensemble chain", constants)["chain"]


def vmapped_call(module: nn.Module, names: tuple, positions: tuple, context: BatchContext):
    """A step running ``module`` once per member under ``torch.func.vmap``.

    Every tensor it receives, positional or keyword, is member-leading; outputs
    that are not tensors (``None``, ints) pass through.
    """

    def call(tensors, *inputs, **kwargs):
        return torch.func.functional_call(
            module, dict(zip(names, tensors)), inputs, kwargs, tie_weights=False
        )

    fused = consults_fast_path(module)  # the plan is rebuilt when the module changes

    def step(leaves, *inputs, **kwargs):
        tensors = tuple([leaves[i] for i in positions])
        return vmap_call(call, tensors, inputs, kwargs, (0, *map(_member_dims, inputs)),
                         context.randomness, None, fused)  # fmt: skip

    return step


# the layers that read torch.backends.mha's fast-path flag in their forward
_FAST_PATH_LAYERS = (
    nn.MultiheadAttention,
    nn.TransformerEncoderLayer,
    nn.TransformerEncoder,
    nn.TransformerDecoderLayer,
)


def consults_fast_path(module: nn.Module) -> bool:
    """Whether ``module`` holds a layer whose fused inference path vmap must turn off.

    Elsewhere the flag is left alone: setting it is a graph break under ``torch.compile``."""
    return any(isinstance(m, _FAST_PATH_LAYERS) for m in module.modules())


def vmap_call(function, tensors, inputs, kwargs, in_dims, randomness, chunk_size, fused=True):
    """``vmap(function)(tensors, *inputs, **kwargs)`` that maps the keyword tensors too
    (dim 0), lets non-tensor outputs through, and keeps torch's fused inference path
    of the transformer layers to the cases where a loop over the members takes it."""
    keys = tuple(key for key, value in kwargs.items() if _has_tensor(value))
    mapped = tuple(kwargs[key] for key in keys)
    fixed = {key: value for key, value in kwargs.items() if key not in keys}
    count = len(inputs)
    structure: list = []

    def member(tensors, *values):
        out = function(tensors, *values[:count], **dict(zip(keys, values[count:])), **fixed)
        # vmap returns tensors only: other outputs (None, ints) are put back after
        flat, spec = pytree.tree_flatten(out)
        structure[:] = [spec, [_TENSOR if _tensor(v) else v for v in flat]]
        return tuple(v for v in flat if _tensor(v))

    dims = (*in_dims, *map(_member_dims, mapped))
    with _loop_fast_path(tensors, inputs, mapped, fused):
        outs = torch.func.vmap(member, in_dims=dims, randomness=randomness,
                               chunk_size=chunk_size)(tensors, *inputs, *mapped)  # fmt: skip
    spec, values = structure
    batched = iter(outs)
    return pytree.tree_unflatten([next(batched) if v is _TENSOR else v for v in values], spec)


def _member_dims(value: Any) -> Any:
    """vmap's ``in_dims`` for a member-leading input: 0 at each tensor, None elsewhere."""
    if _tensor(value):
        return 0
    if isinstance(value, (tuple, list, dict)) and _has_tensor(value):
        return pytree.tree_map(lambda v: 0 if _tensor(v) else None, value)
    return None


def _has_tensor(value: Any) -> bool:
    return any(_tensor(v) for v in pytree.tree_leaves(value))


class _loop_fast_path:
    """torch's transformer layers take a fused inference kernel (no backward) when no
    input or weight requires grad; under vmap they cannot see that a batched weight
    requires grad, so the kernel is turned off where a loop would not take it."""

    __slots__ = ("previous",)

    def __init__(self, tensors: tuple, inputs: tuple, kwargs: tuple, fused: bool) -> None:
        self.previous = None
        if (
            fused
            and torch.is_grad_enabled()
            and any(
                v.requires_grad for v in pytree.tree_leaves((tensors, inputs, kwargs)) if _tensor(v)
            )
        ):
            self.previous = torch.backends.mha.get_fastpath_enabled()

    def __enter__(self) -> None:
        if self.previous:
            torch.backends.mha.set_fastpath_enabled(False)

    def __exit__(self, *exc) -> None:
        if self.previous:
            torch.backends.mha.set_fastpath_enabled(True)


_TENSOR = object()  # marks where a vmapped step's outputs were tensors


def _tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def build_batched_plan(
    template: nn.Module, slot_index: dict, context: BatchContext
) -> tuple[Any, Report, tuple]:
    """The batched forward of ``template`` (``run(leaves, *inputs, **kwargs)``), its
    report, and the modules whose train/eval flags it was built for (see the module
    docstring); ``run`` is ``None`` when the whole forward must run under vmap."""
    _refuse_backward_hooks(template)
    planner = Planner(template, slot_index, context)
    try:
        run = planner.module_step(template, "")
    except WholeForward as error:
        planner.report.whole = str(error)
        planner.report.routes[:] = [Route("", type(template).__name__, VMAP, str(error))]
        return None, planner.report, ()
    if planner.report.vmapped and not planner.report.batched:
        names = ", ".join(f"`{name}`" for name, _ in planner.report.vmapped)
        planner.report.whole = f"nothing to batch: {names} without a batched form"
        # the whole forward runs under vmap: one row for it, then the parts that had no form
        parts = [route for route in planner.report.routes if route.path and route.route == VMAP]
        whole = Route("", type(template).__name__, VMAP, planner.report.whole)
        planner.report.routes[:] = [whole, *parts]
        return None, planner.report, ()
    return run, planner.report, tuple(planner.modal.values())
