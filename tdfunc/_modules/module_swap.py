"""Parameters in and out of ``nn.Module``: ``from_module``, ``from_modules``, ``to_module``.

``to_module`` sits on the hot path of every ensemble and meta-learning step, so
it runs a *swap plan* (:mod:`tdfunc._modules.swap_plan`) built once per
(module, key structure) and cached here, weakly keyed on the module; what it
returns is a ``ModuleSwap`` (a TensorDict: its behaviour is
:class:`~tdfunc._modules.swap_handle.SwapHandle`, the class is composed in
``tdfunc/_assembly.py`` and reached through the container's ``_swap_handle``). No
``nn.Parameter`` is constructed on that path (it would break
``torch.compile`` of ``vmap(grad(...))``). While ``torch.compile`` traces,
plans are built afresh and run as plain loops instead: the module-keyed cache,
the lock and the record of swaps in effect are not traceable, and a compiled
graph runs none of this Python anyway.

A swap made while no other is in effect (the common case) is not recorded: it
holds a gate for as long as it lasts. A second swap finds the gate taken and
records the first one before its own, so that one that ends out of order (two
threads on one module, handles exited in another order than entered) still
leaves the module holding what it held before all of them.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

# only dynamo cannot run this code
from .._core.helpers.tracing import dynamo_compiling as _is_compiling
from .._core.helpers.tracing import is_wrapped as _is_wrapped
from .._core.helpers.tracing import transformed as _transformed
from .swap_plan import (
    REGISTRATIONS,
    Mismatch,
    SwapPlan,
    _slot_aliases,
    build_swap_plan,
    plan_ties_current,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from .._assembly import ModuleSwap

_MAX_PLANS = 4  # a module rarely sees more than one or two key structures

# Plans per module, weakly keyed: id(module) -> (weak reference, [plans, most
# recent first]); one cache for to_module and functional_call (a plan records its
# tie mode). A plain dict probed by id is several times cheaper than a
# WeakKeyDictionary lookup; the weak reference's callback drops the entry.
_PLANS: dict[int, tuple[weakref.ref, list]] = {}

# The swaps in effect, oldest first, as records ``[olds, plan, state, thread id]``:
# ``olds`` what the swap saved (one object per slot of ``plan``), ``state`` 0 swapped,
# 1 inside ``with``, 2 restored, 3 committed for good. A record is a list, shared by
# the stack and the swap's handle (no weak reference to make, no handle kept alive:
# a handle dropped without ``with`` is still freed at once and commits). Swaps nest:
# each one saved what the one before it put in. One that ends out of order (handles
# exited in another order, two threads on one module) hands what it saved to the
# next swap above it on the same slot, so that the last one to end puts back what was
# there before all of them. The lock makes "save, write, record" and "unwind" atomic
# between threads; it is taken by ``acquire``/``release`` (cheaper than ``with``).
#
# Most swaps are alone: one ``with`` block at a time, in one thread. Such a swap takes
# the gate (a non-blocking acquire: one atomic step, whoever else tries) and holds it
# until it ends, and is not recorded: it leaves its record in ``_SOLE`` and takes it
# back on exit, with no lock and no stack. A swap that finds the gate taken goes the
# recorded way, under the lock: it first moves the sole swap's record (if one is
# published) to the bottom of the stack, so that every swap in effect is recorded
# from then on. The gate stays taken while the stack holds a swap in effect
# (state 0 or 1) and opens when the last of them ends. Taking the record out of
# ``_SOLE`` is the one atomic step that decides between a sole swap ending and a
# second swap recording it: whoever pops it owns it.
_ACTIVE: list = []
_LOCK = threading.RLock()  # reentrant: a handle dropped (__del__) while a swap holds it
_acquire = _LOCK.acquire
_release = _LOCK.release
_GATE = threading.Lock()  # held while any swap is in effect; only ever tried, never waited on
_gate = _GATE.acquire
_open = _GATE.release
# id(record) -> the record of the swap holding the gate alone, once it is made (keyed
# by identity: whoever ends a swap takes out its own record and never another's)
_SOLE: dict = {}
_take = _SOLE.pop
_ident = threading.get_ident
_new = object.__new__
_yield = time.sleep  # sleep(0): let the thread holding the gate alone finish its step
_MAX_WAITS = 1_000_000  # rounds of _yield (a few seconds): another thread's step takes few


# ------------------------------------------------------------------ the cache
def _plans_of(module: nn.Module) -> list:
    entry = _PLANS.get(id(module))
    if entry is not None and entry[0]() is module:
        return entry[1]
    key = id(module)
    plans: list = []

    def forget(_ref: weakref.ref, key: int = key) -> None:
        _PLANS.pop(key, None)
        if _LAST[0] is _ref:
            _remember(_NO_ENTRY)

    _PLANS[key] = (weakref.ref(module, forget), plans)
    return plans


def _remember(entry: tuple) -> None:
    global _LAST
    _LAST = entry


_NO_ENTRY = (lambda: None, [])
# The entry of _PLANS of the module swapped last: a loop swapping into one model
# (an ensemble step, a meta-learning step) finds it without a lookup by id.
_LAST: tuple = _NO_ENTRY

_MISMATCH = (Mismatch, KeyError, AttributeError, TypeError, IndexError)


def load_through_state_dict(td, module: nn.Module):
    """``td.to_module(module, use_state_dict=True)``: ``load_state_dict``, old values back."""
    if _transformed() or _is_compiling():
        raise RuntimeError(
            "to_module(use_state_dict=True) cannot run inside vmap, grad or torch.compile: "
            "load_state_dict copies into the module's tensors for good. Use "
            "`with params.to_module(module):` there."
        )
    if not getattr(type(td), "_is_tensordict", False):
        td = td.to_tensordict()
    entries = dict(td.flatten_keys(".").items())
    before = module.state_dict(keep_vars=False)
    missing = [key for key in entries if key not in before]
    if missing:
        raise KeyError(
            f"to_module(use_state_dict=True): {missing} are not in the module's state dict "
            f"(its keys: {sorted(before)}). Nothing was loaded."
        )
    old = {key: before[key].clone() for key in entries}
    result = module.load_state_dict(entries, strict=False)
    if result.unexpected_keys:
        raise KeyError(f"to_module(use_state_dict=True): unexpected keys {result.unexpected_keys}.")
    return td._plain_tensordict()(old, []).unflatten_keys(".")


def swap_mapping(
    data, module: nn.Module, handle_class: type, api: str = "to_module", tie: bool = True
):
    """Swap the values of ``data`` (a container's ``_data``, or a dict) into ``module``.

    The swap returns a ``handle_class`` instance: a ``ModuleSwap`` (given by the
    container's ``_swap_handle``) or, for ``functional_call``, a :class:`CallSwap`.
    """
    if _is_compiling():
        plan = build_swap_plan(data, module, api, tie, traced=True)
        return TracedSwap(plan, plan.swap_interpreted(data))
    entry = _LAST  # the module swapped last, else the cache (a lookup by id costs more)
    if entry[0]() is not module or module is None:
        entry = _PLANS.get(id(module))
        if entry is not None and entry[0]() is module:
            _remember(entry)
        else:
            entry = None
    if entry is not None:
        plans = entry[1]
        plan = plans[0]
        stamp = plan.stamp  # None: a plan that does not tie; else a registration since?
        if plan.tie is tie and (stamp is None or stamp == REGISTRATIONS[0]):
            # the most recent plan nearly always fits: _swap, inlined
            try:
                record = plan.swap(data, plan)
            except _MISMATCH:
                pass
            else:
                handle = _new(handle_class)
                handle._rec = record
                return handle
        handle = _swap_cached(plans, data, handle_class, tie)
        if handle is None and _restamp(module, plans):  # a registration, but no new tie
            handle = _swap_cached(plans, data, handle_class, tie)
        if handle is not None:
            return handle
    if not isinstance(module, nn.Module):
        raise TypeError(f"{api}: expected an nn.Module, got {type(module).__name__}.")
    if not hasattr(data, "items"):
        raise TypeError(
            f"{api}: expected a TensorDict, a TensorClass or a dict of tensors, got "
            f"{type(data).__name__}."
        )
    plan = build_swap_plan(data, module, api, tie, False, _RECORDING)
    if plan.swap is None:
        plan.swap = _record_swap
    handle = _swap(
        plan, data, handle_class
    )  # a fresh plan fits: anything raised here is a real error
    plans = _plans_of(module)
    # plans with the same key structure as the new one are stale (the module changed)
    plans[:] = [plan] + [old for old in plans if old.signature != plan.signature]
    del plans[_MAX_PLANS:]
    _remember(_PLANS[id(module)])
    return handle


def _swap_cached(plans: list, data, handle_class: type, tie: bool) -> Any:
    """The handle of a swap by the first cached plan that fits, else ``None``."""
    now = REGISTRATIONS[0]
    for position, plan in enumerate(plans):
        if plan.tie is not tie or (plan.stamp is not None and plan.stamp != now):
            continue  # another mode, or a registration since (maybe a new tie)
        try:
            handle = _swap(plan, data, handle_class)
        except _MISMATCH:
            continue
        if position:  # the most recent plan is tried first
            plans.insert(0, plans.pop(position))
        return handle
    return None


def _restamp(module: nn.Module, plans: list) -> bool:
    """After parameters or buffers were registered (anywhere), mark the plans whose
    ties the module still has as current; whether any was. A plan whose ties
    changed stays stale: a new plan replaces it."""
    now = REGISTRATIONS[0]  # read before the walk: a registration during it is seen later
    stale = [plan for plan in plans if plan.stamp is not None and plan.stamp != now]
    if not stale:
        return False
    aliases = _slot_aliases(module)
    renewed = False
    for plan in stale:
        if plan_ties_current(plan, aliases):
            plan.stamp = now
            renewed = True
    return renewed


def _swap(plan: SwapPlan, data, handle_class: type) -> Any:
    """Save the slots, write ``data``'s values, record the swap; the handle."""
    handle = _new(handle_class)
    handle._rec = plan.swap(data, plan)
    return handle


def _record_swap(data, plan: SwapPlan) -> list:
    """``plan.swap`` of a plan without a generated one: save the slots, write
    ``data``'s values; the record (published alone, or recorded under the lock)."""
    if not _gate(False):
        return _crowded(data, plan)
    try:
        olds = plan.enter(data)
    except BaseException:
        _open()
        raise
    record = [olds, plan, 0, _ident()]
    _SOLE[id(record)] = record
    return record


def _crowded(data, plan: SwapPlan) -> list:
    """The swap of ``plan`` when the gate is taken: recorded under the lock, with the
    sole swap in effect (if any) recorded below it first; the record."""
    waited = 0
    while True:
        _acquire()
        try:
            try:  # one atomic step: the sole swap may be ending meanwhile, unlocked
                sole = _SOLE.popitem()[1]
            except KeyError:
                sole = None
            if sole is not None:  # alone until now: from here on it is recorded
                _ACTIVE.insert(0, sole)
            if sole is not None or _in_effect():
                record = [plan.enter(data), plan, 0, _ident()]
                _push(record)
                return record
        finally:
            _release()
        # The gate is held, but by no recorded swap and by no published one: a sole
        # swap is being made or ending in another thread. Once it is done, either
        # it is published (recorded above on the next round) or the gate is open.
        if _gate(False):
            try:
                olds = plan.enter(data)
            except BaseException:
                _open()
                raise
            record = [olds, plan, 0, _ident()]
            _SOLE[id(record)] = record
            return record
        waited += 1
        if waited > _MAX_WAITS:  # only a swap made from inside another's step can wait forever
            raise RuntimeError(
                "to_module: a swap waited for another swap that is being made or ended in "
                "this thread (a swap started from a finalizer, signal handler or weakref "
                "callback while another swap was running); make swaps from ordinary code."
            )
        _yield(0)


def _in_effect() -> bool:
    """Whether the stack holds a swap in effect (swapped, or inside ``with``)."""
    return any(entry[2] < 2 for entry in _ACTIVE)


def _settle() -> None:
    """After a recorded swap ended (lock held): when none is left in effect, empty the
    stack and open the gate (the next swap is alone again)."""
    if not _in_effect():
        _ACTIVE.clear()
        _open()


def _push(record: list) -> None:
    """Record a swap in effect (with the lock held)."""
    active = _ACTIVE
    # records left on top that will not end as layers: swaps that ended or were
    # committed, and loads for good (never entered) made by this thread
    while active and _dropped(active[-1], record[3]):
        active.pop()
    active.append(record)


def _dropped(record: list, ident: int) -> bool:
    state = record[2]
    return state > 1 or (state == 0 and record[3] == ident)


# what the generated ``swap`` of a small plan records a swap with (swap_plan.py)
_RECORDING = {
    "_gate": _gate,
    "_open": _open,
    "_ident": _ident,
    "_SOLE": _SOLE,
    "_crowded": _crowded,
}


def _unwind(record: list) -> None:
    """End the swap of ``record`` when it is not the latest one still in effect.

    Each slot goes to the next swap above that covers it (what that one will
    put back on its exit) or, when none does, back into the module. Swaps above
    that this thread made and never entered (loads for good made during this
    one) end with it, as they would in nested order; another thread's swap not
    entered yet is still to come: it stays, and puts back what this one saved.
    Called with the lock held.
    """
    olds, plan = record[0], record[1]
    active = _ACTIVE
    position = next((i for i in range(len(active) - 1, -1, -1) if active[i] is record), None)
    if position is None:  # not recorded (or already ended): put back what it saved
        plan.write(olds)
        return
    ident = _ident()
    kept = [entry for entry in active[position + 1 :] if not _dropped(entry, ident)]
    active[position:] = kept
    above = [(entry[0], entry[1].slot_of()) for entry in kept]
    if not above:
        plan.write(olds)
        _settle()
        return
    for slot, key in enumerate(zip(map(id, plan.owners), plan.names)):
        for other_olds, index in above:
            found = index.get(key)
            if found is not None:
                other_olds[found] = olds[slot]
                break
        else:
            plan.owners[slot][plan.names[slot]] = olds[slot]


def _ended(record: list) -> None:
    """A swap in effect ended without putting anything back (committed, or its handle
    dropped inside its block), lock held: a sole one gives the gate back, a recorded
    one may leave none in effect."""
    if _take(id(record), None) is not None:
        _open()
    elif any(entry is record for entry in _ACTIVE):
        _settle()


def _end_as_it_stands(record: list) -> None:
    """A handle dropped inside its ``with`` block: its swap is over, the module keeps
    what it holds now."""
    _acquire()
    try:
        if record[2] == 1:
            record[2] = 2
            _ended(record)
    finally:
        _release()


# ------------------------------------------------------------------ loading for good
def commit_swap(plan: SwapPlan, olds) -> None:
    """Keep the swapped values for good: plain tensors in ``Parameter`` slots become
    ``Parameter``s (sharing storage; tied slots stay one object)."""
    made: dict[int, nn.Parameter] = {}
    for owner, name, old in zip(plan.owners, plan.names, olds):
        value = owner.get(name)
        if not isinstance(old, nn.Parameter) or isinstance(value, nn.Parameter):
            continue
        if not isinstance(value, torch.Tensor) or _is_wrapped(value):
            continue
        param = made.get(id(value))
        if param is None:
            param = made[id(value)] = _as_parameter(value, old.requires_grad)
        owner[name] = param


def _as_parameter(value: torch.Tensor, requires_grad: bool) -> nn.Parameter:
    """A ``Parameter`` sharing ``value``'s storage.

    A tensor subclass whose ``detach`` gives a plain tensor (a memory-mapped
    tensor loaded from disk) cannot be a ``Parameter`` itself: its storage is
    wrapped in a plain one.
    """
    if type(value) is not torch.Tensor:
        try:
            return nn.Parameter(value, requires_grad=requires_grad)
        except RuntimeError:
            value = value.as_subclass(torch.Tensor)
    return nn.Parameter(value, requires_grad=requires_grad)


class SwapState:
    """What every swap handle does with its record ``[olds, plan, state, thread id]``.

    ``state``: 0 swapped, 1 inside ``with``, 2 restored, 3 committed for good.
    Shared by :class:`TracedSwap`, :class:`CallSwap` and ``ModuleSwap``.
    """

    __slots__ = ()
    _rec: list

    @property
    def _olds(self) -> list:
        """The objects the slots held before the swap, one per slot of the plan."""
        return self._rec[0]

    @property
    def _plan(self) -> SwapPlan:
        return self._rec[1]

    @property
    def _state(self) -> int:
        return self._rec[2]

    def __enter__(self) -> Any:
        self._rec[2] = 1
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        record = self._rec
        if record[2] < 2 and _take(id(record), None) is not None:  # alone: nothing to undo
            record[2] = 2
            try:
                record[1].write(record[0])
            finally:
                _open()
            return
        # The state changes under the lock: another thread's swap drops records of
        # ended swaps, and must not drop this one before its slots are put back.
        _acquire()
        try:
            if record[2] == 2:
                return
            record[2] = 2
            active = _ACTIVE
            if active and active[-1] is record:  # the latest swap: nested order
                active.pop()
                record[1].write(record[0])
                _settle()
            else:
                _unwind(record)
        finally:
            _release()

    def restore(self) -> None:
        """Put back the objects the module held before the swap (also after a commit)."""
        self.__exit__(None, None, None)

    def commit(self) -> None:
        """Keep the swapped values for good: plain tensors in ``Parameter`` slots
        become ``Parameter``s (sharing storage; tied slots stay one object)."""
        record = self._rec
        _acquire()
        try:
            if record[2] < 2:
                record[2] = 3
                commit_swap(record[1], record[0])
                _ended(record)
        finally:
            _release()


class CallSwap(SwapState):
    """The handle of ``functional_call``'s swap: only its ``with`` block uses it."""

    __slots__ = ("_rec",)
    _is_tensor_collection = False


class TracedSwap(SwapState):
    """The handle of a swap made while dynamo traces (an interpreted plan).

    Inside a compiled function only the context-manager form is meaningful; the
    handle is not a TensorDict (dynamo traces this small class cheaply).
    """

    __slots__ = ("_rec",)

    def __init__(self, plan: SwapPlan, olds: list) -> None:
        self._rec = [olds, plan, 0, None]

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        record = self._rec  # no lock, no record of swaps in effect: dynamo traces this
        if record[2] != 2:
            record[2] = 2
            record[1].restore_interpreted(record[0])


# ------------------------------------------------------------------ from_module
class ModuleClassError(TypeError, RuntimeError):
    """Modules of different classes given to ``from_modules``: a ``TypeError`` that is
    also the ``RuntimeError`` torch's ``stack_module_state`` and tensordict raise."""


def collect_module(module: nn.Module, td_cls) -> Any:
    """The parameters and buffers of ``module`` as nested containers (tied ones once).

    A submodule that holds no tensor of its own (an activation, or one whose
    tensors were all collected under an earlier name) gets no entry, as in
    ``tensordict``: an empty level would only cost every transform a node.
    """
    return _collect(module, td_cls, set(), set())


def _collect(module: nn.Module, td_cls, seen: set, visited: set):
    visited.add(id(module))
    data: dict = {}
    for owner in (module._parameters, module._buffers):
        for name, value in owner.items():
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            data[name] = value
    for name, child in module._modules.items():
        if child is None or id(child) in visited:
            continue
        inner = _collect(child, td_cls, seen, visited)
        if inner._data:
            data[name] = inner
    return td_cls._new_unsafe(data, torch.Size(), None)


class ModuleSwapMixin:
    """``from_module``, ``from_modules`` and ``to_module`` (methods of ``TensorDict``)."""

    __slots__ = ()
    _swap_handle: ClassVar[type]  # what to_module returns: set by tdfunc/_assembly.py

    @classmethod
    def from_module(
        cls, module: nn.Module, as_module: bool = False, lock: bool = False, use_state_dict=False
    ) -> Self:
        """The parameters and buffers of ``module``, nested by submodule (batch ``[]``).

        The leaves are the module's own ``Parameter`` and buffer objects; a tensor
        reachable twice (tied weights, a submodule under two names) appears once,
        under the first name ``module.named_parameters()`` gives it.

        Example:
            >>> model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
            >>> params = TensorDict.from_module(model)
            >>> params["0", "weight"].shape
            torch.Size([4, 3])
        """
        if not isinstance(module, nn.Module):
            raise TypeError(f"from_module: expected an nn.Module, got {type(module).__name__}.")
        if as_module:
            raise NotImplementedError(
                "from_module: as_module=True (TensorDictParams) is not part of tdfunc; wrap the "
                "result in an nn.Module, or use tdfunc.Ensemble."
            )
        if use_state_dict:  # through state_dict(): its hooks apply, as in tensordict
            state = module.state_dict(keep_vars=True)
            out = cls({tuple(name.split(".")): value for name, value in state.items()}, [])
        else:
            out = collect_module(module, cls)
        return out.lock_() if lock else out

    @classmethod
    def from_modules(cls, *modules: nn.Module, lock: bool = True) -> Self:
        """The parameters of several identical modules, stacked along a new dim (``[N]``).

        The stacked leaves are new leaf tensors (they require grad when the
        originals did), ready to be trained as an ensemble. The result is
        locked (no keys added or removed; values can be written in place), as
        in tensordict; ``lock=False`` gives an unlocked one.

        Example:
            >>> models = [nn.Linear(3, 4) for _ in range(5)]
            >>> params = TensorDict.from_modules(*models)
            >>> params["weight"].shape, params.is_locked
            (torch.Size([5, 4, 3]), True)
        """
        if not modules:
            raise ValueError("from_modules: expected at least one module.")
        first = type(modules[0])
        for position, module in enumerate(modules):
            if type(module) is not first:
                raise ModuleClassError(
                    f"from_modules: expected all models to be of the same class; model 0 is "
                    f"{first.__name__} and model {position} is {type(module).__name__}."
                )
        members = [cls.from_module(m) for m in modules]
        with torch.no_grad():
            stacked: Any = torch.stack(members)
        for key in members[0].keys(True, True):
            original = members[0]._get_leaf(key)
            if isinstance(original, torch.Tensor):
                stacked._get_leaf(key).requires_grad_(original.requires_grad)
        return stacked.lock_() if lock else stacked

    def to_module(self, module: nn.Module, *, use_state_dict: bool = False) -> ModuleSwap:
        """Put this TensorDict's tensors into ``module``'s parameter and buffer slots.

        Returns the values the module held before, as a TensorDict with the
        same keys (built only if it is read) that is also a context manager:
        as ``with params.to_module(module):`` the swap lasts for the block and
        is undone exactly on exit (also on exception). Called on its own it
        loads the values for good; ``old.to_module(module)`` puts the previous
        ones back. Keys must name parameters, buffers or submodules of
        ``module``; the module's other entries are left alone. Works inside
        ``vmap``, ``grad`` and ``torch.compile`` in the ``with`` form (a load
        for good cannot outlive a transform: see :class:`ModuleSwap`).

        Example:
            >>> model = nn.Linear(3, 4)
            >>> params = TensorDict.from_module(model).apply(torch.zeros_like)
            >>> with params.to_module(model):
            ...     model(torch.ones(1, 3)).abs().sum().item()
            0.0
            >>> old = params.to_module(model)
            >>> old["weight"].abs().sum().item() > 0, model.weight.abs().sum().item()
            (True, 0.0)

        With ``use_state_dict=True`` the values are loaded for good through
        ``module.load_state_dict`` (``strict=False``: only these keys; the
        module's state-dict hooks run, values are copied into the existing
        tensors) and the previous values are returned as a TensorDict of
        copies. This form cannot be undone by ``with`` and raises inside
        ``vmap``/``grad``.
        """
        if use_state_dict:
            return load_through_state_dict(self, module)
        # TensorDict slot; TensorClass property (its TensorDict's dict)
        if not _is_compiling():  # (dynamo never reads the module swapped last)
            entry = _LAST  # read once: another thread may swap another module meanwhile
            if entry[0]() is module and module is not None:
                # swap_mapping's common case, one frame less: the module swapped last,
                # its most recent plan
                plan = entry[1][0]
                if plan.tie and plan.stamp == REGISTRATIONS[0]:  # no registration since
                    try:
                        record = plan.swap(self._data, plan)
                    except _MISMATCH:
                        pass
                    else:
                        handle = _new(self._swap_handle)
                        handle._rec = record
                        return handle
        return swap_mapping(self._data, module, self._swap_handle)
