"""What a captured step read when it was captured, and whether it still holds.

A CUDA graph replays the kernels it recorded on the memory it recorded: a Python
number (a learning rate) is baked into a kernel's arguments, and a tensor is read
at the address it had. A step that closes over a module or an optimizer is
therefore stale once a parameter is replaced (``load_state_dict(assign=True)``,
``module.to(...)``, assigning a new ``nn.Parameter``), once train/eval changes
which kernels run, or once a hyperparameter is changed: the replay would keep
training with the old values and say nothing. Each watched object keeps a
snapshot of what the capture saw and checks it before every call, so the step
refuses instead.

Tensors that a step reads are compared by identity and address, never by value:
an in-place edit (``lr.fill_(0.01)``, ``load_state_dict`` copying into the same
parameters) is seen by a replay, so it is allowed.
"""

from __future__ import annotations

import operator
import types
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn


def _describe(value: Any) -> Any:
    """What a captured kernel depends on: identity and address for a tensor, else the value.

    A pytree (a learning rate per parameter) is described leaf by leaf: the same dict
    with one tensor swapped for another is a change.
    """
    if type(value) in _PLAIN:  # the common case first: numbers are no pytree
        return ("value", type(value), value)
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value.data_ptr(), value.shape, value.dtype, value.device)
    leaves, spec = pytree.tree_flatten(value)
    if len(leaves) == 1 and leaves[0] is value:
        return ("value", type(value), value)
    return ("tree", spec, tuple(map(_describe, leaves)))


def _same(old: Any, new: Any) -> bool:
    if old[0] != new[0]:
        return False
    if old[0] == "tensor":
        return old == new
    if old[0] == "tree":
        return old[1] == new[1] and len(old[2]) == len(new[2]) and all(map(_same, old[2], new[2]))
    if old[1] is not new[1]:
        return False
    try:
        return bool(old[2] == new[2]) or (old[2] != old[2] and new[2] != new[2])  # NaN is NaN
    except Exception:  # a value without a plain comparison: compare identity
        return old[2] is new[2]


def _shown(described: Any) -> str:
    if described[0] == "tensor":
        return f"a tensor of shape {list(described[3])} at address {described[2]:#x}"
    if described[0] == "tree":
        return f"a pytree of {len(described[2])} leaves"
    shown = repr(described[2])
    return shown if len(shown) <= 60 else shown[:57] + "..."


class _Hyperparameters:
    """The ``hyperparameters`` dict of a functional transformation (``tdfunc.optim``)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self.values = owner.hyperparameters
        self.snapshot = {key: _describe(value) for key, value in self.values.items()}

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        leaves = pytree.tree_leaves(list(self.values.values()))
        return [(f"{self.name}.hyperparameters", t) for t in leaves if isinstance(t, torch.Tensor)]

    def check(self, api: str) -> None:
        values = self.owner.hyperparameters
        if values is not self.values or values.keys() != self.snapshot.keys():
            raise RuntimeError(
                f"{api}: the hyperparameters of {self.name} were replaced after the step was "
                f"captured (keys {sorted(self.snapshot)} -> {sorted(values)}). Capture the "
                f"step again with capture_step."
            )
        for key, old in self.snapshot.items():
            new = _describe(values[key])
            if not _same(old, new):
                _refuse_hyper(api, self.name, key, old, new)


class _ParamGroups:
    """The ``param_groups`` of a ``torch.optim``-style optimizer (everything but the tensors)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name
        self.snapshot = self._read()
        self.state = self._state()

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        found = []
        for index, group in enumerate(self.owner.param_groups):
            found += [(f"{self.name}.param_groups[{index}]", t) for t in group["params"]]
        state = getattr(self.owner, "state", None)
        for per_param in state.values() if isinstance(state, dict) else ():
            if isinstance(per_param, dict):
                found += [
                    (f"{self.name}.state", value)
                    for value in per_param.values()
                    if isinstance(value, torch.Tensor)
                ]
        return found

    def _state(self) -> tuple:
        """Which tensors hold the optimizer's state (``load_state_dict`` puts in others)."""
        state = getattr(self.owner, "state", None)
        if not isinstance(state, dict):
            return ()
        return tuple(
            (id(value), value.data_ptr())
            for per_param in state.values()
            if isinstance(per_param, dict)
            for value in per_param.values()
            if isinstance(value, torch.Tensor)
        )

    def _read(self) -> list:
        groups = self.owner.param_groups
        return [
            {key: _describe(value) for key, value in group.items() if key != "params"}
            | {"params": tuple(map(id, group["params"]))}
            for group in groups
        ]

    def check(self, api: str) -> None:
        now = self._read()
        if len(now) != len(self.snapshot):
            raise RuntimeError(
                f"{api}: {self.name} had {len(self.snapshot)} parameter groups when the step was "
                f"captured and has {len(now)} now. Capture the step again with capture_step."
            )
        for index, (old_group, new_group) in enumerate(zip(self.snapshot, now)):
            if old_group.keys() != new_group.keys() or old_group["params"] != new_group["params"]:
                raise RuntimeError(
                    f"{api}: the parameters or options of {self.name}.param_groups[{index}] "
                    f"changed after the step was captured. Capture the step again."
                )
            for key, old in old_group.items():
                if key != "params" and not _same(old, new_group[key]):
                    _refuse_hyper(
                        api, f"{self.name}.param_groups[{index}]", key, old, new_group[key]
                    )
        if self._state() != self.state:
            raise RuntimeError(
                f"{api}: the state tensors of {self.name} were replaced after the step was "
                f"captured (load_state_dict puts in new ones); the captured step would keep "
                f"updating the old ones. Capture the step again."
            )


def _refuse_hyper(api: str, owner: str, key: str, old: Any, new: Any) -> None:
    raise RuntimeError(
        f"{api}: hyperparameter {key!r} of {owner} changed after the step was captured "
        f"(captured {_shown(old)}, now {_shown(new)}). A captured step bakes Python numbers "
        f"and tensor addresses into its kernels, so the change would be ignored. Give the "
        f"hyperparameter as a tensor and change it in place (lr.fill_(0.01)), or capture the "
        f"step again with capture_step."
    )


class _Module:
    """Every parameter and buffer slot of a module tree, every train/eval flag, and every
    plain attribute (``Dropout.p``, an ensemble's ``in_dims``) that shapes what runs."""

    def __init__(self, module: nn.Module, name: str) -> None:
        self.name = name
        slots, owners, settings = [], [], []
        for prefix, sub in _modules_of(module):
            for owner in (sub._parameters, sub._buffers):
                owners.append((owner, len(owner), prefix))
                for key, tensor in owner.items():
                    path = f"{prefix}.{key}" if prefix else key
                    pointer = tensor.data_ptr() if tensor is not None else None
                    slots.append((owner, key, tensor, pointer, path))
            state = vars(sub)
            plain = tuple((key, value) for key, value in state.items() if _is_plain(value))
            settings.append((state, plain, prefix))
        self.slots, self.owners, self.settings = slots, owners, settings
        self.held = tuple(slot[2] for slot in slots)
        self.pointers = tuple(slot[3] for slot in slots)
        self.counts = tuple(count for _, count, _ in owners)
        self.values = tuple(value for _, plain, _ in settings for _, value in plain)

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [
            (f"{self.name}.{path}", tensor)
            for _, _, tensor, _, path in self.slots
            if tensor is not None
        ]

    def check(self, api: str) -> None:
        # one pass over flat tuples; the slow pass below finds and names what changed
        tensors = tuple([owner.get(key) for owner, key, *_ in self.slots])
        if (
            all(map(operator.is_, tensors, self.held))
            and tuple([t.data_ptr() if t is not None else None for t in tensors]) == self.pointers
            and tuple([len(owner) for owner, _, _ in self.owners]) == self.counts
            and tuple(
                [state.get(key, _MISSING) for state, plain, _ in self.settings for key, _ in plain]
            )
            == self.values
        ):
            return
        self._explain(api)

    def _explain(self, api: str) -> None:
        for owner, key, tensor, pointer, path in self.slots:
            now = owner.get(key)
            if now is not tensor or (tensor is not None and tensor.data_ptr() != pointer):
                moved = now is tensor
                raise RuntimeError(
                    f"{api}: {self.name}'s tensor {path!r} was "
                    f"{'moved to other memory' if moved else 'replaced'} after the step was "
                    f"captured; the captured step would keep reading and training the old one. "
                    f"Copy new values in place (module.load_state_dict(state) without "
                    f"assign=True, or tensor.copy_(new)), or capture the step again."
                )
        for owner, count, prefix in self.owners:
            if len(owner) != count:
                raise RuntimeError(
                    f"{api}: a parameter or buffer was added to or removed from "
                    f"{self._where(prefix)} after the step was captured. Capture the step again."
                )
        for state, plain, prefix in self.settings:
            for key, value in plain:
                now = state.get(key, _MISSING)
                if now is value or (type(now) is type(value) and now == value):
                    continue
                if key == "training":
                    raise RuntimeError(
                        f"{api}: {self._where(prefix)} was in {'train' if value else 'eval'} "
                        f"mode when the step was captured and is in "
                        f"{'train' if now else 'eval'} mode now; the captured step keeps the "
                        f"kernels of the old mode. Capture one step per mode."
                    )
                raise RuntimeError(
                    f"{api}: {self._where(prefix)}.{key.lstrip('_')} was {value!r} when the step "
                    f"was captured and is {_brief(now)} now; the captured step keeps what the "
                    f"old setting ran. Capture the step again."
                )

    def _where(self, prefix: str) -> str:
        return f"{self.name}.{prefix}" if prefix else self.name


def _modules_of(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The module tree, and the modules held outside it as plain attributes (an
    ensemble's template, whose code and settings every member runs)."""
    found, seen = [], set()
    pending = [("", module)]
    while pending:
        prefix, top = pending.pop()
        for name, sub in top.named_modules(prefix=prefix, remove_duplicate=False):
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            found.append((name, sub))
            for key, value in vars(sub).items():
                if isinstance(value, nn.Module) and id(value) not in seen:
                    pending.append(
                        (f"{name}.{key.lstrip('_')}" if name else key.lstrip("_"), value)
                    )
    return found


_MISSING = object()
_PLAIN = (bool, int, float, str, type(None))


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return (
        isinstance(value, tuple) and len(value) <= 8 and all(isinstance(v, _PLAIN) for v in value)
    )


def _brief(value: Any) -> str:
    if value is _MISSING:
        return "gone"
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def watchers(objects: Iterable[tuple[str, Any]]) -> list:
    """One watcher per module and optimizer among ``objects`` (name, object), each once."""
    found: list = []
    seen: set[int] = set()

    def add(name: str, value: Any) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, nn.Module):
            found.append(_Module(value, name))
        elif isinstance(getattr(value, "hyperparameters", None), dict):
            found.append(_Hyperparameters(value, name))
        elif isinstance(getattr(value, "param_groups", None), list):
            found.append(_ParamGroups(value, name))
        transforms = getattr(value, "transforms", None)
        if isinstance(transforms, tuple) and not isinstance(value, nn.Module):
            for index, inner in enumerate(transforms):  # a chain of transformations
                add(f"{name}.transforms[{index}]", inner)

    for name, value in objects:
        add(name, value)
    return found


class Untouched:
    """The tensors of the watched objects outside the carry, checked after the warm-up.

    The warm-up runs real steps and undoes their effect on the carry only. A step that
    writes a tensor outside its carry (a buffer updated in place, a ``torch.optim``
    optimizer's state) would start from the warm-up's values, not the caller's: that is
    refused, by the tensors' version counters (no copy is kept).
    """

    def __init__(self, watched: list, carry: list) -> None:
        inside = {id(leaf) for leaf in carry}
        self.tensors = [
            (name, tensor, tensor._version)
            for watcher in watched
            for name, tensor in watcher.tensors()
            if id(tensor) not in inside
        ]
        self.states = [(w, w._state()) for w in watched if isinstance(w, _ParamGroups)]

    def check(self, api: str) -> None:
        for watcher, state in self.states:
            if watcher._state() != state:
                _refuse_outside(api, f"the state of {watcher.name}")
        for name, tensor, version in self.tensors:
            if tensor._version != version:
                _refuse_outside(api, f"a tensor of {name}")


def _refuse_outside(api: str, what: str) -> None:
    raise RuntimeError(
        f"{api}: the warm-up steps changed {what}, which is not in the carry; a captured step "
        f"undoes its warm-up on the carry only, so the first call would start from the "
        f"warm-up's values. Carry everything the step updates (the parameters, the optimizer "
        f"state of a tdfunc.optim transformation, buffers the step writes) and return it in "
        f"the new carry."
    )


class Bindings:
    """The values a step reads through names (globals, closure cells, attributes and
    entries of plain objects), by identity: a Python number read there is baked into a
    recorded kernel, and a module or tensor read there is the one recorded."""

    def __init__(self, bindings: list) -> None:
        self.slots = bindings

    def check(self, api: str) -> None:
        for name, holder, key, value in self.slots:
            now = _read(holder, key)
            if now is value or (_is_plain(value) and type(now) is type(value) and now == value):
                continue
            raise RuntimeError(
                f"{api}: {name!r}, which the step reads, was {_brief_object(value)} when the "
                f"step was captured and is {_brief_object(now)} now; the captured step keeps "
                f"what the old value ran. Pass a value that changes as an input (a tensor), "
                f"change a tensor in place, or capture the step again."
            )


def _read(holder: Any, key: Any) -> Any:
    if isinstance(holder, types.CellType):
        try:
            return holder.cell_contents
        except ValueError:
            return _MISSING
    if isinstance(holder, list):
        return holder[key] if key < len(holder) else _MISSING
    return holder.get(key, _MISSING)


def _brief_object(value: Any) -> str:
    if value is _MISSING or _is_plain(value):
        return _brief(value)
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} at {hex(id(value))}"
    return f"a {type(value).__name__} at {hex(id(value))}"
