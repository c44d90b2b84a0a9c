"""Parameters in and out of ``nn.Module``: ``from_module``, ``from_modules``, ``to_module``.

``to_module`` sits on the hot path of every ensemble and meta-learning step, so
it runs a *swap plan* built once per (module, key structure): for each leaf of
the TensorDict, the module slots (an owner ``_parameters``/``_buffers`` dict
and a name) it goes into. Tied weights and modules reachable under two paths
are slots of the same object, found once when the plan is built. Entering and
leaving are then tight loops of dict assignments; no ``nn.Parameter`` is ever
constructed on that path (it would break ``torch.compile`` of ``vmap(grad)``).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch._C import _functorch

from ._keys import missing_key_error
from ._nontensor import NonTensorData

# Plans per module, weakly keyed: id(module) -> (weak reference, plans). A plain
# dict probed by id is several times cheaper than a WeakKeyDictionary lookup, and
# the weak reference's callback drops the entry when the module dies.
_PLANS: dict[int, tuple[weakref.ref, list]] = {}


def _plans_of(module: nn.Module) -> list | None:
    entry = _PLANS.get(id(module))
    if entry is not None and entry[0]() is module:
        return entry[1]
    return None


def _plans_for_new(module: nn.Module) -> list:
    key = id(module)
    plans: list = []
    _PLANS[key] = (weakref.ref(module, lambda _ref, key=key: _PLANS.pop(key, None)), plans)
    return plans


def _collection(value: Any) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


class _Mismatch(Exception):
    """The cached plan does not fit this TensorDict's keys."""


class SwapPlan:
    """Where each leaf of one key structure goes in one module.

    The nested description (``leaves``, ``nodes``, ``size``) is compiled once
    into ``run(data, saved)``: straight-line code with one dict lookup per
    TensorDict level and one assignment per slot, the same work as writing the
    assignments by hand. It raises ``_Mismatch`` (or ``KeyError``) when the
    TensorDict's keys do not have the structure the plan was built for.
    """

    __slots__ = ("leaves", "nodes", "run", "size")

    def __init__(self, leaves: list, nodes: list, size: int) -> None:
        self.leaves = leaves  # [(key, ((owner dict, name), ...)), ...]
        self.nodes = nodes  # [(key, SwapPlan), ...] for nested TensorDicts
        self.size = size  # number of keys the TensorDict level must have
        self.run = None

    def compile(self, tensordict_cls: type) -> None:
        lines = ["def run(data, saved):", "    append = saved.append"]
        constants: dict[str, Any] = {"Mismatch": _Mismatch, "TD": tensordict_cls}
        self._emit(lines, constants, "data", [0])
        namespace: dict[str, Any] = {}
        exec(compile("\n".join(lines), "<tdfunc swap plan>", "exec"), constants, namespace)
        self.run = namespace["run"]

    def _emit(self, lines: list, constants: dict, var: str, counter: list) -> None:
        lines.append(f"    if len({var}) != {self.size}: raise Mismatch")
        for key, slots in self.leaves:
            if not slots:
                continue
            value = f"v{counter[0]}"
            counter[0] += 1
            lines.append(f"    {value} = {var}[{key!r}]")
            for owner, name in slots:
                owner_name = f"o{len(constants)}"
                constants[owner_name] = owner
                lines.append(f"    append(({owner_name}, {name!r}, {owner_name}[{name!r}]))")
                lines.append(f"    {owner_name}[{name!r}] = {value}")
        for key, plan in self.nodes:
            inner = f"n{counter[0]}"
            counter[0] += 1
            lines.append(f"    {inner} = {var}[{key!r}]")
            lines.append(
                f"    {inner} = {inner}._data if type({inner}) is TD "
                f"else {inner}._to_tensordict_view()._data"
            )
            plan._emit(lines, constants, inner, counter)


_TD_TYPE: list = [None]  # the TensorDict class, set on first use (no import cycle)


def _slot_aliases(root: nn.Module) -> dict[int, list]:
    """For every tensor in ``root``: all (owner dict, name) slots that hold it."""
    aliases: dict[int, list] = {}
    seen: set = set()
    for module in root.modules():
        for owner in (module._parameters, module._buffers):
            if id(owner) in seen:
                continue
            seen.add(id(owner))
            for name, value in owner.items():
                if value is not None:
                    aliases.setdefault(id(value), []).append((owner, name))
    return aliases


def _build_plan(data: dict, module: nn.Module, aliases: dict, path: tuple) -> SwapPlan:
    leaves = []
    nodes = []
    size = 0
    for key, value in data.items():
        size += 1
        if _collection(value):
            child = module._modules.get(key)
            if child is None:
                raise _no_such_key(path + (key,), module, "submodule")
            nodes.append(
                (key, _build_plan(value._to_tensordict_view()._data, child, aliases, path + (key,)))
            )
            continue
        if isinstance(value, NonTensorData):
            leaves.append((key, ()))
            continue
        if key in module._parameters:
            owner = module._parameters
        elif key in module._buffers:
            owner = module._buffers
        else:
            raise _no_such_key(path + (key,), module, "parameter or buffer")
        current = owner[key]
        slots = aliases.get(id(current), [(owner, key)]) if current is not None else [(owner, key)]
        leaves.append((key, tuple(slots)))
    return SwapPlan(leaves, nodes, size)


def _no_such_key(path: tuple, module: nn.Module, what: str) -> KeyError:
    names = list(module._parameters) + list(module._buffers) + list(module._modules)
    where = f" in {type(module).__name__}"
    error = missing_key_error(path[-1], names, where)
    return KeyError(
        f"to_module: the TensorDict has key {path!r} but the module has no {what} "
        f"{path[-1]!r}.{str(error.args[0]).split('.', 1)[1]}"
    )


def _new_plan(data: dict, module: nn.Module) -> SwapPlan:
    """Find a cached plan that fits ``data``'s keys, or build and cache one."""
    plans = _plans_of(module)
    if plans is None:
        plans = _plans_for_new(module)
    for plan in plans:
        if _fits(plan, data):
            plans.remove(plan)
            plans.insert(0, plan)
            return plan
    plan = _build_plan(data, module, _slot_aliases(module), ())
    plans.insert(0, plan)
    del plans[4:]  # a module rarely sees more than one or two key structures
    return plan


def _fits(plan: SwapPlan, data: dict) -> bool:
    if len(data) != plan.size:
        return False
    for key, _ in plan.leaves:
        if key not in data:
            return False
    for key, sub in plan.nodes:
        inner = data.get(key)
        if inner is None or not _collection(inner):
            return False
        if not _fits(sub, inner._to_tensordict_view()._data):
            return False
    return True


class ModuleSwap:
    """The swap performed by ``td.to_module(module)``; a context manager that undoes it.

    Used with ``with``, the module holds the TensorDict's tensors for the block
    and gets exactly its previous objects back on exit (also on exception).
    Without ``with``, the values stay: when this handle is dropped, plain
    tensors put in ``Parameter`` slots become ``Parameter``s sharing their
    storage, so the module is a normal module again.
    """

    __slots__ = ("_saved", "_state")

    def __init__(self, saved: list) -> None:
        self._saved = saved
        self._state = 0  # 0: swapped, 1: inside a with block, 2: restored or committed

    def __enter__(self) -> ModuleSwap:
        self._state = 1
        return self

    def __exit__(self, *exc_info) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back the objects the module held before the swap."""
        saved = self._saved
        for owner, name, old in reversed(saved):
            owner[name] = old
        self._state = 2

    def commit(self) -> None:
        """Keep the swapped values for good, as registered ``Parameter``s."""
        if self._state == 2:
            return
        self._state = 2
        made: dict[int, nn.Parameter] = {}
        for owner, name, old in self._saved:
            value = owner[name]
            if not isinstance(old, nn.Parameter) or isinstance(value, nn.Parameter):
                continue
            if _functorch.is_functorch_wrapped_tensor(value):
                continue
            param = made.get(id(value))
            if param is None:
                param = nn.Parameter(value, requires_grad=old.requires_grad)
                made[id(value)] = param
            owner[name] = param

    def __del__(self) -> None:
        # dynamo may create handles without running __init__ while tracing
        if getattr(self, "_state", 2) == 0:
            self.commit()


def _undo(saved: list) -> None:
    for owner, name, old in reversed(saved):
        owner[name] = old
    saved.clear()


def swap_in(td, module: nn.Module) -> ModuleSwap:
    """Run the module's most recent plan; on a key mismatch, find or build the right one."""
    tensordict_cls = _TD_TYPE[0]
    if tensordict_cls is None:
        from ._container import TensorDict as tensordict_cls

        _TD_TYPE[0] = tensordict_cls
    data = td._data if type(td) is tensordict_cls else td._to_tensordict_view()._data
    saved: list = []
    plans = _plans_of(module)
    if plans:
        try:
            plans[0].run(data, saved)
            return ModuleSwap(saved)
        except (_Mismatch, KeyError):
            _undo(saved)
        except BaseException:
            _undo(saved)
            raise
    plan = _new_plan(data, module)
    if plan.run is None:
        plan.compile(tensordict_cls)
    try:
        plan.run(data, saved)
    except BaseException:
        _undo(saved)
        raise
    return ModuleSwap(saved)


def collect_module(module: nn.Module, td_cls) -> Any:
    """The parameters and buffers of ``module`` as nested containers (tied ones once)."""
    seen: set[int] = set()
    return _collect(module, td_cls, seen, set())


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
        data[name] = _collect(child, td_cls, seen, visited)
    return td_cls._new_unsafe(data, torch.Size(), None)


class ModuleSwapMixin:
    """``from_module``, ``from_modules`` and ``to_module`` (methods of ``TensorDict``)."""

    __slots__ = ()

    @classmethod
    def from_module(cls, module: nn.Module, *, lock: bool = False):
        """The parameters and buffers of ``module``, nested by submodule (batch ``[]``).

        The leaves are the module's own ``Parameter`` and buffer objects; a tensor
        reachable twice (tied weights, a submodule under two names) appears once.

        Example:
            >>> model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 4))
            >>> params = TensorDict.from_module(model)
            >>> params["0", "weight"].shape
            torch.Size([4, 3])
        """
        if not isinstance(module, nn.Module):
            raise TypeError(f"from_module: expected an nn.Module, got {type(module).__name__}.")
        out = collect_module(module, cls)
        return out.lock_() if lock else out

    @classmethod
    def from_modules(cls, *modules: nn.Module, lock: bool = False):
        """The parameters of several identical modules, stacked along a new dim (``[N]``).

        The stacked leaves are new leaf tensors (they require grad when the
        originals did), ready to be trained as an ensemble.

        Example:
            >>> models = [nn.Linear(3, 4) for _ in range(5)]
            >>> TensorDict.from_modules(*models)["weight"].shape
            torch.Size([5, 4, 3])
        """
        if not modules:
            raise ValueError("from_modules: expected at least one module.")
        first = type(modules[0])
        for position, module in enumerate(modules):
            if type(module) is not first:
                raise TypeError(
                    f"from_modules: expected all models to be of the same class; model 0 is "
                    f"{first.__name__} and model {position} is {type(module).__name__}."
                )
        members = [cls.from_module(m) for m in modules]
        with torch.no_grad():
            stacked = torch.stack(members)
        for key in members[0].keys(True, True):
            original = members[0]._get_leaf(key)
            if isinstance(original, torch.Tensor):
                stacked._get_leaf(key).requires_grad_(original.requires_grad)
        return stacked.lock_() if lock else stacked

    def to_module(self, module: nn.Module) -> ModuleSwap:
        """Put this TensorDict's tensors into ``module``'s parameter and buffer slots.

        As a context manager the swap lasts for the block and is undone exactly on
        exit; called on its own it loads the values for good. Works inside
        ``vmap``, ``grad`` and ``torch.compile``.

        Example:
            >>> model = nn.Linear(3, 4)
            >>> params = TensorDict.from_module(model).apply(torch.zeros_like)
            >>> with params.to_module(model):
            ...     model(torch.ones(1, 3)).abs().sum().item()
            0.0
        """
        return swap_in(self, module)
