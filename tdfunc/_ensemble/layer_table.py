"""The published table of what an ``Ensemble`` runs batched and what falls back to ``vmap``.

Generated from the registry (``registry.py``) and the rewrite rules of traced
code (``graph_ops.py``), so the documentation cannot drift from the code:
``docs/ensemble-layers.md`` holds the output of :func:`layer_table` between two
markers, and a test compares them. To refresh the page after adding a planner::

    python -m tdfunc._ensemble.layer_table docs/ensemble-layers.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from . import functional_ops
from . import graph_ops as ops
from . import plan as _plan  # noqa: F401  (imports every planner module, filling the registry)
from .registry import _PLANNERS

BEGIN = "<!-- begin generated layer table: python -m tdfunc._ensemble.layer_table -->"
END = "<!-- end generated layer table -->"

# torch.nn classes that are no layer a template holds as it is: bases, containers
# (their own rows say how they are run), wrappers, and lazy layers, which become
# their ordinary class once initialised (and an ensemble stacks initialised members)
_NOT_LAYERS = frozenset(
    ["Module", "Container", "RNNBase", "RNNCellBase", "DataParallel", "ParameterList",
     "ParameterDict"]
)  # fmt: skip
_CONTAINERS = {
    "Sequential": ("chain", "its children's steps, one after the other (torch's own `forward`)"),
    "ModuleList": ("traced", "its items, called from the traced `forward` that holds it"),
    "ModuleDict": ("traced", "its items, called from the traced `forward` that holds it"),
}


def _torch_layers() -> list[type]:
    found = []
    for name in dir(nn):
        value = getattr(nn, name)
        if (
            isinstance(value, type)
            and issubclass(value, nn.Module)
            and not name.startswith(("_", "Lazy"))
            and name not in _NOT_LAYERS
        ):
            found.append(value)
    return sorted(found, key=lambda cls: cls.__name__)


def _layer_rows() -> list[str]:
    rows = ["| Layer | Runs | Falls back to `vmap` for |", "|---|---|---|"]
    for cls in _torch_layers():
        name = cls.__name__
        if name in _CONTAINERS:
            route, note = _CONTAINERS[name]
            rows.append(f"| `nn.{name}` | {route}: {note} | |")
            continue
        planner = _PLANNERS.get(cls)
        if planner is None:
            rows.append(f"| `nn.{name}` | `vmap` | every configuration |")
        else:
            rows.append(f"| `nn.{name}` | batched | {getattr(planner, 'falls_back', '')} |")
    return rows


def _functional_names(functions) -> str:
    """The ``torch.nn.functional`` members of ``functions``, as ``F.name``."""
    names = {
        name
        for name in dir(F)
        if not name.startswith("_") and any(getattr(F, name) is f for f in functions)
    }
    return ", ".join(f"`F.{name}`" for name in sorted(names))


def _tensor_names(names) -> str:
    return ", ".join(f"`{name}`" for name in sorted(names))


def _op_rows() -> list[str]:
    functional = [f for f in ops.POINTWISE_FUNCTIONS if callable(f)]
    dims = set(ops.DIM_OPS) | set(ops.TWO_DIM_OPS)
    rewritten = {
        name[len("rewrite_") :] for name in dir(_rewriter()) if name.startswith("rewrite_")
    }
    ruled = {function.__name__ for function in functional_ops.RULES}
    return [
        "| In a traced `forward` | How it runs |",
        "|---|---|",
        f"| elementwise functions and methods (`torch.name(x)`, `x.name()`): "
        f"{_tensor_names(ops.POINTWISE_METHODS)}; {_functional_names(functional)}; the "
        f"Python operators (`+`, `*`, `-x`, comparisons, ...) | as they are (operands of "
        f"different ranks get singleton dims after the member dim) |",
        f"| ops taking a dim: {_tensor_names(dims)} | batched: a literal dim is moved past "
        f"the member dim; `vmap` when the dim is computed or left to its default of every "
        f"dim |",
        f"| per-sample functions: {_functional_names(ops.PER_SAMPLE_FUNCTIONS)} | batched: "
        f"the members fold into the batch dim |",
        f"| functional layers: {_functional_names(functional_ops.RULES)} | batched: "
        f"stacked weights as the matching layers do, a weight shared by the members as it "
        f"is; dropout draws a mask per member; losses with any `reduction` for the "
        f"elementwise ones, `none` or `sum` for `cross_entropy` and `nll_loss` |",
        f"| shape and matrix ops: {_tensor_names(rewritten)}, `@`, `x[...]`, `x.shape` | "
        f"batched (rewritten for the member-leading layout) |",
        f"| other random functions: {_tensor_names(ops.RANDOM_NAMES - ruled)} | `vmap`, each "
        f"member drawing its own numbers as `randomness` says |",
        "| anything else (a function of a member's tensor with no rule above) | `vmap`, for "
        "that op only |",
    ]


def _rewriter():
    from .trace import _Rewriter

    return _Rewriter


def layer_table() -> str:
    """The generated part of ``docs/ensemble-layers.md`` (markdown, between the markers)."""
    lines = [
        BEGIN,
        "",
        f"Generated with torch {torch.__version__.split('+')[0]}.",
        "",
        *_layer_rows(),
        "",
        *_op_rows(),
        "",
        END,
    ]
    return "\n".join(lines)


def generated_part(text: str) -> str:
    """The part of a page between the markers (markers included); ``""`` when absent."""
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        return ""
    return text[start : stop + len(END)]


def refresh(path: str) -> None:
    """Rewrite the generated part of the page at ``path``."""
    page = Path(path)
    text = page.read_text()
    old = generated_part(text)
    if not old:
        raise ValueError(f"layer_table: {path} has no {BEGIN!r} ... {END!r} markers")
    page.write_text(text.replace(old, layer_table()))


if __name__ == "__main__":  # pragma: no cover
    refresh(sys.argv[1])
