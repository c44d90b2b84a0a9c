"""The hot paths of key access: get, set, ``in`` and pop, for keys of any depth.

Each function here handles the common case (a ``str`` or a flat tuple of
``str``, existing nested TensorDicts, a tensor of any kind, an unlocked
container without a device) with a plain loop, and says so by its result;
everything else (nested-tuple spellings, missing levels, locked or frozen
containers, conversions, errors with hints) is left to the validated paths of
the container and the write engine. The fast and the full path give the same
results; the full path only costs more.

Each fast path and its general twin:

- :func:`lookup_nested` (``[]``, ``get``, ``in``): the key normalised by
  ``nested_keys.key_parts``, then :func:`get_path` (``AccessMixin._get_nested``);
- :func:`set_fast` (``set``, ``[] =``): the write engine, ``writes.write`` through
  ``self._write``;
- :func:`pop_fast` (``pop``): the normalised key, the lock rules of ``locks.py``, then
  the general removal in ``AccessMixin.pop``.

``tests/core/test_fastpath_differential.py`` proves they agree: random sequences of
these operations, run as shipped and with every fast path reporting "not handled",
give the same results, errors and containers.

A leaf is "a tensor" when its class is ``torch.Tensor`` or any subclass
(``nn.Parameter``, a memory-mapped tensor, ...). The classification of each
class is computed once and cached, so that the test costs one dict lookup
(``is_tensor_kind[type(value)]``) instead of an ``isinstance`` call.
"""

from __future__ import annotations

from typing import Any

import torch

from .nested_keys import MISSING, key_parts
from .tracing import dynamo_compiling as _dynamo_compiling

_Tensor = torch.Tensor
# A class first met while dynamo traces is classified without being cached: dynamo
# replays a store into a global dict after the trace and guards on the dict's
# length, so the next call would fail that guard and compile the function again.
# For the same reason the classes every container meets are classified up front
# (container classes as they are created, see ContainerMixin.__init_subclass__):
# a first sighting in eager code between two compiled calls would grow the dict.


class _TensorKinds(dict):
    """``kind -> bool``: is ``kind`` ``torch.Tensor`` or a subclass of it (cached)."""

    def __missing__(self, kind: type) -> bool:
        answer = isinstance(kind, type) and issubclass(kind, _Tensor)
        if not _dynamo_compiling():
            self[kind] = answer
        return answer


class _NodeKinds(dict):
    """``kind -> 1, 2 or 0``: how to reach the entries of a value of class ``kind``.

    1: a TensorDict (its own ``_data``); 2: another tensor collection (a
    TensorClass: through ``_to_tensordict_view()``); 0: a leaf.
    """

    def __missing__(self, kind: type) -> int:
        if getattr(kind, "_is_tensordict", False):
            how = 1
        elif getattr(kind, "_is_tensor_collection", False):
            how = 2
        else:
            how = 0
        if not _dynamo_compiling():
            self[kind] = how
        return how


is_tensor_kind: dict[type, bool] = _TensorKinds({_Tensor: True, torch.nn.Parameter: True})
node_kind: dict[type, int] = _NodeKinds({_Tensor: 0, torch.nn.Parameter: 0, type(MISSING): 0})


def lookup(td: Any, key: Any) -> Any:
    """The stored value at ``key`` (a ``str`` or a flat tuple of ``str``), or ``MISSING``.

    ``MISSING`` also means "not handled here": a missing key, a leaf in the way,
    a nested-tuple spelling or something that is not a key at all (an index).
    Callers then take their validated path, which gives the right answer or
    error. Non-tensor leaves are returned as stored (``NonTensorData``).

    Example:
        >>> td = TensorDict({"a": {"b": {"c": torch.zeros(2)}}}, [2])
        >>> lookup(td, ("a", "b", "c")).shape
        torch.Size([2])
        >>> lookup(td, ("a", "x")) is MISSING, lookup(td, (0, slice(None))) is MISSING
        (True, True)
    """
    if type(key) is str:
        return td._data.get(key, MISSING)
    return lookup_nested(td, key)


def lookup_nested(td: Any, key: Any, _missing: Any = MISSING) -> Any:
    """:func:`lookup` for a key that is not a ``str`` (a tuple, or not a key at all)."""
    if type(key) is not tuple or not key or type(key[0]) is not str:
        return _missing  # not a key, or an index such as (0, slice(None))
    cls = type(td)  # nested levels are most often of the same class
    node = td
    try:
        for part in key:
            # a part that is not a str finds nothing (keys are str), or raises
            # TypeError when unhashable; either way the full path decides
            if type(node) is cls:
                node = node._data.get(part, _missing)
                continue
            how = node_kind[type(node)]  # MISSING and leaves are 0
            if how == 1:
                node = node._data.get(part, _missing)
            elif how == 2:
                node = node._to_tensordict_view()._data.get(part, _missing)
            else:
                return _missing
    except TypeError:
        return _missing
    return node


def get_path(td: Any, parts: tuple) -> Any:
    """The stored value at ``parts`` (a tuple of ``str``; ``()`` is ``td``), or ``MISSING``."""
    return lookup(td, parts) if parts else td


def contains_missed(td: Any, key: Any) -> bool:
    """``key in td`` once :func:`lookup` found nothing at ``key`` (other spellings).

    Example:
        >>> td = TensorDict({"a": {"b": torch.zeros(())}})
        >>> contains_missed(td, ("a", ("b",))), contains_missed(td, ("a", "c"))
        (True, False)
    """
    if type(key) is tuple and key:
        for part in key:
            if type(part) is not str:
                break
        else:
            return False  # a flat key that lookup did not find: missing
    # not a key (a TypeError) or the empty tuple (a KeyError): the caller reports it
    return lookup(td, key_parts(key)) is not MISSING


def set_fast(td: Any, key: Any, value: Any) -> bool:
    """Store tensor ``value`` at ``key`` when nothing needs checking beyond its shape.

    Returns False, having written nothing, unless: ``value`` is a tensor (of any
    class), ``key`` is a ``str`` or a flat tuple of ``str`` whose every level
    above the last already holds a TensorDict, and the TensorDict written into
    is unlocked, has no device and a batch size that ``value`` starts with.
    (``set`` then replaces the entry, as the full path would.)

    Example:
        >>> td = TensorDict({"a": {"b": {}}}, [2])
        >>> set_fast(td, ("a", "b", "c"), torch.zeros(2, 3)), set_fast(td, "d", 1.0)
        (True, False)
    """
    kind = type(value)
    if kind is not _Tensor and not is_tensor_kind[kind]:
        return False
    cls = type(td)
    if node_kind[cls] != 1:
        return False  # a TensorClass checks its writes on the full path
    node = td
    if type(key) is not str:
        if type(key) is not tuple or not key:
            return False
        last = key[-1]
        if type(last) is not str:
            return False
        for part in key[:-1]:
            if type(part) is not str:
                return False
            node = node._data.get(part)
            if type(node) is not cls and node_kind[type(node)] != 1:
                return False
        key = last
    if node._is_locked or node._device is not None:
        return False
    size = node._batch_size
    ndim = len(size)
    if ndim:  # value.shape[:ndim] == size, dim by dim (slicing a Size costs more)
        shape = value.shape
        if len(shape) < ndim or shape[0] != size[0]:
            return False
        if ndim > 1 and shape[1] != size[1]:
            return False
        if ndim > 2 and (shape[2] != size[2] or (ndim > 3 and shape[:ndim] != size)):
            return False
    node._data[key] = value
    return True


def pop_fast(td: Any, key: Any) -> Any:
    """Remove and return the stored value at ``key``, or ``MISSING`` when not handled.

    Handled: ``td`` and every level above the last are TensorDicts, and the one
    holding the entry is unlocked. Anything else (a missing key, a locked
    container, a TensorClass on the way) is left to the full path, which raises
    the errors.

    Example:
        >>> td = TensorDict({"a": {"b": {"c": torch.zeros(())}}})
        >>> pop_fast(td, ("a", "b", "c")), ("a", "b", "c") in td
        (tensor(0.), False)
    """
    node = td
    if type(key) is str:
        last = key
    elif type(key) is tuple and key:
        last = key[-1]
        for part in key[:-1]:
            if type(part) is not str or node_kind[type(node)] != 1:
                return MISSING
            node = node._data.get(part)
    else:
        return MISSING
    if type(last) is not str or node_kind[type(node)] != 1 or node._is_locked:
        return MISSING
    return node._data.pop(last, MISSING)
