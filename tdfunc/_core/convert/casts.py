"""Moves and casts of every leaf: ``to``, ``cuda``, ``cpu``, ``pin_memory``, ``float``, ...,
and ``share_memory_``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..helpers.attrs import holds_attrs
from ..helpers.device import as_device
from ..helpers.mixin import ContainerMixin
from ..helpers.mixin import is_tensor_collection as _collection
from ..helpers.nontensor import NonTensorData

_Tensor = torch.Tensor
_CLASS_DEFAULT: Any = object()  # cast_filter not given: the TensorClass's own, if any

if TYPE_CHECKING:
    from typing_extensions import Self


class CastsMixin(ContainerMixin):
    """Device moves, dtype casts and shared memory (methods of ``TensorDict``)."""

    __slots__ = ()

    def to(self, *args, inplace: bool = False, **kwargs) -> Self:
        """Move and/or cast every tensor leaf, like ``Tensor.to``.

        ``cast_filter``, a predicate ``fn(key, value) -> bool`` (``key`` the nested key
        as a tuple of str), selects the tensor leaves a dtype cast applies to; the others
        keep their dtype and still move. It defaults to the ``cast_filter`` of a
        TensorClass that declares one; ``cast_filter=None`` casts every leaf. The dtype
        shorthands (``float()``, ``bfloat16()``, ...) take it too.

        ``td.to(other)`` (or ``to(other=...)``) takes ``other``'s device and dtype: a
        tensor's, or a container's device and the dtype all its tensors share (none
        when they differ); a container of ``TensorAttrs`` (see :meth:`attrs`) casts
        each leaf to its own device and dtype; ``batch_size=`` gives the result that batch size;
        ``inplace=True`` replaces this container's leaves and returns it.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "i": torch.zeros(2, dtype=torch.long)}, [2])
            >>> td.to(torch.float64)["a"].dtype
            torch.float64
            >>> td.to(torch.float64, cast_filter=is_inexact)["i"].dtype
            torch.int64
        """
        cast_filter = kwargs.pop("cast_filter", _CLASS_DEFAULT)
        if cast_filter is _CLASS_DEFAULT:
            cast_filter = getattr(type(self), "_tc_cast_filter", None)
        elif cast_filter is not None and not callable(cast_filter):
            raise TypeError(
                f"{type(self).__name__}.to: cast_filter must be a function (key, value) -> "
                f"bool or None, got {type(cast_filter).__name__}."
            )
        if cast_filter is not None:
            kwargs["cast_filter"] = cast_filter
        batch_size = kwargs.pop("batch_size", None)
        if batch_size is not None:  # the result gets this batch size (entries must fit it)
            out = self.to(*args, inplace=inplace, **kwargs)
            if out is self and not inplace:
                out = self.clone(False)
            out.batch_size = batch_size
            return out
        other = kwargs.pop("other", None)
        if other is not None:  # tensordict's keyword form of td.to(other)
            args = (other, *args)
        if args and _collection(args[0]) and holds_attrs(args[0]):  # see attrs()
            if len(args) > 1 or set(kwargs) - {"non_blocking"}:
                raise TypeError(
                    f"{type(self).__name__}.to(attrs): a container of TensorAttrs gives each "
                    f"leaf its device and dtype; it takes no other argument but non_blocking."
                )
            kwargs.pop("cast_filter", None)  # each leaf gets its recorded dtype
            return self._to_per_leaf(  # type: ignore[attr-defined]
                args[0], bool(kwargs.get("non_blocking", False)), inplace
            )
        if args and _collection(args[0]):
            other = args[0]
            # the other container's device, and its dtype when all its tensors share one
            moved = [other.device] if other.device is not None else []
            if other.dtype is not None:
                moved.append(other.dtype)
            args = (*moved, *args[1:])
            if not moved:
                return self
        cast_filter = kwargs.pop("cast_filter", None)
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is None and dtype is None:
            return self
        kept = set() if dtype is None or cast_filter is None else _kept(self, cast_filter)

        def convert(tensor: torch.Tensor) -> torch.Tensor:
            cast = None if id(tensor) in kept else dtype
            return tensor.to(device=device, dtype=cast, non_blocking=non_blocking)

        if inplace:
            if self._is_locked:  # a leaf that would change is replaced: structural
                for key, leaf in self.items(True, True):
                    cast = None if id(leaf) in kept else dtype
                    if isinstance(leaf, _Tensor) and _changed_by_to(leaf, device, cast):
                        self._check_writable("to", key)
            self._replace_leaves(convert)
            if device is not None:
                self._set_device(device)
            return self
        if dtype is None and self.is_consolidated():  # type: ignore[attr-defined]
            return self._moved_consolidated(device, non_blocking)  # type: ignore[attr-defined]
        out = self._apply_tree(convert, (), None, None, False, check=False)
        if device is not None:
            out._set_device(device)
        return out

    def _set_device(self, device) -> None:
        self._device = None if device is None else as_device(device)  # type: ignore[misc]
        data = self._data
        for key, value in data.items():
            if isinstance(value, NonTensorData):
                # a copy: the leaf object may be shared with the source container
                data[key] = moved = value._with(value.batch_size)
                moved.device = self._device
            elif _collection(value):
                value._to_tensordict_view()._set_device(device)

    def clear_device_(self) -> Self:
        """Set the device of this container and its nested ones to ``None`` (the leaves
        stay where they are); entries may then be written on any device. Returns self.

        Example:
            >>> td = TensorDict(a=torch.zeros(3), batch_size=[3], device="cpu").clear_device_()
            >>> print(td.device)
            None
        """
        self._check_mutable("clear_device_")
        self._set_device(None)
        return self

    def auto_device_(self) -> Self:
        """Set the device to the one every tensor leaf is on (``None`` when they are on
        several, or there is none), for the nested containers too. Returns self.

        Example:
            >>> TensorDict(a=torch.zeros(3), batch_size=[3]).auto_device_().device
            device(type='cpu')
        """
        self._check_mutable("auto_device_")
        devices = {
            leaf.device
            for _, leaf in self.items(include_nested=True, leaves_only=True)  # type: ignore[attr-defined]
            if isinstance(leaf, torch.Tensor)
        }
        self._set_device(devices.pop() if len(devices) == 1 else None)
        return self

    def cpu(self) -> Self:
        return self.to("cpu")

    def pin_memory(self, num_threads: int | None = None, inplace: bool = False) -> Self:
        """Every tensor copied into page-locked host memory, as ``Tensor.pin_memory``.

        Pinned tensors copy to an accelerator asynchronously
        (``td.pin_memory().to("cuda", non_blocking=True)``). Needs an accelerator
        runtime, as torch does. ``num_threads`` is accepted for tensordict's
        signature; the leaves are pinned one after the other.

        Example:
            >>> td = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
            >>> pinned = td.pin_memory() if torch.cuda.is_available() else td
            >>> pinned.batch_size
            torch.Size([3])
        """
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 0):
            raise ValueError(
                f"{type(self).__name__}.pin_memory: num_threads must be a non-negative int "
                f"or None, got {num_threads!r}."
            )

        def pin(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.pin_memory()

        if inplace:
            self._replace_leaves(pin)
            return self
        return self._apply_tree(pin, (), None, None, False, check=False)

    def cuda(self, device=None) -> Self:
        return self.to("cuda" if device is None else device)

    # the dtype shorthands take to()'s cast_filter (default: the TensorClass's own)
    def float(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        return self.to(torch.float32, cast_filter=cast_filter)

    def double(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        return self.to(torch.float64, cast_filter=cast_filter)

    def half(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        return self.to(torch.float16, cast_filter=cast_filter)

    def bfloat16(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        """Every tensor leaf cast to ``torch.bfloat16`` (``cast_filter`` as in :meth:`to`).

        Example:
            >>> td = TensorDict(x=torch.zeros(3), i=torch.zeros(3, dtype=torch.long))
            >>> td.bfloat16(cast_filter=is_inexact)["i"].dtype
            torch.int64
        """
        return self.to(torch.bfloat16, cast_filter=cast_filter)

    def share_memory_(self) -> Self:
        """Move every tensor leaf to shared memory (in place) and lock; returns self.

        As in tensordict, the container is then locked (in-place writes only), and
        its non-tensor leaves are marked shared (``leaf._is_shared``).

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "s": "text"}, [2]).share_memory_()
            >>> td.is_shared(), td.is_locked, td.get("s")._is_shared
            (True, True, True)
        """
        for value in self._tensor_leaves():
            value.share_memory_()
        for _, leaf in self.non_tensor_items(True):  # type: ignore[attr-defined]
            leaf._is_shared = True
        return self.lock_()  # type: ignore[attr-defined]

    def is_shared(self) -> bool:
        """True when every tensor leaf is in shared memory (and there is at least one).

        A container holding only non-tensor data is shared after its ``share_memory_()``.
        """
        from ..helpers.repr import is_shared

        return is_shared(self)

    @property
    def _is_shared(self) -> bool:
        """tensordict's attribute for :meth:`is_shared`."""
        return self.is_shared()

    # last in the class body: these names shadow the builtins for what follows them
    def int(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        """Every tensor leaf cast to ``torch.int32`` (``Tensor.int``; ``cast_filter`` as in
        :meth:`to`)."""
        return self.to(torch.int32, cast_filter=cast_filter)

    def long(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        """Every tensor leaf cast to ``torch.int64`` (``Tensor.long``; ``cast_filter`` as in
        :meth:`to`)."""
        return self.to(torch.int64, cast_filter=cast_filter)

    def bool(self, *, cast_filter: Any = _CLASS_DEFAULT) -> Self:
        """Every tensor leaf cast to ``torch.bool`` (``Tensor.bool``; ``cast_filter`` as in
        :meth:`to`)."""
        return self.to(torch.bool, cast_filter=cast_filter)

    def type(self, dst_type: torch.dtype) -> Self:
        """Every tensor leaf cast to the dtype ``dst_type`` (``Tensor.type(dtype)``).

        Example:
            >>> TensorDict({"a": torch.zeros(2)}, [2]).type(torch.int64)["a"].dtype
            torch.int64
        """
        if not isinstance(dst_type, torch.dtype):
            raise TypeError(
                f"TensorDict.type: expected a torch.dtype (e.g. torch.float64), got "
                f"{dst_type!r}; tensor type names such as 'torch.FloatTensor' are not accepted."
            )
        return self.to(dst_type)


def _kept(self, cast_filter: Callable) -> set:
    """The ids of the tensor leaves ``cast_filter`` keeps out of a dtype cast."""
    decided: dict[int, tuple[bool, tuple]] = {}
    for key, leaf in self.items(True, True):
        if not isinstance(leaf, _Tensor):
            continue
        path = key if isinstance(key, tuple) else (key,)
        cast = bool(cast_filter(path, leaf))
        first = decided.setdefault(id(leaf), (cast, path))
        if first[0] != cast:
            # one tensor object at two keys: it is cast once, or not at all
            raise ValueError(
                f"{type(self).__name__}.to: the same tensor is at {first[1]!r} and {path!r}, "
                f"and cast_filter casts it at one key only; clone one of them first."
            )
    return {ident for ident, (cast, _) in decided.items() if not cast}


def _changed_by_to(tensor: _Tensor, device, dtype) -> bool:
    """Would ``tensor.to(device, dtype)`` give another tensor? (``"cuda"`` is any index.)"""
    if dtype is not None and tensor.dtype != dtype:
        return True
    if device is None:
        return False
    device = torch.device(device)
    return tensor.device.type != device.type or (
        device.index is not None and tensor.device.index != device.index
    )
