"""What a batched plan may have read of the template, to see when it changed.

A plan is built from the template (``Ensemble.template``): a traced ``forward`` keeps
the Python values it read (``self.scale``), a batched layer its settings
(``negative_slope``, ``stride``), and both the submodules and hooks found. Once the
template has been handed out, a user may change any of these, and the members
(``member(k)``, copies of the template) would compute something the plan does not.
So, from then on, every call compares the template's state with the one the plan
was built from: every module's attributes by identity, and the dicts and sets among
them (submodules, hooks, parameters) item by item. The values are kept alive with
the record, so an identity cannot be reused by a new object.
"""

from __future__ import annotations

from operator import is_

from torch import nn

from .._modules.slots import iter_slots

_CONTAINERS = (set, frozenset, list)


def template_state(template: nn.Module) -> list:
    """The flat list of every module's attribute names and values (containers opened)."""
    out: list = []
    for module in template.modules():
        out.append(module)
        for name, value in module.__dict__.items():
            if name == "training":  # the plans are kept per mode (Ensemble._plan_for_mode)
                continue
            out.append(name)
            out.append(value)
            if isinstance(value, dict):
                out.extend(value.keys())
                out.extend(value.values())
            elif isinstance(value, _CONTAINERS):
                out.extend(value)
    return out


def unchanged(recorded: list, template: nn.Module) -> bool:
    """Whether the template holds what ``recorded`` (:func:`template_state`) holds."""
    now = template_state(template)
    return len(now) == len(recorded) and all(map(is_, now, recorded))


def slot_names(template: nn.Module) -> list:
    """The names of the template's parameters and buffers (what the stacked tensors fill)."""
    return [slot.path for slot in iter_slots(template) if slot.value is not None]
