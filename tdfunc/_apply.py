"""``apply`` and the leaf-wise methods built on it (clone, to, detach, zero_, ...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._nontensor import NonTensorData

_KEEP = object()


def _collection(value: Any) -> bool:
    return getattr(type(value), "_is_tensor_collection", False)


def _others_at(others: tuple, key: str, api: str) -> list:
    values = []
    for position, other in enumerate(others):
        data = other._to_tensordict_view()._data
        if key not in data:
            raise KeyError(
                f"TensorDict.{api}: key {key!r} is missing from the TensorDict passed at "
                f"position {position + 1}; all TensorDicts must have the same keys."
            )
        values.append(data[key])
    return values


class ApplyMixin:
    """Leaf-wise transformation of a container (methods of ``TensorDict``)."""

    __slots__ = ()

    def apply(
        self,
        fn: Callable,
        *others,
        batch_size=None,
        names: Any = _KEEP,
        inplace: bool = False,
        filter_empty: bool = True,
    ):
        """A new container with ``fn`` applied to every tensor leaf.

        ``fn`` receives the leaf of ``self`` and the matching leaves of ``others``
        (containers with the same keys). A leaf for which ``fn`` returns ``None``
        is dropped. Pass ``batch_size`` when ``fn`` changes the batch dims.

        Example:
            >>> td = TensorDict({"a": torch.ones(2), "b": torch.zeros(2, dtype=torch.long)}, [2])
            >>> sorted(td.apply(lambda x: x if x.is_floating_point() else None).keys())
            ['a']
        """
        if inplace:
            return self.apply_(fn, *others)
        new_size = None if batch_size is None else torch.Size(batch_size)
        out = self._apply_tree(fn, others, new_size, None, filter_empty)
        if names is not _KEEP:
            out.names = names
        elif new_size is not None:
            out._names = None
        return out

    def named_apply(self, fn: Callable, *others, nested_keys: bool = False, batch_size=None):
        """Like :meth:`apply`, with the key passed first: ``fn(key, leaf, *other_leaves)``.

        With ``nested_keys=True`` the key is the full tuple path of the leaf.
        """
        new_size = None if batch_size is None else torch.Size(batch_size)
        prefix = () if nested_keys else None
        return self._apply_tree(fn, others, new_size, prefix, True)

    def _apply_tree(self, fn, others, new_size, prefix, filter_empty):
        size = self._batch_size
        ndim = len(size)
        data = {}
        for key, value in self._data.items():
            other_values = _others_at(others, key, "apply") if others else ()
            if isinstance(value, torch.Tensor):
                if prefix is None:
                    result = fn(value, *other_values)
                else:
                    name = prefix + (key,) if prefix else key
                    result = fn(name, value, *other_values)
                if result is None:
                    continue
                expected = size if new_size is None else new_size
                if result.shape[: len(expected)] != expected:
                    raise ValueError(
                        f"TensorDict.apply: the function returned a tensor of shape "
                        f"{list(result.shape)} for key {key!r}, which does not start with the "
                        f"batch size {list(expected)}. Pass batch_size=... to apply when the "
                        f"function changes the batch dims."
                    )
            elif _collection(value):
                inner_size = None if new_size is None else new_size + value.batch_size[ndim:]
                inner_prefix = prefix
                if prefix is not None and prefix != ():
                    inner_prefix = prefix + (key,)
                elif prefix == ():
                    inner_prefix = (key,)
                if hasattr(value, "_apply_tree"):
                    result = value._apply_tree(
                        fn, tuple(other_values), inner_size, inner_prefix, filter_empty
                    )
                else:
                    result = value.apply(fn, *other_values, batch_size=inner_size)
                if filter_empty and not result._data and value._data:
                    continue
            elif isinstance(value, NonTensorData):
                if new_size is not None:
                    value = NonTensorData._make(value.data, new_size, value.device)
                result = value
            else:
                result = value
            data[key] = result
        return self._like(data, new_size)

    def apply_(self, fn: Callable, *others):
        """Apply ``fn`` to every tensor leaf and write the result into it (in place)."""
        for key, value in self._data.items():
            other_values = _others_at(others, key, "apply_") if others else ()
            if isinstance(value, torch.Tensor):
                result = fn(value, *other_values)
                if result is not None and result is not value:
                    value.copy_(result)
            elif _collection(value):
                value.apply_(fn, *other_values)
        return self

    # -------------------------------------------------------------- leaf-wise
    def clone(self, recurse: bool = True):
        """A copy; with ``recurse=False`` the copy shares the tensors."""
        if not recurse:
            return self._shallow_copy()
        return self._apply_tree(torch.Tensor.clone, (), None, None, False)

    def detach(self):
        return self._apply_tree(torch.Tensor.detach, (), None, None, False)

    def detach_(self):
        for value in self.values(True, True):
            if isinstance(value, torch.Tensor):
                value.detach_()
        return self

    def contiguous(self):
        return self._apply_tree(torch.Tensor.contiguous, (), None, None, False)

    def requires_grad_(self, requires_grad: bool = True):
        for value in self.values(True, True):
            if isinstance(value, torch.Tensor):
                value.requires_grad_(requires_grad)
        return self

    def zero_(self):
        for value in self.values(True, True):
            if isinstance(value, torch.Tensor):
                value.zero_()
        return self

    def fill_(self, key, value):
        """Fill the entry at ``key`` with ``value`` in place."""
        self._get_leaf(key).fill_(value)
        return self

    def to(self, *args, **kwargs):
        """Move and/or cast every tensor leaf, like ``Tensor.to``.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> td.to(torch.float64)["a"].dtype
            torch.float64
        """
        if args and _collection(args[0]):
            other = args[0]
            args = (other.device,) if other.device is not None else ()
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is None and dtype is None:
            return self

        def convert(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device=device, dtype=dtype, non_blocking=non_blocking)

        out = self._apply_tree(convert, (), None, None, False)
        if device is not None:
            out._set_device(device)
        return out

    def _set_device(self, device) -> None:
        self._device = torch.device(device)
        for value in self._data.values():
            if isinstance(value, NonTensorData):
                value.device = self._device
            elif _collection(value):
                value._set_device(device)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else device)

    def float(self):
        return self.to(torch.float32)

    def double(self):
        return self.to(torch.float64)

    def half(self):
        return self.to(torch.float16)

    def bfloat16(self):
        return self.to(torch.bfloat16)

    def share_memory_(self):
        """Move every tensor leaf to shared memory (in place); returns self."""
        for value in self.values(True, True):
            if isinstance(value, torch.Tensor):
                value.share_memory_()
        return self

    def is_shared(self) -> bool:
        from ._repr import is_shared

        return is_shared(self)
