"""One entry at an index: ``get_at``, ``set_at_``, ``update_at_``, ``copy_at_``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..helpers.indexing import prepare
from ..helpers.leafwise import check_in_place_write, is_collection
from ..helpers.mixin import ContainerMixin
from ..helpers.nested_keys import unravel_key
from ..helpers.nontensor import NonTensorData, written
from ..helpers.writes import assign_at, check_copy_target, check_fits, writable_view

_Tensor = torch.Tensor
_KEEP: Any = object()


class AtIndexMixin(ContainerMixin):
    """Reads and in-place writes of entries at a batch index (methods of ``TensorDict``)."""

    __slots__ = ()

    def get_at(self, key: Any, index: Any, default: Any = _KEEP):
        """The entry at ``key``, indexed by ``index`` (``default``, ``None`` if not given,
        when the key is missing).

        The index applies to the entry itself, as ``td.get(key)[index]`` does (an
        ellipsis stands for all of its dims), as in tensordict.

        Example:
            >>> TensorDict({"a": torch.arange(3)}, [3]).get_at("a", 1)
            tensor(1)
        """
        try:
            value = self._get_leaf(key, "get_at")
        except KeyError:
            # as get: an unset field or a missing key gives None (tensordict), or the
            # default given for a missing key
            return self._get_missing(key, None if default is _KEEP else default, "get_at")
        if isinstance(value, NonTensorData):
            return value[index]._value()
        return value[index]

    def set_at_(self, key: Any, value: Any, index: Any):
        """Write ``value`` into the entry at ``key`` at ``index`` (in place); returns self.

        As ``td.get(key)[index] = value`` (the index applies to the entry itself); a
        tensor value is cast to the entry's dtype, and a value that does not fit
        raises before anything is written.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3)}, [3]).set_at_("a", 1.0, 1)
            >>> td["a"].tolist()
            [0.0, 1.0, 0.0]
        """
        check_in_place_write(self, "set_at_")
        target = self._get_leaf(key, "set_at_")
        if isinstance(target, _Tensor):
            _check_fits_at(key, target, value, index, "set_at_")
            assign_at(target, index, value)
        elif is_collection(target):
            target[index] = value
        elif isinstance(target, NonTensorData):
            # a non-tensor leaf is immutable: its parent gets the leaf with the values
            # written (a NonTensorStack once the values differ), as td[index] = ... does
            _set_non_tensor_at(self, key, target, value, index)
        else:
            raise TypeError(
                f"TensorDict.set_at_: the entry at key {key!r} is a "
                f"{type(target).__name__}; only tensors and containers are written at an index."
            )
        return self

    def update_at_(self, input_dict: Mapping, index: Any, clone: bool = False):
        """Write every entry of ``input_dict`` into the existing entries at ``index``.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3)}, [3])
            >>> td.update_at_({"a": 1.0, "b": 2.0}, slice(0, 2))["b"].tolist()
            [2.0, 2.0, 0.0]
        """
        check_in_place_write(self, "update_at_")
        if isinstance(input_dict, Mapping):
            items = list(input_dict.items())
        else:
            items = list(input_dict._to_tensordict_view().items())
        for key, value in items:  # every key must exist (KeyError with hints) and fit
            target = self._get_leaf(key, "update_at_")
            if isinstance(target, _Tensor):  # checked before any entry is written
                _check_fits_at(key, target, value, index, "update_at_")
        for key, value in items:
            if clone and isinstance(value, _Tensor):
                value = value.clone()
            self.set_at_(key, value, index)
        return self

    def copy_at_(self, other: Any, index: Any, *, fast: bool = False):
        """Write the container ``other`` into ``self[index]`` (in place); returns self.

        ``fast`` is accepted for compatibility: the write is checked either way.

        Example:
            >>> td = TensorDict({"a": torch.zeros(3)}, [3])
            >>> td.copy_at_(TensorDict({"a": torch.ones(2)}, [2]), slice(1, 3))["a"].tolist()
            [0.0, 1.0, 1.0]
        """
        check_in_place_write(self, "copy_at_")
        self[index] = other
        return self


def _set_non_tensor_at(td: Any, key: Any, target: NonTensorData, value: Any, index: Any) -> None:
    key = unravel_key(key, "set_at_")
    parts = (key,) if isinstance(key, str) else key
    parent = td
    for part in parts[:-1]:
        parent = writable_view(parent._to_tensordict_view()._data[part], "set_at_", key)
    parent = writable_view(parent, "set_at_", key)
    leaf_index, selected = parent._leaf_index(index)
    if selected is None:  # a mask or an index tensor: positions once, as __setitem__ does
        leaf_index = prepare(leaf_index, parent._batch_size)[0]
    parent._data[parts[-1]] = written(target, leaf_index, value)


def _check_fits_at(key: Any, target: _Tensor, value: Any, index: Any, api: str) -> None:
    """Raise now if ``target[index] = value`` would, before any entry is written.

    The index applies to the entry itself, as ``td.get(key)[index]`` (an ellipsis
    stands for all of its dims), as in tensordict.
    """
    stand_in = torch.zeros((), dtype=torch.uint8, device=target.device).expand(target.shape)
    expected = stand_in[index].shape  # stride 0: no data is read
    try:
        shape = value.shape if isinstance(value, _Tensor) else torch.as_tensor(value).shape
    except (TypeError, ValueError, RuntimeError):
        shape = None  # not a tensor-like value: torch's write gives its error
    if shape is not None:
        check_fits(shape, expected, (key,) if isinstance(key, str) else key, api)
    check_copy_target(target, value, key, api)
