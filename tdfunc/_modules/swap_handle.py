"""What ``td.to_module(module)`` returns: the module's previous values, as a TensorDict
that is also the context manager putting them back.

As in tensordict, ``old = new.to_module(model)`` loads ``new`` and ``old`` holds
what the module held before: index it, compare it, ``old.to_module(model)`` puts
it back, and ``with new.to_module(model):`` restores it on exit. The ``with``
form is the hot path of every ensemble step, so the swap only records the old
objects (a list, in the order of the plan's slots); the TensorDict of old
values is built the first time it is read (``_data`` is a property here).

This module holds the behaviour (:class:`SwapHandle`); the public class,
``ModuleSwap``, is ``SwapHandle`` over the public ``TensorDict``, composed in
``tdfunc/_assembly.py``.

Without ``with`` the load is for good: when the handle is dropped (or shown at
a prompt, or :meth:`ModuleSwap.commit` is called), plain tensors put in
``Parameter`` slots become ``Parameter``s sharing their storage, so the module
is a normal module again. Inside ``vmap``/``grad`` that cannot be honoured:
the values are tied to the transform. A handle dropped while its module holds
such values undoes the swap and makes the module's next forward raise an
error that says to use ``with`` (an exception cannot leave ``__del__``).
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any

import torch

from .._core.container import TensorDictCore
from .._core.helpers.tracing import is_wrapped as _wrapped
from .module_swap import SwapState, _end_as_it_stands
from .swap_plan import SwapPlan

_DATA = TensorDictCore.__dict__["_data"]  # the slot descriptor the property below stands for
_EMPTY = torch.Size()


class _EmptyState:
    """A slot of the container that reads as an empty TensorDict's until written.

    A swap fills in only its record: the handle's container state (batch size
    ``[]``, no device, no names, unlocked) is read through these defaults, so
    the hot path of ``with params.to_module(module):`` stores one attribute.
    """

    __slots__ = ("default", "slot")

    def __init__(self, name: str, default: Any) -> None:
        self.slot = TensorDictCore.__dict__[name]  # the slot descriptor this stands for
        self.default = default

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self
        try:
            return self.slot.__get__(instance, owner)
        except AttributeError:
            return self.default

    def __set__(self, instance: Any, value: Any) -> None:
        self.slot.__set__(instance, value)


# id(module) -> the forward pre-hook handle of a pending error (one per module)
_TRAPS: dict[int, Any] = {}


class SwapHandle(SwapState, TensorDictCore):
    """What a ``ModuleSwap`` does: the previous values of a module, restored on exit.

    The public ``ModuleSwap`` is this class over the public ``TensorDict``. The
    old values are a list in the plan's slot order; the TensorDict of them is
    built when ``_data`` is first read, and results are plain TensorDicts.

    Example:
        >>> issubclass(ModuleSwap, SwapHandle), issubclass(ModuleSwap, TensorDict)
        (True, True)
    """

    # the swap's record, [olds, plan, state, thread id], shared with the stack of swaps
    # in effect (module_swap.py); state: 0 swapped, 1 inside a with block, 2 restored,
    # 3 committed (loaded for good)
    __slots__ = ("_rec",)
    _batch_size = _EmptyState("_batch_size", _EMPTY)  # type: ignore[assignment]
    _device = _EmptyState("_device", None)  # type: ignore[assignment]
    _names = _EmptyState("_names", None)  # type: ignore[assignment]
    _is_locked = _EmptyState("_is_locked", False)  # type: ignore[assignment]

    @property  # type: ignore[override]
    def _data(self) -> dict:
        try:
            return _DATA.__get__(self, type(self))
        except AttributeError:  # not read yet: build it from the old objects
            nested = partial(self._plain_tensordict()._new_unsafe, batch_size=_EMPTY)
            data = self._plan.old_data(self._olds, nested)
            _DATA.__set__(self, data)
            return data

    @_data.setter
    def _data(self, value: dict) -> None:
        _DATA.__set__(self, value)

    # results are plain TensorDicts: only the handle itself restores the module
    @classmethod
    def _new_unsafe(cls, data: dict, batch_size: torch.Size, device=None, names=None):
        return cls._plain_tensordict()._new_unsafe(data, batch_size, device, names)

    _from_pytree = _new_unsafe

    def _like(self, data: dict, batch_size: torch.Size | None = None, names: Any = ...):
        return self._plain_tensordict()._new_unsafe(
            data,
            self._batch_size if batch_size is None else batch_size,
            self._device,
            self._names if names is ... else names,
        )

    def __reduce_ex__(self, protocol: Any) -> tuple:
        new_plain = self._plain_tensordict()._new_unsafe
        return (new_plain, (self._data, self._batch_size, self._device, self._names))

    def _release(self) -> None:
        """The handle of a load without ``with`` goes away: keep the values for good,
        unless they are tied to a transform (then undo it and report at the next forward)."""
        plan = self._plan
        if any(_wrapped(owner.get(name)) for owner, name in zip(plan.owners, plan.names)):
            self.restore()
            _trap(plan)
        else:
            self.commit()

    def __del__(self) -> None:
        try:
            record = self._rec
        except AttributeError:  # a handle whose swap raised before it was filled in
            return
        if record[2] == 0:
            self._release()
        elif record[2] == 1:  # entered and never exited: its swap ends as it stands
            _end_as_it_stands(record)

    def __repr__(self) -> str:
        # A handle shown at a prompt (REPL `_`, IPython `Out`) stays referenced:
        # showing it is the moment the user sees the load as done.
        if self._state == 0:
            self._release()
        return super().__repr__()


def _trap(plan: SwapPlan) -> None:
    """Make the module's next forward raise: a load without ``with`` was undone."""
    module = plan.module() if plan.module is not None else None
    if module is None or id(module) in _TRAPS:
        return
    key = id(module)
    name = type(module).__name__

    def refuse(_module: Any, _args: Any) -> None:
        hook = _TRAPS.pop(key, None)
        if hook is not None:
            hook.remove()
        raise RuntimeError(
            f"to_module: params.to_module({name}) was called without `with` inside a "
            f"torch.func transform (vmap, grad, jacrev, ...). Values that depend on the "
            f"transform cannot stay in the module after it, so the load was undone and "
            f"this forward would have used the module's own parameters. Use "
            f"`with params.to_module(module): ...` inside the transformed function."
        )

    _TRAPS[key] = module.register_forward_pre_hook(refuse)
    weakref.finalize(module, _TRAPS.pop, key, None)
