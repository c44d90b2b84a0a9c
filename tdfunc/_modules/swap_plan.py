"""Swap plans: where each value of a parameter mapping goes in one module.

A plan is data, built once per (module, key structure) in one linear walk:
parallel lists of slots (``owners[i][names[i]]``), of where each value is read
(``leaf_levels[j]``, ``leaf_keys[j]``) and of the submodule steps to check.
For a large model, reading, writing and restoring are a fixed handful of
C-level loops (``map`` over ``operator`` functions) over those lists, the
values read one key at a time over a run of levels: no source is generated, so
the first swap into a large model costs a walk, not a ``compile()`` of code
that grows with it. A small model's plan runs generated straight-line code,
and its ``swap`` (take the gate of a swap alone, read and check, write, make the
swap's record) is one generated function.

The mapping may be a TensorDict or TensorClass (nested levels are
submodules), a plain dict (nested dicts too), and any level may use dotted
keys (``"0.weight"``, as ``named_parameters`` gives them). Tied weights and
modules reachable under two paths are slots of the same object, found when
the plan is built: with ``tie=True`` one value fills every slot of a tie, and
two keys naming one tie must hold the same tensor; with ``tie=False`` each key
fills only its own slot (``torch.func.functional_call``'s ``tie_weights``).

``read`` reads and checks everything before the caller's first write, so a
mapping that does not fit (other keys, a replaced submodule, a tie that was
undone) raises :class:`Mismatch` with the module untouched, and the caller
builds a new plan. A tie made after the plan was built (``b.weight =
a.weight``) puts a known object in another slot, which no check of the plan's
own slots can see: every parameter, buffer or submodule registered anywhere bumps
:data:`REGISTRATIONS` (torch's global registration hooks), a tying plan
records the count it was built at, and when it differs the caller compares
the module's ties with the plan's (:func:`ties_of`) before trusting it again.
The count is checked by the caller before a cached plan's swap, not by the
swap: a plan just built is used once whatever another thread registers
meanwhile (a check there could be failed forever by a thread building modules).

A plan holds each walked module's ``_parameters``, ``_buffers`` and ``_modules``
dicts, not the module: reading them through the module on every swap is the
slowest part of a small swap. Every route nn.Module offers (``setattr``,
``register_*``, ``del``, item writes into those dicts) is seen; rebinding one of
those dicts wholesale (``module._modules = {...}``, ``module.__dict__.update``)
bypasses nn.Module's own bookkeeping and is not.
"""

from __future__ import annotations

import weakref
from itertools import chain, islice
from operator import attrgetter, getitem, is_not, setitem
from typing import Any

from torch import nn
from torch.nn.modules import module as _torch_module

from .._core.helpers.mixin import is_tensor_collection as _collection
from .._core.helpers.nested_keys import close_matches_hint
from .._core.helpers.nontensor import NonTensorData
from .slots import iter_slots
from .swap_fast import Mismatch, _by_columns, _picker, _straight_line

_data_of = attrgetter("_data")  # a nested TensorDict's (or TensorClass's) dict


# Parameters, buffers and submodules registered so far, in any module
# (``register_parameter``, ``register_buffer``, ``add_module``, ``module.name =
# value``). A swap writes the slots' dicts directly, so swaps do not count. Only
# "changed" matters: a lost increment between threads still changes the value.
REGISTRATIONS = [0]


def _registered(_module: nn.Module, _name: str, _value: Any) -> None:
    REGISTRATIONS[0] += 1


_torch_module.register_module_parameter_registration_hook(_registered)
_torch_module.register_module_buffer_registration_hook(_registered)
_torch_module.register_module_module_registration_hook(_registered)


def _level_of(value: Any) -> Any:
    """A nested level's mapping: a dict as is, a container's ``_data``."""
    return value if type(value) is dict else value._data


class SwapPlan:
    """Where each value of one key structure goes in one module.

    The mapping's levels are numbered breadth first (0 is the root; a level of
    depth ``d`` is a value in a level of depth ``d - 1``).

    Attributes:
        depths: per depth past the root: ``(pick the parent levels, keys,
            getter, whole)``; the getter turns a value read into the level's
            mapping (``None``: the values are dicts); ``whole``: the one level
            whose entries, all of them and in order, are this depth's (its
            values are read after one comparison of its keys), else ``None``.
        sizes, keys: every level's ``len()`` and all keys, levels in order (the
            key structure the mapping must have); total: the sum of ``sizes``.
        slot_levels, slot_keys: where each slot's value is read (``slot_levels``
            picks the level of every slot from the list of levels).
        columns: for a large plan whose slots are ordered by key, ``(start,
            stop, pick, read the key)`` per key: the values, one pass per key
            over the levels ``start:stop`` (``pick`` ``None``) or those ``pick``
            gives (``columns`` ``None``: read through ``slot_levels`` and
            ``slot_keys``).
        unread: ``(level, key)`` of keys no slot reads (metadata): checked to
            still be metadata (a level of the right size then has exactly the
            plan's keys, and a tensor put there gets the fresh plan's error).
        owners, names: the slots (distinct ``(owner dict, name)`` pairs).
        name_runs: ``(owners, read the name)`` per run of consecutive slots of one
            name (a large plan's slots are ordered by key, so a few runs), or
            ``None``: the old objects are then read one ``(owner, name)`` pair at
            a time.
        held, child_counts, child_names, children: the ``_modules`` dicts of
            the modules the keys walk through and what they held when the plan
            was built. The plan holds these dicts, as it holds the slots'
            ``_parameters``/``_buffers`` dicts: reading ``module._modules`` goes
            through ``nn.Module.__getattr__``'s slow attribute path on every
            swap, and torch never rebinds those dicts (it assigns into them).
        tied: ``(slot, slot)`` pairs that must still hold one object.
        same_key: ``((level, key), (level, key), error)``: two keys naming one tie.
        nodes: per level past the root: ``(parent level, position, key, is_dict)``.
        leaf_levels, leaf_keys, spread: where each value is read, and each
            slot's value (the traced path and the old-values view read them).
        own_slots: per value, the slot its key names (``None``: value ``i``, slot ``i``).
        signature: the key structure (a newer plan with the same one replaces this).
        tie: whether one value fills every slot of a tie.
        ties: the module's groups of tied slots that meet the plan's slots, when
            it was built (:func:`ties_of`); stamp: :data:`REGISTRATIONS` when
            they were last found current (``None``: a plan that does not tie).
        swap: ``swap(data, plan)``: ``enter``, then the swap's record
            ``[olds, plan, 0, thread id]``, published as the one swap in effect
            or recorded after the others (set by the caller, or generated).
            The plan is an argument, not a constant of the generated code: a
            plan then holds no reference to itself.
        module: a weak reference to the root module.
    """

    __slots__ = (
        "child_counts",
        "child_names",
        "children",
        "columns",
        "complete_at",
        "depths",
        "enter",
        "held",
        "keys",
        "leaf_keys",
        "leaf_levels",
        "module",
        "name_runs",
        "names",
        "nodes",
        "own_slots",
        "owners",
        "read",
        "restore",
        "same_key",
        "signature",
        "sizes",
        "slot_index",
        "slot_keys",
        "slot_levels",
        "spread",
        "stamp",
        "swap",
        "tie",
        "tied",
        "ties",
        "total",
        "unread",
        "write",
    )

    def __init__(self) -> None:
        self.complete_at: Any = None  # REGISTRATIONS when no slot was missing
        self.slot_index: Any = None
        self.name_runs: Any = None  # set for large plans (swap_fast._by_columns)
        self.swap: Any = None  # set by the caller, or generated (small plans)
        self.read = self.read_passes  # small plans: generated straight-line functions
        self.enter = self.enter_passes
        self.write = self.restore = self.write_passes

    # -------------------------------------------------------------- hot path
    # The general form of what small plans run as generated code (swap_fast.py) and of
    # swap_interpreted below: tests/modules/test_swap_paths_agree.py holds all three to
    # the same slots, old objects and refusals.
    def read_passes(self, data) -> tuple[Any, list]:
        """The new values and the old objects, per slot; raises :class:`Mismatch`
        (module untouched) when the mapping or the module no longer fits.

        Every step is one C-level pass (``map``, ``chain``, ``itemgetter``,
        list comparison) over the plan's lists: no Python loop per slot. Each
        level's keys are checked by reading every one of them, and the levels'
        total size by one sum.
        """
        levels = [data]
        for parents, keys, getter, whole in self.depths:
            if whole is None:
                found: Any = map(getitem, parents(levels), keys)
            else:  # every entry of one level: the same keys in the same order, then its values
                level = levels[whole]
                if list(level) != keys:
                    raise Mismatch
                found = level.values()
            if getter is None:
                levels += found
            elif getter is _data_of:  # an attribute read the interpreter specializes: 2x map's
                levels += [value._data for value in found]
            else:
                levels += map(getter, found)
        if self.columns is None:
            values = list(map(getitem, self.slot_levels(levels), self.slot_keys))
        else:  # one pass per key
            values = []
            for start, stop, pick, get in self.columns:
                # a run of levels is iterated in place (no copy of the list)
                values += map(get, islice(levels, start, stop) if pick is None else pick(levels))
        for level, key in self.unread:  # metadata, still: a tensor there needs a slot
            if not isinstance(levels[level][key], NonTensorData):
                raise Mismatch
        # Every key of the plan was found in its level, so no level is smaller than
        # the plan's: the same total size means each has exactly the plan's keys (one
        # sum, from levels the reads above brought into the cache).
        if sum(map(len, levels)) != self.total:
            raise Mismatch
        held = self.held
        if held:
            # Children are compared by identity: ``==`` on a list would call a new
            # child's own ``__eq__``, which may call it equal to the one it replaced.
            if len(held) == 1:  # one walked module (a Sequential)
                held = held[0]
                if list(held) != self.child_names or any(map(is_not, held.values(), self.children)):
                    raise Mismatch
            elif (
                list(map(len, held)) != self.child_counts
                or list(chain.from_iterable(held)) != self.child_names
                or any(map(is_not, chain.from_iterable(map(dict.values, held)), self.children))
            ):
                raise Mismatch
        runs = self.name_runs
        if runs is None:
            olds = list(map(getitem, self.owners, self.names))
        else:  # one pass of one getter per run of slots of one name
            olds = []
            for owners, get in runs:
                olds += map(get, owners)
        for first_slot, other in self.tied:
            if olds[first_slot] is not olds[other]:
                raise Mismatch
        for (level, key), (other_level, other_key), error in self.same_key:
            if levels[level][key] is not levels[other_level][other_key]:
                raise error
        return values, olds

    def enter_passes(self, data) -> list:
        """``read``, then write the new values: the old objects, per slot."""
        values, olds = self.read(data)
        self.write(values)
        return olds

    def write_passes(self, values) -> None:
        """Put ``values`` (one per slot) into the slots."""
        any(map(setitem, self.owners, self.names, values))  # setitem returns None: runs all

    # -------------------------------------------------------------- traced
    def swap_interpreted(self, data) -> list:
        """What ``read`` + ``write`` do, as plain loops (traceable by dynamo); the old objects."""
        levels = [data]
        for parent, _, key, _ in self.nodes:
            levels.append(_level_of(levels[parent][key]))
        for level, size in zip(levels, self.sizes):
            if len(level) != size:
                raise Mismatch
        values = [levels[level][key] for level, key in zip(self.leaf_levels, self.leaf_keys)]
        values = [values[value] for value in self.spread]
        olds = [owner[name] for owner, name in zip(self.owners, self.names)]
        for owner, name, value in zip(self.owners, self.names, values):
            owner[name] = value
        return olds

    def restore_interpreted(self, olds: list) -> None:
        for owner, name, old in zip(self.owners, self.names, olds):
            owner[name] = old

    # -------------------------------------------------------------- reading
    def old_data(self, olds, make) -> dict:
        """The data of the TensorDict of old values (``make(data)`` builds a nested level)."""
        own = self.own_slots
        slots = {
            (level, key): value if own is None else own[value]
            for value, (level, key) in enumerate(zip(self.leaf_levels, self.leaf_keys))
        }
        children = {(parent, key): level for level, (parent, _, key, _) in enumerate(self.nodes, 1)}
        starts = [0]
        for size in self.sizes:
            starts.append(starts[-1] + size)

        def level_data(level: int) -> dict:
            data: dict = {}
            for key in self.keys[starts[level] : starts[level + 1]]:
                child = children.get((level, key))
                if child is not None:
                    data[key] = make(level_data(child))
                    continue
                slot = slots.get((level, key))
                if slot is not None and olds[slot] is not None:  # None: a Linear without bias
                    data[key] = olds[slot]
            return data

        return level_data(0)

    def slot_of(self) -> dict:
        """``{(id(owner dict), name): slot}`` (for swaps that end out of order)."""
        if self.slot_index is None:
            pairs = zip(map(id, self.owners), self.names)
            self.slot_index = {pair: slot for slot, pair in enumerate(pairs)}
        return self.slot_index

    def missing_names(self) -> list:
        """Dotted names of the module's parameters and buffers that no key fills.

        Only "none missing" is remembered, with the count of registrations it was
        found at: a parameter, buffer or submodule registered since (anywhere) may
        be a slot no key fills, and a deletion cannot make one go missing.
        """
        now = REGISTRATIONS[0]  # read before the walk: a registration during it is seen later
        if self.complete_at == now:
            return []
        module = self.module()
        filled = self.slot_of()
        missing = [
            slot.path
            for slot in iter_slots(module)
            if slot.value is not None and (id(slot.owner), slot.name) not in filled
        ]
        self.complete_at = None if missing else now
        return missing


# ------------------------------------------------------------------ building
def ties_of(aliases: dict, slots: Any) -> list:
    """The groups of tied slots (``_slot_aliases``' values) that meet ``slots``
    (``(id(owner dict), name)`` pairs), each as such pairs in walk order, sorted."""
    groups = []
    for tied in aliases.values():
        group = tuple((id(owner), name) for owner, name in tied)
        if any(pair in slots for pair in group):
            groups.append(group)
    groups.sort()
    return groups


def plan_ties_current(plan: SwapPlan, aliases: dict) -> bool:
    """Whether ``plan`` still has the module's ties (``aliases``: ``_slot_aliases``)."""
    return ties_of(aliases, plan.slot_of()) == plan.ties


def _slot_aliases(root: nn.Module) -> dict[int, list]:
    """For every tensor in ``root``: all (owner dict, name) slots that hold it."""
    aliases: dict[int, list] = {}
    for _, _, owner, name, value, _ in iter_slots(root, remove_duplicate=True):
        if value is None:
            continue
        slots = aliases.get(id(value))
        if slots is None:
            aliases[id(value)] = ((owner, name),)  # a list only for a tie
        else:
            aliases[id(value)] = [*slots, (owner, name)]
    return {key: slots for key, slots in aliases.items() if len(slots) > 1}


def build_swap_plan(
    data,
    module: nn.Module,
    api: str = "to_module",
    tie: bool = True,
    traced: bool = False,
    recording: dict | None = None,
) -> SwapPlan:
    """The plan for the mapping ``data`` (a TensorDict's ``_data``, or a dict) and ``module``.

    ``recording``: what a small plan's generated ``swap`` makes a swap's record with
    (``_gate``, ``_open``, ``_ident``, ``_SOLE``, ``_crowded``:
    :mod:`tdfunc._modules.module_swap`); the caller sets ``swap`` of other plans.

    Raises:
        KeyError: a key is not a parameter, buffer or submodule of ``module``
            (with the closest names).
    """
    # read before the walk: a registration during it is seen later. A traced plan is
    # never cached (and dynamo would guard on the count: recompile at each new module)
    stamp = REGISTRATIONS[0] if tie and not traced else None
    aliases = _slot_aliases(module) if tie else {}
    builder = _Builder(aliases, api)
    plan = builder.build(data, module, traced, recording, stamp)
    plan.ties = ties_of(aliases, builder.index) if stamp is not None else None
    plan.tie = tie
    plan.signature = (tie, plan.signature)
    return plan


class _Builder:
    """One breadth-first walk over the mapping and the module: the plan's lists."""

    def __init__(self, aliases: dict, api: str) -> None:
        self.aliases = aliases
        self.api = api
        self.owners: list = []
        self.names: list = []
        self.spread: list = []  # per slot: its value
        self.index: dict = {}  # (id(owner), name) -> slot
        self.leaf_levels: list = []  # per value: where it is read
        self.leaf_keys: list = []
        self.own_slots: list = []  # per value: the slot its key names
        self.walked: dict = {}  # id(module) -> module whose _modules a key walks through
        self.tied: list = []
        self.same_key: list = []  # (value, value, error)
        self.steps: list = []  # (module, name, child): module._modules[name] is child

    def build(
        self, data, module: nn.Module, traced: bool, recording: dict | None, stamp: Any
    ) -> SwapPlan:
        sizes = [len(data)]
        keys: list = [list(data)]
        nodes: list = []  # per level past the root: (parent level, position, key, is_dict)
        depth_starts = [0]
        current = [(0, data, module, ())]  # (level, mapping, module, key path)
        while current:
            following: list = []
            for level, mapping, owner_module, path in current:
                for position, (key, value) in enumerate(mapping.items()):
                    if isinstance(value, NonTensorData):
                        continue  # metadata: nothing to put in the module
                    holder, name = self._walk(owner_module, key, path)
                    is_dict = type(value) is dict
                    if is_dict or _collection(value):
                        child = holder._modules.get(name)
                        if child is None:
                            raise self._no_such_key(path + (key,), holder, name, "submodule")
                        self.walked.setdefault(id(holder), holder)
                        self.steps.append((holder, name, child))
                        inner = value if is_dict else value._data
                        child_level = len(sizes)
                        sizes.append(len(inner))
                        keys.append(list(inner))
                        nodes.append((level, position, key, is_dict))
                        following.append((child_level, inner, child, path + (key,)))
                        continue
                    self._leaf(holder, name, path + (key,), (level, position, key))
            if following:
                depth_starts.append(following[0][0])
            current = following
        plan = SwapPlan()
        plan.stamp = stamp
        plan.module = weakref.ref(module)
        plan.sizes = sizes
        plan.owners = self.owners
        plan.names = self.names
        plan.nodes = nodes
        plan.leaf_levels = self.leaf_levels
        plan.leaf_keys = self.leaf_keys
        plan.spread = self.spread
        if traced:  # used once, by swap_interpreted: dynamo traces no more than it reads
            plan.signature = None
            return plan
        plan.depths = []
        for depth in range(len(depth_starts) - 1):
            end = _end(depth_starts, depth + 1, len(sizes))
            inner = nodes[depth_starts[depth + 1] - 1 : end - 1]
            kinds = {is_dict for _, _, _, is_dict in inner}
            getter = None if kinds == {True} else _data_of if kinds == {False} else _level_of
            parents = [parent for parent, _, _, _ in inner]
            depth_keys = [key for _, _, key, _ in inner]
            # the whole of one level, in order (a Sequential's root): read its values
            # after one comparison of its keys, instead of a lookup per key
            whole = parents[0] if parents == [parents[0]] * len(parents) else None
            if whole is not None and keys[whole] != depth_keys:
                whole = None
            plan.depths.append((_picker(parents), depth_keys, getter, whole))
        plan.total = sum(sizes)
        plan.keys = list(chain.from_iterable(keys))
        plan.slot_levels = _picker([self.leaf_levels[value] for value in self.spread])
        plan.slot_keys = [self.leaf_keys[value] for value in self.spread]
        read = set(zip(self.leaf_levels, self.leaf_keys))
        read.update((parent, key) for parent, _, key, _ in nodes)
        plan.unread = [
            (level, key)
            for level, level_keys in enumerate(keys)
            for key in level_keys
            if (level, key) not in read
        ]
        identity = self.own_slots == list(range(len(self.own_slots)))
        plan.own_slots = None if identity else self.own_slots
        plan.tied = self.tied
        where = list(zip(self.leaf_levels, self.leaf_keys))
        plan.same_key = [(where[a], where[b], error) for a, b, error in self.same_key]
        parents = list(self.walked.values())
        plan.child_counts = [len(parent._modules) for parent in parents]
        plan.child_names = [name for parent in parents for name in parent._modules]
        plan.children = [child for parent in parents for child in parent._modules.values()]
        plan.held = [parent._modules for parent in parents]
        plan.signature = (sizes, plan.keys, self.spread)  # lists: compared, never hashed
        plan.columns = None
        if not traced:
            if len(self.owners) + len(sizes) <= SMALL:
                _straight_line(plan, keys, nodes, self, recording)
            else:
                _by_columns(plan)
        return plan

    def _walk(self, module: nn.Module, key: Any, path: tuple) -> tuple:
        """The module that holds ``key`` (a dotted key walks submodules), and its last name."""
        if type(key) is not str or "." not in key:
            return module, key
        *parts, name = key.split(".")
        for part in parts:
            child = module._modules.get(part)
            if child is None:
                raise self._no_such_key(path + (key,), module, part, "submodule")
            self.walked.setdefault(id(module), module)
            self.steps.append((module, part, child))
            module = child
        return module, name

    def _leaf(self, module: nn.Module, name: str, path: tuple, read: tuple) -> None:
        """Record a value (read at ``read``: level, position, key) for ``module``'s slot
        ``name`` and its ties."""
        owner: dict[str, Any]
        if name in module._parameters:
            owner = module._parameters
        elif name in module._buffers:
            owner = module._buffers
        else:
            raise self._no_such_key(path, module, name, "parameter or buffer")
        current = owner[name]
        tied = self.aliases.get(id(current), ()) if current is not None else ()
        if not tied:
            tied = [(owner, name)]
        elif tied[0][0] is not owner or tied[0][1] != name:  # this slot first: the old value
            tied = [(owner, name)] + [s for s in tied if s[0] is not owner or s[1] != name]
        value = len(self.leaf_keys)
        self.leaf_levels.append(read[0])
        self.leaf_keys.append(read[2])
        first = -1
        for slot_owner, slot_name in tied:
            slot_id = (id(slot_owner), slot_name)
            slot = self.index.get(slot_id)
            if slot is None:
                slot = self.index[slot_id] = len(self.owners)
                self.owners.append(slot_owner)
                self.names.append(slot_name)
                self.spread.append(value)
            elif first < 0:  # two keys name one tie: one tensor, or an error
                self.same_key.append((self.spread[slot], value, _tie_conflict(read[2], slot_name)))
            if first < 0:
                first = slot
            else:  # tied slots must still hold one object
                self.tied.append((first, slot))
        self.own_slots.append(first)

    def _no_such_key(self, path: tuple, module: nn.Module, name: str, what: str) -> KeyError:
        leaves = list(module._parameters) + list(module._buffers)
        if what == "submodule" and name in leaves:
            hint = f" {name!r} is a parameter or buffer there, not a submodule."
        elif what != "submodule" and name in module._modules:
            hint = f" {name!r} is a submodule there: give it a nested level or longer keys."
        else:
            hint = close_matches_hint(name, leaves + list(module._modules))
        shown = path[0] if len(path) == 1 else path
        return KeyError(
            f"{self.api}: the {'mapping' if self.api == 'functional_call' else 'TensorDict'} "
            f"has key {shown!r} but {type(module).__name__} has no {what} {name!r}.{hint}"
        )


# Up to this many slots + levels, ``read`` and ``write`` are generated straight-line
# code (a few hundred lines at most): for small models a handful of C-level
# passes cost more than the work itself. Larger plans run the passes.
SMALL = 256


def _end(depth_starts: list, depth: int, count: int) -> int:
    """One past the last level of ``depth``."""
    return depth_starts[depth + 1] if depth + 1 < len(depth_starts) else count


def _tie_conflict(key: Any, name: str) -> ValueError:
    return ValueError(
        f"two keys name the tied slot {name!r} (the key {key!r} and an earlier one) with "
        f"different tensors; tied parameters take one value: pass one of the keys, the "
        f"same tensor for both, or (functional_call) tie_weights=False."
    )
