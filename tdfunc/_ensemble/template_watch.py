"""What a batched plan may have read of the template, to see when it changed.

A plan is built from the template (``Ensemble.template``): a traced ``forward`` keeps
the Python values it read (``self.scale``), a batched layer its settings
(``negative_slope``, ``stride``), and both the submodules and hooks found. Once the
template has been handed out, a user may change any of these, and the members
(``member(k)``, copies of the template) would compute something the plan does not.
So, from then on, every call compares the template's state with the one the plan
was built from: every module's attribute values and children by identity, and the
sizes of its hook, parameter and buffer dicts. The values are kept alive with the
record, so an identity cannot be reused by a new object. (A container attribute of
the user's edited in place, such as a config dict, is not seen.)
"""

from __future__ import annotations

from itertools import chain
from operator import is_

from torch import nn

from .._modules.slots import iter_slots

# the containers nn.Module fills in place that change a forward: tensors and hooks
_CONTAINERS = (
    "_parameters",
    "_buffers",
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_values = dict.values


def template_state(template: nn.Module) -> tuple:
    """The attribute dicts and submodule dicts of every module, their values in order,
    its parameter, buffer and hook dicts and their sizes."""
    dicts = []
    containers = []
    for module in template.modules():
        attributes = module.__dict__
        children = module._modules
        dicts.append(attributes)
        dicts.append(children)
        containers.extend(attributes[name] for name in _CONTAINERS if name in attributes)
    values = tuple(chain.from_iterable(map(_values, dicts)))
    return tuple(dicts), values, tuple(containers), tuple(map(len, containers))


def unchanged(recorded: tuple) -> bool:
    """Whether every module holds what ``recorded`` (:func:`template_state`) holds:
    every attribute value and child the same object, every container of the same size.
    A few C-level passes in all (this runs on every call of a watched ensemble)."""
    dicts, values, containers, sizes = recorded
    now = tuple(chain.from_iterable(map(_values, dicts)))
    return (
        len(now) == len(values)
        and all(map(is_, now, values))
        and tuple(map(len, containers)) == sizes
    )


def only_modes_changed(recorded: tuple, template: nn.Module) -> bool:
    """Whether the template differs from ``recorded`` in train/eval flags only (the
    plans are kept per mode): compared again, without the flags."""
    fresh = template_state(template)
    if len(fresh[0]) != len(recorded[0]) or not all(map(is_, fresh[0], recorded[0])):
        return False
    if fresh[3] != recorded[3] or not all(map(is_, fresh[2], recorded[2])):
        return False
    keys = tuple(chain.from_iterable(map(dict.keys, fresh[0])))
    if len(keys) != len(recorded[1]):
        return False
    return all(a is b or key == "training" for key, a, b in zip(keys, fresh[1], recorded[1]))


def slot_names(template: nn.Module) -> list:
    """The names of the template's parameters and buffers (what the stacked tensors fill)."""
    return [slot.path for slot in iter_slots(template) if slot.value is not None]
