"""How an ``Ensemble`` holds its members: the stacked modules and the flat leaf layout.

- ``_Stacked``: one level of stacked parameters, named (and indexable) like the
  template's module at that level;
- ``_register``: mirrors the stacked TensorDict as ``_Stacked`` modules and returns
  the *layout* (nested tuples of ``(key, owner dict, child layout)``);
- ``_slots`` / ``_leaf_names`` / ``_slot_index``: the flat leaf positions the
  batched plan indexes; ``_leaves_of`` / ``_rebuild``: leaves to and from TensorDicts;
- fresh copies for ``num_members`` and the ``meta`` template.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._assembly import TensorDict
from .._modules.slots import iter_slots
from .shared import declare_shared, is_shared, replaced

_SCALAR = torch.Size([])


class _Pinned(tuple):
    """A tuple that pytree functions treat as a leaf (a class they do not know).

    The layout and the slots hold the ``_parameters`` and ``_buffers`` dicts of
    the ``stacked`` modules. Tools that snapshot a module's attributes with
    ``tree_map`` and write the snapshot back (``torch.export`` does, around
    its trace) would copy plain tuples and dicts, and the ensemble would then
    read the tensors of the trace instead of its own.
    """

    __slots__ = ()


class _Stacked(nn.Module):
    """One level of stacked parameters, named like the template's module at that level.

    Indexable like the template's container at that level (``ens.stacked[0]``
    for a ``Sequential`` or ``ModuleList``, ``ens.stacked["name"]`` for a
    ``ModuleDict``).
    """

    _children_names: tuple = ()
    # A weak reference to the owning ensemble's cache of derived leaves (or None).
    _derived_ref: Callable | None = None

    def _drop_derived(self) -> None:
        # The cache's derived leaves (weight.mT, ...) are views that hold each
        # parameter: with swap-on-conversion (torch.__future__, or a tensor subclass
        # such as DTensor) torch refuses to swap a tensor that another one holds, and
        # without it the entry would be rebuilt on the next call anyway. Conversions
        # and loads of any level (ens.stacked[0].double()) drop them first.
        cache = self._derived_ref() if self._derived_ref is not None else None
        if cache is not None:
            cache.clear()

    def _apply(self, fn, recurse: bool = True):
        self._drop_derived()
        shared = self._shared_names()
        out = super()._apply(fn, recurse)
        self._mark_shared(shared)  # a swap gave each tensor the new one's attributes
        return out

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._drop_derived()  # a load swaps the tensors too, with swap-on-conversion
        shared = self._shared_names()
        super()._load_from_state_dict(*args, **kwargs)
        self._mark_shared(shared)

    def _shared_names(self) -> tuple:
        """The names of this level's tensors kept shared (no member dim)."""
        entries = {**self._parameters, **self._buffers}
        return tuple(
            name for name, value in entries.items() if value is not None and is_shared(value)
        )

    def _mark_shared(self, names: tuple) -> None:
        if names:
            entries = {**self._parameters, **self._buffers}
            declare_shared([entries[name] for name in names if entries.get(name) is not None])

    def __setattr__(self, name: str, value: Any) -> None:
        # load_state_dict(assign=True) sets each entry as an attribute: a tensor that
        # replaces a shared one is shared too (optimizers ask, see shared.py)
        state = self.__dict__
        old = None
        if "_parameters" in state:
            old = state["_parameters"].get(name)
            if old is None:
                old = state["_buffers"].get(name)
        super().__setattr__(name, value)
        if old is not None:
            replaced(old, value)

    def __getstate__(self) -> dict:
        # a copy (deepcopy, pickle) gets new tensors: it re-declares its shared ones by name
        state = dict(super().__getstate__())
        state.pop("_derived_ref", None)  # a copy is bound to its own ensemble's cache
        state["_shared_entries"] = self._shared_names()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        names = state.pop("_shared_entries", ())
        super().__setstate__(state)
        self._mark_shared(names)

    def __getitem__(self, index: int | str) -> nn.Module:
        names = self._children_names
        if isinstance(index, str):
            name = index
        elif isinstance(index, int) and not isinstance(index, bool):
            if not -len(names) <= index < len(names):
                raise IndexError(
                    f"Ensemble.stacked: index {index} is out of range for a level with "
                    f"{len(names)} submodules."
                )
            name = names[index]
        else:
            raise TypeError(
                f"Ensemble.stacked: index with an int (Sequential, ModuleList) or a name "
                f"(ModuleDict), got {type(index).__name__}."
            )
        child = self._modules.get(name)
        if child is None:
            if name in names:
                raise KeyError(
                    f"Ensemble.stacked: submodule {index!r} has no parameters or buffers, so "
                    f"it has no stacked level (it is the same for every member)."
                )
            raise KeyError(f"Ensemble.stacked: no submodule {index!r}; submodules: {list(names)}.")
        return child

    def extra_repr(self) -> str:
        shapes = [
            f"{name}: {tuple(p.shape)}" for name, p in self._parameters.items() if p is not None
        ]
        shapes += [
            f"{name}: {tuple(b.shape)} (buffer)"
            for name, b in self._buffers.items()
            if b is not None
        ]
        return ", ".join(shapes)


def bind_cache(stacked: nn.Module, cache: Any) -> None:
    """Let every level of ``stacked`` clear ``cache`` before a conversion (``_apply``)."""
    ref = weakref.ref(cache)
    for module in stacked.modules():
        if isinstance(module, _Stacked):
            object.__setattr__(module, "_derived_ref", ref)


def _reset_parameters(model: nn.Module, shared: frozenset = frozenset()) -> None:
    """Re-initialise ``model`` in place with its submodules' ``reset_parameters``.

    Raises ``ValueError`` when some parameter is owned by a module that has no
    ``reset_parameters`` (the copies would silently all start the same).
    """
    uncovered = []
    for prefix, module in model.named_modules(remove_duplicate=True):
        reset = getattr(module, "reset_parameters", None) or getattr(
            module, "_reset_parameters", None
        )
        if callable(reset):
            reset()
        else:
            uncovered += [
                f"{prefix}.{name}" if prefix else name
                for name, value in module._parameters.items()
                if value is not None and (f"{prefix}.{name}" if prefix else name) not in shared
            ]
    if uncovered:
        raise ValueError(
            f"Ensemble: cannot make independent initialisations: the parameters {uncovered} "
            f"belong to modules without a reset_parameters() method, so every member would "
            f"start from the same values. Pass init=fn (a function that re-initialises a "
            f"module in place), or pass N models: Ensemble(*[make_model() for _ in range(n)])."
        )


def _fresh_copies(
    model: nn.Module, num_members: int, init: Callable | None, shared: Sequence[str]
) -> list:
    shared = frozenset([shared] if isinstance(shared, str) else shared)
    copies = []
    for _ in range(num_members):
        member = copy.deepcopy(model)
        with torch.no_grad():
            if init is None:
                _reset_parameters(member, shared)
            else:
                init(member)
            for name in shared:  # kept as the given model holds it
                tensor = _tensor_at(model, name)
                if tensor is not None:
                    _tensor_at(member, name).copy_(tensor)
        copies.append(member)
    return copies


def _tensor_at(module: nn.Module, name: str) -> Any:
    prefix, _, leaf = name.rpartition(".")
    try:
        owner = module.get_submodule(prefix)
    except AttributeError:
        return None
    found = owner._parameters.get(leaf)
    return owner._buffers.get(leaf) if found is None else found


def _to_meta(module: nn.Module) -> nn.Module:
    """Move ``module``'s tensors to ``meta`` in place, keeping tied tensors tied.

    (``module.to("meta")`` converts a tied parameter once per slot, untying it.)
    """
    converted: dict[int, Any] = {}
    for slot in list(iter_slots(module, remove_duplicate=True)):
        value = slot.value
        if value is None:
            continue
        new = converted.get(id(value))
        if new is None:
            new = value.detach().to("meta")
            if isinstance(value, nn.Parameter):
                new = nn.Parameter(new, requires_grad=value.requires_grad)
            converted[id(value)] = new
        slot.owner[slot.name] = new
    return module


def _named_slots(module: nn.Module):
    for slot in iter_slots(module):
        yield slot.path, slot.value


def _register(
    stacked: TensorDict, template: nn.Module, path: tuple, shared: frozenset = frozenset()
) -> tuple[nn.Module, tuple]:
    """Mirror ``stacked`` as a tree of ``_Stacked`` modules; return it and its layout.

    A layout entry is ``(key, owner_dict, None)`` for a leaf (read as
    ``owner_dict[key]``) or ``(key, None, child_layout)`` for a nested level.
    A leaf named in ``shared`` is registered once (member 0's value), unstacked.
    """
    holder = _Stacked()
    holder._children_names = tuple(template._modules)
    layout: list[tuple[str, Any, Any]] = []
    for key, value in stacked._data.items():
        if isinstance(value, TensorDict):
            child_module: Any = template._modules[key]
            child, child_layout = _register(value, child_module, path + (key,), shared)
            if not child_layout:
                continue  # a module without tensors (an activation): no level to swap
            holder.add_module(key, child)
            layout.append((key, None, child_layout))
        elif isinstance(value, torch.Tensor):
            if ".".join(path + (key,)) in shared:
                value = value[0].clone()
            if key in template._parameters:
                original: Any = template._parameters[key]
                holder.register_parameter(
                    key, nn.Parameter(value.detach(), requires_grad=original.requires_grad)
                )
                layout.append((key, holder._parameters, None))
            else:
                persistent = key not in template._non_persistent_buffers_set
                holder.register_buffer(key, value.detach(), persistent=persistent)
                layout.append((key, holder._buffers, None))
        else:
            raise TypeError(
                f"Ensemble: expected tensors and submodules only, found "
                f"{type(value).__name__} at key {path + (key,)!r}."
            )
    return holder, tuple(layout)


def _store_linear_weights_transposed(layout: tuple, template: nn.Module, keep: set) -> None:
    """Give every stacked ``nn.Linear`` weight ``[N, in, out]`` memory, seen as ``[N, out, in]``.

    The batched ``Linear`` multiplies by ``weight.mT``; on this memory that view
    is contiguous, which ``baddbmm`` runs up to 1.7x faster on CPU than the
    transpose of a contiguous ``[N, out, in]`` weight (docs/internals.md). The
    shapes users see do not change; a dense leaf's gradient takes its strides.
    A weight tied to anything but a ``Linear`` weight (an embedding table) keeps
    the contiguous layout its other users expect; ``keep``: positions left as
    they are (tensors kept shared).
    """
    index = _slot_index(layout, template)
    users: dict[int, list] = {}
    for slot in iter_slots(template):
        if slot.value is not None:
            users.setdefault(index[(id(slot.module), slot.name)], []).append(slot)
    for position, (owner, key) in enumerate(_slots(layout)):
        value = owner[key]
        if (
            position in keep
            or not isinstance(value, nn.Parameter)
            or value.dim() != 3
            or not all(
                isinstance(slot.module, nn.Linear) and slot.name == "weight"
                for slot in users.get(position, ())
            )
        ):
            continue
        stored = value.detach().mT.contiguous().mT
        owner[key] = nn.Parameter(stored, requires_grad=value.requires_grad)


def _slots(layout: tuple) -> list:
    """The (owner dict, key) of every leaf, in layout order."""
    out = []
    for key, owner, child in layout:
        if child is None:
            out.append((owner, key))
        else:
            out += _slots(child)
    return out


def _slot_index(layout: tuple, template: nn.Module) -> dict:
    """``(id(module), name) -> leaf position`` for every tensor slot of ``template``
    (a tied tensor's slots all point to its one leaf)."""
    positions: dict[str, int] = {}

    def walk(layout: tuple, prefix: str) -> None:
        for key, _, child in layout:
            if child is None:
                positions[prefix + key] = len(positions)
            else:
                walk(child, f"{prefix}{key}.")

    walk(layout, "")
    index, by_identity, pending = {}, {}, []
    for path, module, _, name, value, _ in iter_slots(template):
        if value is None:
            continue
        position = positions.get(path)
        if position is None:
            pending.append((module, name, value))
        else:
            index[(id(module), name)] = position
            by_identity[id(value)] = position
    for module, name, value in pending:
        index[(id(module), name)] = by_identity[id(value)]
    return index


def _leaves_of(layout: tuple, td: TensorDict, out: list, path: tuple) -> list:
    """The leaves of ``td`` in layout order; ``td`` must have the layout's keys."""
    data = td._to_tensordict_view()._data
    if len(data) != len(layout):
        expected = sorted(key for key, _, _ in layout)
        raise KeyError(
            f"Ensemble: the parameters at {path!r} must have the keys {expected}, got "
            f"{sorted(data)}. Pass a TensorDict shaped like ensemble.params."
        )
    for key, _, child in layout:
        value = data.get(key)
        if value is None:
            raise KeyError(
                f"Ensemble: the parameters have no key {path + (key,)!r}. Pass a TensorDict "
                f"shaped like ensemble.params."
            )
        if child is None:
            out.append(value)
        else:
            _leaves_of(child, value, out, path + (key,))
    return out


def _rebuild(layout: tuple, leaves, position: list, batch_size: torch.Size = _SCALAR) -> TensorDict:
    """A TensorDict of ``leaves`` in the layout's structure."""
    data = {}
    for key, _, child in layout:
        if child is None:
            data[key] = leaves[position[0]]
            position[0] += 1
        else:
            data[key] = _rebuild(child, leaves, position, batch_size)
    return TensorDict._new_unsafe(data, batch_size)


def _leaf_names(layout: tuple, prefix: str = "") -> list:
    """``(dotted name, owner dict, key)`` of every leaf, in layout order."""
    out = []
    for key, owner, child in layout:
        if child is None:
            out.append((prefix + key, owner, key))
        else:
            out += _leaf_names(child, f"{prefix}{key}.")
    return out
