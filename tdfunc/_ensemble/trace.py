"""Custom ``forward`` code, batched: a ``torch.fx`` trace rewritten to the member-leading layout.

The template module is traced once (modules with a batched implementation,
unregistered ``torch.nn`` layers and untraceable submodules are kept as calls),
then every node is rewritten (``graph_ops.py`` explains the rules): parameter reads
become reads of the stacked leaves, module calls become their steps (batched
or vmapped), ops are shifted to the member dim or run under vmap alone. The
rewritten graph compiles to straight Python code, run on every call.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

from . import functional_ops
from . import graph_ops as ops
from .attention import folded_attention
from .explain import TRACED, VMAP, Route
from .registry import is_plain_sequential, is_torch_layer, planner_for

if TYPE_CHECKING:
    from .plan import Planner

_STATIC_ATTRIBUTES = frozenset(["dtype", "device", "is_cuda", "requires_grad", "layout", "is_leaf"])


class _Unbatchable(Exception):
    """An op of the graph cannot run batched, nor under vmap on its own."""


class _Tracer(fx.Tracer):
    def __init__(self, untraceable: dict) -> None:
        super().__init__()
        self.untraceable = untraceable

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        if planner_for(module) is not None or id(module) in self.untraceable:
            return True
        if is_plain_sequential(module) or isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            return False
        return is_torch_layer(module)


def _custom(module: nn.Module) -> bool:
    return (
        planner_for(module) is None
        and not is_plain_sequential(module)
        and not isinstance(module, (nn.ModuleList, nn.ModuleDict))
        and not is_torch_layer(module)
    )


def _find_untraceable(module: nn.Module, untraceable: dict, seen: set) -> None:
    """Mark (bottom-up) the custom submodules that ``torch.fx`` cannot trace."""
    if id(module) in seen:
        return
    seen.add(id(module))
    for child in module.children():
        _find_untraceable(child, untraceable, seen)
    if _custom(module):
        try:
            _Tracer(untraceable).trace(module)
        except Exception as error:  # any failure of symbolic tracing: fall back to vmap
            message = (str(error).strip().splitlines() or [type(error).__name__])[0]
            untraceable[id(module)] = f"untraceable by torch.fx: {message[:90]}"


class WholeForward(Exception):
    """The template's own forward cannot be batched: the ensemble vmaps all of it."""


def traced_step(planner: Planner, module: nn.Module, path: str) -> Callable:
    """The step of a module with custom ``forward`` code (see the module docstring)."""
    _find_untraceable(module, planner.untraceable, planner.checked)
    why = planner.untraceable.get(id(module))
    if why is None:
        report = planner.report
        saved = (list(report.batched), list(report.vmapped), list(report.routes))
        try:
            graph = _Tracer(planner.untraceable).trace(module)
            step = _Rewriter(planner, module, path, graph).run()
            # before the rows of its submodules and ops
            report.routes.insert(len(saved[2]), Route(path, type(module).__name__, TRACED))
            return step
        except _Unbatchable as error:
            why = str(error)
        except Exception as error:  # a rewrite that fails falls back to vmap, which is exact
            why = f"cannot rewrite: {type(error).__name__}: {str(error)[:80]}"
        report.batched[:], report.vmapped[:], report.routes[:] = saved  # this module's rows
    if not path:
        raise WholeForward(why)
    return planner.vmapped_step(module, path, why)


class _Rewriter:
    def __init__(self, planner: Planner, module: nn.Module, path: str, graph: fx.Graph) -> None:
        self.planner = planner
        self.module = module
        self.path = path
        self.graph = graph
        self.batched: dict[fx.Node, bool] = {}
        self.steps = 0

    # -------------------------------------------------------------- helpers
    def is_batched(self, value: Any) -> bool:
        found = []
        fx.node.map_arg(value, lambda node: found.append(self.batched.get(node, False)))
        return any(found)

    def in_dims(self, value: Any) -> Any:
        """vmap's ``in_dims`` for an argument: 0 at each batched node, None elsewhere
        (a tuple index may mix static rows and batched actions)."""
        if isinstance(value, fx.Node):
            return 0 if self.batched.get(value, False) else None
        if isinstance(value, (tuple, list)) and self.is_batched(value):
            return type(value)(self.in_dims(v) for v in value)
        if isinstance(value, dict) and self.is_batched(value):
            return {k: self.in_dims(v) for k, v in value.items()}
        return None

    def is_node(self, value: Any) -> bool:
        found = []
        fx.node.map_arg(value, lambda node: found.append(True))
        return bool(found)

    def replace(self, node: fx.Node, target: Callable, args: tuple, kwargs: dict) -> fx.Node:
        with self.graph.inserting_before(node):
            new = self.graph.call_function(target, args, kwargs)
        node.replace_all_uses_with(new)
        self.graph.erase_node(node)
        return new

    def lead_static(self, value: Any) -> Any:
        """Static tensors among ``value``'s nodes made batched (``ops.lead``)."""

        def convert(node: fx.Node) -> Any:
            if self.batched.get(node, False):
                return node
            with self.graph.inserting_after(node):
                new = self.graph.call_function(ops.lead, (node, self.leaves))
            self.batched[new] = True
            return new

        return fx.node.map_arg(value, convert)

    # -------------------------------------------------------------- driver
    def run(self) -> Callable:
        graph = self.graph
        nodes = list(graph.nodes)
        first = nodes[0]
        with graph.inserting_before(first):
            self.leaves = graph.placeholder("_leaves")
        for node in nodes:
            handler = getattr(self, f"on_{node.op}")
            handler(node)
        graph.lint()
        code = fx.GraphModule(self.module, graph)
        return code.forward

    def on_placeholder(self, node: fx.Node) -> None:
        self.batched[node] = True

    def on_output(self, node: fx.Node) -> None:
        node.args = (self.lead_static(node.args[0]),)

    def on_get_attr(self, node: fx.Node) -> None:
        owner_path, _, name = node.target.rpartition(".")
        owner = self.module.get_submodule(owner_path)
        position = self.planner.slot_index.get((id(owner), name))
        if position is None:
            self.batched[node] = False  # a constant of the traced code
            return
        new = self.replace(node, operator.getitem, (self.leaves, position), {})
        self.batched[new] = True

    def on_call_module(self, node: fx.Node) -> None:
        path = f"{self.path}.{node.target}" if self.path else node.target
        step = self.planner.module_step(self.module.get_submodule(node.target), path)
        # every tensor a step receives is member-leading, keyword ones included
        args, kwargs = self.lead_static(node.args), self.lead_static(dict(node.kwargs))
        new = self.replace(node, step, (self.leaves, *args), kwargs)
        self.batched[new] = True

    def on_call_method(self, node: fx.Node) -> None:
        self.on_op(node, node.target, ops.method(node.target))

    def on_call_function(self, node: fx.Node) -> None:
        target = node.target
        if target is builtins.getattr:
            return self.on_getattr(node)
        if target is operator.getitem:
            batched = self.is_batched(node.args[0])
            if self.is_batched(node.args[1]):  # an index that differs per member
                return self.vmap_op(node, target)
            if batched:
                self.replace_op(node, ops.getitem, node.args, node.kwargs, True)
            else:
                self.batched[node] = False
            return
        self.on_op(node, ops.FUNCTION_NAMES.get(target, ""), target)

    def on_getattr(self, node: fx.Node) -> None:
        value, attribute = node.args[0], node.args[1]
        if not self.is_batched(value):
            self.batched[node] = False
            return
        if attribute == "shape":
            self.replace_op(node, ops.member_shape, (value,), {}, False)
        elif attribute == "ndim":
            self.replace_op(node, ops.member_ndim, (value,), {}, False)
        elif attribute in _STATIC_ATTRIBUTES:
            self.batched[node] = False
        elif attribute in ("mT", "values", "indices"):  # also (values, indices) results
            self.batched[node] = True
        else:
            raise _Unbatchable(f"reads .{attribute} of a member's tensor")

    def replace_op(self, node, target, args, kwargs, batched: bool) -> None:
        new = self.replace(node, target, tuple(args), dict(kwargs))
        self.batched[new] = batched

    # -------------------------------------------------------------- ops
    def on_op(self, node: fx.Node, name: str, function: Callable) -> None:
        args, kwargs = node.args, dict(node.kwargs)
        is_method = node.op == "call_method"
        arg_flags = tuple(self.is_batched(a) for a in args)
        kwarg_flags = {k: self.is_batched(v) for k, v in kwargs.items()}
        random = name in ops.RANDOM_NAMES if is_method else function in ops.RANDOM_FUNCTIONS
        if not any(arg_flags) and not any(kwarg_flags.values()):
            if random:
                raise _Unbatchable(f"draws random numbers ({name}) for all members at once")
            self.batched[node] = False
            return
        rule = None if is_method else functional_ops.RULES.get(function)
        if rule is not None and rule(self, node, function, args, kwargs):
            return
        if random:
            return self.vmap_op(node, function)
        if (is_method and name in ops.POINTWISE_METHODS) or (
            not is_method and function in ops.POINTWISE_FUNCTIONS
        ):
            nodes = sum(1 for a in (*args, *kwargs.values()) if self.is_node(a))
            if nodes >= 2:
                target = ops.aligned(function, arg_flags, kwarg_flags)
                return self.replace_op(node, target, args, kwargs, True)
            self.batched[node] = True
            return
        if (
            not is_method
            and function in ops.PER_SAMPLE_FUNCTIONS
            and arg_flags[:1] == (True,)
            and not any(arg_flags[1:])
            and not any(kwarg_flags.values())
        ):
            return self.replace_op(node, ops.per_sample(function), args, kwargs, True)
        rewrite = getattr(self, f"rewrite_{name}", None) if name else None
        if rewrite is not None and rewrite(node, function, args, kwargs):
            return
        if not arg_flags or not arg_flags[0]:
            return self.vmap_op(node, function)
        if name in ops.DIM_OPS and self.shift_dims(node, name, [ops.DIM_OPS[name]]):
            return
        if name in ops.TWO_DIM_OPS and self.shift_dims(node, name, ops.TWO_DIM_OPS[name]):
            return
        self.vmap_op(node, function)

    def vmap_op(self, node, function) -> None:
        label = getattr(function, "__name__", str(function))
        self.planner.report.vmapped.append((f"op {label}", "no batched rule"))
        stack = node.meta.get("nn_module_stack")  # the inlined submodule whose forward holds it
        inner = next(reversed(stack)) if stack else ""
        where = ".".join(part for part in (self.path, inner) if part)
        self.planner.report.routes.append(Route(where, f"op {label}", VMAP, "no batched rule"))
        arg_dims = tuple(self.in_dims(a) for a in node.args)
        kwarg_dims = {k: self.in_dims(v) for k, v in node.kwargs.items()}
        target = ops.vmapped_op(function, arg_dims, kwarg_dims, self.planner.context)
        self.replace_op(node, target, node.args, node.kwargs, True)

    def shift_dims(self, node: fx.Node, name: str, specs) -> bool:
        args, kwargs = list(node.args), dict(node.kwargs)
        if node.op == "call_method" and name in ops.VARARG_DIM_METHODS and len(args) > 2:
            shifted = ops.shift(tuple(args[1:]))  # x.flip(0, 2): every one is a dim
            if shifted is None:
                return False
            node.args = (args[0], *shifted)
            self.batched[node] = True
            return True
        for position, keyword, default in specs:
            if position < len(args):
                value, where = args[position], position
            elif keyword in kwargs:
                value, where = kwargs[keyword], keyword
            else:
                value, where = default, keyword
            shifted = ops.shift(value)
            if shifted is None:
                return False
            if isinstance(where, int):
                args[where] = shifted
            else:
                kwargs[where] = shifted
        if name in ("cat", "concat", "concatenate", "stack"):
            args[0] = self.lead_static(args[0])
        node.args, node.kwargs = tuple(args), kwargs
        self.batched[node] = True
        return True

    # one method per shape op: return True when the node was rewritten
    def rewrite_size(self, node, function, args, kwargs) -> bool:
        if not self.is_batched(args[0]):
            return False
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if dim is not None and ops.shift(dim) is None:
            return False
        self.replace_op(node, ops.member_size, (args[0], dim), {}, False)
        return True

    def rewrite_dim(self, node, function, args, kwargs) -> bool:
        if not self.is_batched(args[0]):
            return False
        self.replace_op(node, ops.member_ndim, (args[0],), {}, False)
        return True

    rewrite_ndimension = rewrite_dim

    def rewrite_numel(self, node, function, args, kwargs) -> bool:
        if not self.is_batched(args[0]):
            return False
        self.replace_op(node, ops.member_numel, (args[0],), {}, False)
        return True

    def rewrite_new_zeros(self, node, function, args, kwargs) -> bool:
        # x.new_zeros(shape): only x's dtype and device are read, the result is static
        if node.op != "call_method" or any(
            self.is_batched(a) for a in (*args[1:], *kwargs.values())
        ):
            return False
        self.batched[node] = False
        return True

    rewrite_new_ones = rewrite_new_full = rewrite_new_empty = rewrite_new_zeros

    def _shape_op(self, node, helper, args, kwargs) -> bool:
        if kwargs or not self.is_batched(args[0]):
            return False
        self.replace_op(node, helper, args, {}, True)
        return True

    def rewrite_view(self, node, function, args, kwargs) -> bool:
        if len(args) == 2 and not self.is_node(args[1]) and isinstance(args[1], torch.dtype):
            return False  # x.view(dtype)
        return self._shape_op(node, ops.view, args, kwargs)

    def rewrite_reshape(self, node, function, args, kwargs) -> bool:
        return self._shape_op(node, ops.reshape, args, kwargs)

    def rewrite_expand(self, node, function, args, kwargs) -> bool:
        return self._shape_op(node, ops.expand, args, kwargs)

    def rewrite_repeat(self, node, function, args, kwargs) -> bool:
        return self._shape_op(node, ops.repeat, args, kwargs)

    def rewrite_permute(self, node, function, args, kwargs) -> bool:
        return self._shape_op(node, ops.permute, args, kwargs)

    def rewrite_matmul(self, node, function, args, kwargs) -> bool:
        if kwargs or len(args) != 2:
            return False
        flags = (self.is_batched(args[0]), self.is_batched(args[1]))
        self.replace_op(node, ops.matmul, (*args, *flags), {}, True)
        return True

    rewrite_bmm = rewrite_matmul

    def rewrite_linear(self, node, function, args, kwargs) -> bool:
        if node.op != "call_function" or kwargs or not 2 <= len(args) <= 3:
            return False
        if not all(self.is_batched(a) for a in args[1:]):
            return False
        self.replace_op(node, ops.linear, args, {}, True)
        return True

    def rewrite_scaled_dot_product_attention(self, node, function, args, kwargs) -> bool:
        # every member's heads in the batch dims of one fused attention call
        if (
            node.op != "call_function"
            or self.is_batched(args[4:])
            or any(self.is_batched(kwargs.get(k)) for k in ("dropout_p", "is_causal", "scale"))
        ):
            return False
        names = ("query", "key", "value", "attn_mask")
        batched = {name: self.is_batched(a) for name, a in zip(names, args)}
        batched.update({k: self.is_batched(v) for k, v in kwargs.items() if k in names})
        target = folded_attention(batched, self.planner.context)
        self.replace_op(node, target, args, kwargs, True)
        return True
