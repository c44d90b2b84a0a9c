"""How a built swap plan runs fast (:mod:`tdfunc._modules.swap_plan` builds it).

- a small plan (up to ``swap_plan.SMALL`` slots and levels) gets generated
  straight-line functions: ``read``, ``enter``, ``write`` and ``swap`` (take
  the gate of a swap alone, read and check, write, publish its record; a swap
  that finds the gate taken is recorded instead), one statement per key, step
  and slot;
- a large plan keeps its C-level passes, its slots ordered by the key their
  value is read at, so that its values are read one key at a time over a run of
  levels.

Their general twins are the passes of :class:`~tdfunc._modules.swap_plan.SwapPlan`
(``read_passes``, ``enter_passes``, ``write_passes``) and, under dynamo, its
interpreted loops (``swap_interpreted``): ``tests/modules/test_swap_paths_agree.py``
holds the three to the same slots, old objects and refusals.
"""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING, Any

from .._core.helpers.codegen import define
from .._core.helpers.nontensor import NonTensorData

if TYPE_CHECKING:
    from .swap_plan import SwapPlan


class Mismatch(Exception):
    """A plan does not fit this mapping, or the module changed since it was built."""


def _picker(positions: list) -> Any:
    """A function giving ``tuple(values[p] for p in positions)`` in one C call."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        only = positions[0]
        return lambda values: (values[only],)
    return lambda values: ()


def _straight_line(
    plan: SwapPlan,
    keys: list,
    nodes: list,
    built,
    recording: dict | None,
) -> None:
    """Replace ``plan.read``/``plan.write`` by generated straight-line functions
    doing the same reads and checks, one statement per key, step and slot, and
    ``plan.swap`` by one that also makes the swap's record (``recording``: the names
    it uses, from :mod:`tdfunc._modules.module_swap`)."""
    constants: dict[str, Any] = {"Mismatch": Mismatch}
    lines = ["def read(data):", "    l0 = data"]
    for level in range(1, len(plan.sizes)):
        parent, _, key, is_dict = nodes[level - 1]
        lines.append(f"    l{level} = l{parent}[{key!r}]{'' if is_dict else '._data'}")
    read_at: dict = {}
    for value, (level, key) in enumerate(zip(built.leaf_levels, built.leaf_keys)):
        read_at[(level, key)] = value
        lines.append(f"    v{value} = l{level}[{key!r}]")
    read_at.update(((parent, key), None) for parent, _, key, _ in nodes)  # the levels
    constants["NonTensorData"] = NonTensorData
    for level, level_keys in enumerate(keys):  # keys without a place: still metadata
        lines += [
            f"    if not isinstance(l{level}[{key!r}], NonTensorData): raise Mismatch"
            for key in level_keys
            if (level, key) not in read_at
        ]
    # Every key of the plan is read from its level above, so no level is smaller than
    # the plan's: one comparison of the total size finds a level with more keys.
    sizes = " + ".join(f"len(l{level})" for level in range(len(plan.sizes)))
    lines.append(f"    if {sizes} != {sum(plan.sizes)}: raise Mismatch")
    seen: set = set()
    held: dict = {}  # id(module) -> the constant naming its _modules dict
    for number, (module, name, child) in enumerate(built.steps):
        if (id(module), name) in seen:
            continue
        seen.add((id(module), name))
        local = held.get(id(module))
        if local is None:
            # the dict, not the module: reading ``module._modules`` runs nn.Module's
            # slow attribute path (it defines __getattr__), and the dict does not keep
            # the root module alive
            local = held[id(module)] = f"D{len(held)}"
            constants[local] = module._modules
        constants[f"C{number}"] = child
        lines.append(f"    if {local}[{name!r}] is not C{number}: raise Mismatch")
    for slot, name in enumerate(plan.names):
        constants[f"O{slot}"] = plan.owners[slot]
        lines.append(f"    x{slot} = O{slot}[{name!r}]")
    lines += [f"    if x{a} is not x{b}: raise Mismatch" for a, b in plan.tied]
    for number, (a, b, error) in enumerate(built.same_key):
        constants[f"E{number}"] = error
        lines.append(f"    if v{a} is not v{b}: raise E{number}")
    checked = len(lines)  # everything is read and checked: enter writes from here on
    values = "".join(f"v{value}, " for value in built.spread)
    olds = ", ".join(f"x{slot}" for slot in range(len(plan.names)))
    lines.append(f"    return ({values}), [{olds}]")
    lines += ["def enter(data):", *lines[1:checked]]
    lines += [
        f"    O{slot}[{plan.names[slot]!r}] = v{value}" for slot, value in enumerate(built.spread)
    ]
    lines.append(f"    return [{olds}]")
    if recording is not None:  # enter, alone under the gate (else recorded: _crowded)
        constants.update(recording)
        body = lines[lines.index("def enter(data):") + 1 : -1]  # enter, but its return
        lines += ["def swap(data, plan):", "    if not _gate(False):"]
        lines += ["        return _crowded(data, plan)", "    try:"]
        lines += [f"    {line}" for line in body]
        lines += [
            "    except BaseException:",
            "        _open()",
            "        raise",
            f"    record = [[{olds}], plan, 0, _ident()]",
            "    _SOLE[id(record)] = record",
            "    return record",
        ]
    unpack = "".join(f"a{slot}, " for slot in range(len(plan.names)))
    lines += ["def write(values):", f"    ({unpack}) = values"]
    lines += [f"    O{slot}[{name!r}] = a{slot}" for slot, name in enumerate(plan.names)]
    namespace = define(lines, "swap plan", constants)
    plan.read = namespace["read"]
    plan.enter = namespace["enter"]
    plan.write = plan.restore = namespace["write"]
    if recording is not None:
        plan.swap = namespace["swap"]


# At most this many columns (distinct keys of the values) for ``read`` to read by
# column; more (a flat mapping of dotted keys) and it reads one lookup per slot.
_MAX_COLUMNS = 64


def _by_columns(plan: SwapPlan) -> None:
    """Order a large plan's slots by the key their value is read at (a column: every
    ``weight``, then every ``bias``), so that ``read`` reads a column as one pass of
    one key over a run of levels, without a list of the level of every slot."""
    keys = [plan.leaf_keys[value] for value in plan.spread]
    levels = [plan.leaf_levels[value] for value in plan.spread]
    order: dict = {}
    for slot, key in enumerate(keys):
        order.setdefault(key, []).append(slot)
    if len(order) > _MAX_COLUMNS:
        return
    columns = []
    for key, slots in order.items():
        read = [levels[slot] for slot in slots]
        first = read[0]
        if read == list(range(first, first + len(read))):  # a run of levels, read in place
            pick = None
        else:  # levels out of order or read twice (a tie)
            pick = _picker(read)
        columns.append((first, first + len(read), pick, itemgetter(key)))
    permutation = [slot for slots in order.values() for slot in slots]
    new_slot = {old: new for new, old in enumerate(permutation)}
    plan.owners = [plan.owners[slot] for slot in permutation]
    plan.names = [plan.names[slot] for slot in permutation]
    plan.spread = [plan.spread[slot] for slot in permutation]
    own = plan.own_slots
    values = own if own is not None else range(len(plan.leaf_keys))
    plan.own_slots = [new_slot[slot] for slot in values]
    plan.tied = [(new_slot[a], new_slot[b]) for a, b in plan.tied]
    plan.columns = columns
    runs: list = []
    for slot, name in enumerate(plan.names):
        if not runs or runs[-1][1] != name:
            runs.append(([], name))
        runs[-1][0].append(plan.owners[slot])
    if len(runs) <= _MAX_COLUMNS:
        plan.name_runs = [(owners, itemgetter(name)) for owners, name in runs]
