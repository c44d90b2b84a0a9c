"""Reading and writing entries: ``[]``, ``get``, ``set``, ``update``, ``del_``, ``keys``.

A mixin of :class:`~tdfunc._core.ops.TensorOps`, so ``TensorDict`` and every
``TensorClass`` share it. Writes go through ``self._write`` (the atomic engine of
:mod:`tdfunc._core.helpers.writes`); a ``TensorClass`` adds its casting rules there.

The fast paths test ``type(node) is TensorDict`` (nested levels are plain
TensorDicts); ``TensorDict`` derives from this mixin, so ``container.py`` binds
the name below once the class exists.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": {"b": torch.zeros(2)}}, [2])
    >>> td.set(("a", "c"), torch.ones(2))["a", "c"].tolist()
    [1.0, 1.0]
    >>> sorted(td.keys(include_nested=True, leaves_only=True))
    [('a', 'b'), ('a', 'c')]
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, overload

import torch

from ..helpers.fastpath import contains_missed, get_path, lookup_nested, pop_fast, set_fast
from ..helpers.frozen import FROZEN, refuse_frozen_inside
from ..helpers.locks import refuse_if_owner_locked
from ..helpers.mixin import LOCK_ERROR, ContainerMixin, is_tensor_collection, read_value
from ..helpers.nested_keys import (
    MISSING,
    KeysView,
    is_key,
    key_parts,
    leaf_walk,
    missing_key_error,
    unravel_key,
)
from ..helpers.nontensor import NonTensorData
from ..helpers.parents import hand_out
from ..helpers.renames import rename_keys
from ..helpers.update import (
    check_batch_sizes,
    merge_rule,
    resize_plan,
    resized,
    send_for_set,
    update_items,
    write_through_lock,
)
from ..helpers.writes import full_key, items_of, rename_key, writable_view, write

if TYPE_CHECKING:
    from types import EllipsisType

    from typing_extensions import Self

_NO_DEFAULT = MISSING
_Tensor = torch.Tensor
_weak = weakref.ref  # one ref object per container, reused by CPython on each call
_read = read_value


def _not_a_key(td: Any, key: Any) -> KeyTypeError:
    # `0 in td` is a mistake, not a missing key
    return KeyTypeError(
        f"{type(td).__name__}.__contains__: a key must be a NestedKey (a str or a "
        f"tuple of str), got {type(key).__name__} {key!r}. To test values, compare "
        f"leaves: (td == value).any()."
    )


class AccessMixin(ContainerMixin):
    """Entries of a container by key (methods of ``TensorDict`` and ``TensorClass``)."""

    __slots__ = ()

    # ------------------------------------------------------------------ reading
    @overload
    def __getitem__(self, index: str) -> Any: ...

    @overload
    def __getitem__(
        self, index: int | slice | torch.Tensor | list[Any] | EllipsisType | None
    ) -> Self: ...

    @overload
    def __getitem__(self, index: tuple[Any, ...]) -> Any: ...

    def __getitem__(self, index: Any) -> Any:
        """A key (``str`` or tuple of ``str``) reads a value; anything else indexes the batch.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(3)}}, [3])
            >>> td["a", "b"].shape, td[1:].batch_size
            (torch.Size([3]), torch.Size([2]))
        """
        kind = type(index)
        if kind is str:
            try:
                value = self._data[index]
            except KeyError:
                return self._get_missing(index, _NO_DEFAULT, "__getitem__")
        elif kind is tuple:
            value = lookup_nested(self, index)  # fast path: flat tuples of str, any depth
            if value is _NO_DEFAULT:
                if not is_key(index):
                    return self._index(index)
                value = self._get_nested(key_parts(index))
                if value is _NO_DEFAULT:
                    return self._get_missing(index, _NO_DEFAULT, "__getitem__")
        else:
            return self._index(index)
        if type(value) is _Tensor:
            return value
        if is_tensor_collection(value):
            self._hand_out(index, value)
            return value
        return _read(value)

    def _hand_out(self, key, value) -> None:
        """Remember which container holds ``value`` (a nested level given to the caller), so
        that its batch size cannot later leave its parent's (``check_parent_batch``)."""
        if type(key) is str or len(key) == 1:
            if type(value) is type(self) and getattr(type(self), "_is_tensordict", False):
                # the common case, on the path of td["key"] (hand_out does the same for
                # two containers that are their own views)
                value._parent = _weak(self)
                return
            hand_out(self, value)
            return
        parent = self._get_nested(key_parts(key)[:-1])
        if is_tensor_collection(parent):
            hand_out(parent, value)

    def get(self, key, default: Any = _NO_DEFAULT) -> Any:
        """The entry at ``key`` (a ``str`` or nested tuple), or ``default`` (``None``) if missing.

        As in tensordict, a non-tensor entry comes as its ``NonTensorData``
        (``td[key]`` and :meth:`get_non_tensor` give the Python value).

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}, "s": "text"}, [])
            >>> td.get(("a", "b"))
            tensor(0.)
            >>> td.get("s").data, td["s"]
            ('text', 'text')
            >>> td.get("missing") is None
            True
        """
        if type(key) is str:
            value = self._data.get(key, _NO_DEFAULT)
        else:
            value = lookup_nested(self, key)  # fast path: flat tuples of str, any depth
            if value is _NO_DEFAULT:
                try:
                    parts = key_parts(key)
                except (TypeError, KeyError):
                    parts = self._key_parts(key, "get")  # raises, naming the API
                value = self._get_nested(parts)
        if value is _NO_DEFAULT:
            # tensordict: get of a missing key gives None (a TensorClass's too); indexing
            # and attribute access are where a missing name is an error
            return self._get_missing(key, None if default is _NO_DEFAULT else default, "get")
        # tensordict: a TensorDict's get gives a non-tensor entry as its NonTensorData,
        # a tensorclass's get gives its Python value (td[key] always gives the value)
        if type(value) is not _Tensor:
            if is_tensor_collection(value):
                self._hand_out(key, value)
            elif self._get_reads_value:
                return _read(value)
        return value

    def _key_parts(self, key, api: str) -> tuple:
        """``key`` as a tuple of ``str``; a bad key is a ``TypeError`` naming ``Class.api``."""
        try:
            return key_parts(key)
        except (TypeError, KeyError):
            return key_parts(key, f"{type(self).__name__}.{api}")  # raises, naming the API

    def _get_missing(self, key, default: Any, api: str) -> Any:
        """What reading a key that holds no value gives: ``default``, or a ``KeyError``.

        A field of a TensorClass that holds ``None`` (is unset) reads ``None``, also
        through a nested key (``td.get(("instance", "field"))``).
        """
        parts = key_parts(key, f"{type(self).__name__}.{api}")
        if len(parts) == 1:
            if parts[0] in self._field_names:
                return None
            if self._get_reads_value and isinstance(getattr(type(self), parts[0], None), property):
                # tensordict: a tensorclass's get reads its attributes (get("batch_size"))
                return getattr(self, parts[0])
        else:
            inner = self._data.get(parts[0])
            if is_tensor_collection(inner):
                try:
                    return inner._get_missing(parts[1:], default, api)
                except KeyError:
                    raise self._missing(key, api) from None
        if default is _NO_DEFAULT:
            raise self._missing(key, api)
        return default

    def _get_nested(self, parts: tuple) -> Any:
        """The stored value at ``parts``, or ``_NO_DEFAULT`` (also when a leaf is in the way)."""
        return get_path(self, parts)

    def _get_leaf(self, key, api: str = "get") -> Any:
        """The stored value (``NonTensorData`` not unwrapped), or raise ``KeyError``."""
        if type(key) is str:
            value = self._data.get(key, _NO_DEFAULT)
        else:
            value = self._get_nested(self._key_parts(key, api))
        if value is _NO_DEFAULT:
            raise self._missing(key, api)
        return value

    def _missing(self, key, api: str = "get", prefix: tuple = ()) -> KeyError:
        """A ``KeyError`` for ``key`` naming where the path stops and the closest keys."""
        name = f"{type(self).__name__}.{api}"
        parts = key_parts(key, name)
        node: Any = self
        for depth, part in enumerate(parts):
            if not is_tensor_collection(node):
                return KeyError(
                    f"{name}: key {full_key(prefix, parts)!r} not found: "
                    f"{prefix + parts[:depth]!r} holds a {type(node).__name__}, not a TensorDict."
                )
            data = node._to_tensordict_view()._data
            if part not in data:
                above = prefix + parts[:depth]
                where = f" under {above!r}" if above else ""
                known = sorted(set(data) | set(node._field_names))
                return missing_key_error(part, known, where, name)
            node = data[part]
        return KeyError(f"{name}: key {full_key(prefix, parts)!r} not found.")

    def __contains__(self, key) -> bool:
        kind = type(key)
        if kind is str:
            return key in self._data
        if kind is not tuple:  # (a tuple, the common nested key, goes on with no call)
            if isinstance(key, str):  # a subclass of str
                return str(key) in self._data
            if not isinstance(key, tuple):
                raise _not_a_key(self, key)
        if lookup_nested(self, key) is not _NO_DEFAULT:
            return True
        try:
            return contains_missed(self, key)
        except (TypeError, KeyError):  # ("a", 0) or () in td: as much a mistake as 0
            pass
        raise _not_a_key(self, key)

    def keys(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf=None,
        *,
        sort: bool = False,
    ) -> KeysView:
        """The keys; nested keys (as tuples) too with ``include_nested=True``.

        ``is_leaf`` (a function of the value's class) decides what counts as a
        leaf for ``leaves_only``; by default everything but a nested container.

        Example:
            >>> td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(())}})
            >>> list(td.keys(include_nested=True, leaves_only=True))
            ['a', ('b', 'c')]
        """
        if is_leaf is not None or sort:  # nested keys sort by their joined name (tensordict)
            return [key for key, _ in self._entries(include_nested, leaves_only, is_leaf, sort)]
        return KeysView(self, include_nested, leaves_only, sort)

    def values(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf=None,
        *,
        sort: bool = False,
    ):
        """The entries, in key order; a non-tensor entry comes as its ``NonTensorData``.

        As in tensordict, the top level alone is a view of the container's dict (it has a
        ``len`` and can be iterated again, as ``dict.values()``), a sorted walk a tuple,
        and a nested walk a generator.
        """
        if not (include_nested or leaves_only or sort):
            return self._data.values()
        entries = self._entries(include_nested, leaves_only, is_leaf, sort)
        if sort:
            return tuple(value for _, value in entries)
        return (value for _, value in entries)

    def items(
        self,
        include_nested: bool = False,
        leaves_only: bool = False,
        is_leaf=None,
        *,
        sort: bool = False,
    ):
        """``(key, entry)`` pairs in key order; non-tensor entries come as ``NonTensorData``.

        As in tensordict, the top level alone is a view of the container's dict (as
        ``dict.items()``), a sorted walk or one of the nested leaves a list, and another
        nested walk a generator.
        """
        if not (include_nested or leaves_only or sort):
            return self._data.items()
        entries = self._entries(include_nested, leaves_only, is_leaf, sort)
        if sort or (include_nested and leaves_only):
            return list(entries)
        return entries

    def _entries(self, include_nested: bool, leaves_only: bool, is_leaf, sort: bool):
        """``(key, stored value)`` for keys/values/items with ``is_leaf`` and ``sort``."""
        if is_leaf is None:
            pairs = self._iter_items((), include_nested, leaves_only)
            if leaves_only:  # tensordict's default leaves: tensors, not non-tensor data
                pairs = ((k, v) for k, v in pairs if not isinstance(v, NonTensorData))
        else:
            # is_leaf also says where the walk stops, as in tensordict (and flatten_keys):
            # a nested container it calls a leaf is one entry, its keys are not listed
            pairs = (
                (k, v)
                for k, v in leaf_walk(self, is_leaf, include_nested)
                if not leaves_only or is_leaf(type(v))
            )
        if sort:  # tensordict sorts nested keys by their joined name
            return iter(
                sorted(pairs, key=lambda kv: kv[0] if type(kv[0]) is str else ".".join(kv[0]))
            )
        return pairs

    def _iter_items(self, prefix: tuple, include_nested: bool, leaves_only: bool):
        """``(key, stored value)`` pairs; keys are tuples below the top level."""
        plain = self._plain_tensordict()
        for key, value in self._data.items():
            full = prefix + (key,) if prefix else key
            nested = is_tensor_collection(value)
            if not (nested and leaves_only):
                yield full, value
            if nested and include_nested:
                inner = value if type(value) is plain else value._to_tensordict_view()
                yield from inner._iter_items(
                    full if type(full) is tuple else (full,), include_nested, leaves_only
                )

    def _iter_keys(self, prefix: tuple, include_nested: bool, leaves_only: bool):
        for key, _ in self._iter_items(prefix, include_nested, leaves_only):
            yield key

    def is_empty(self) -> bool:
        """True when there is no leaf, at any depth."""
        return not any(True for _ in self._iter_items((), True, True))

    # ------------------------------------------------------------------ writing
    def _check_writable(self, api: str, key) -> None:
        self._check_mutable(api)
        if self._is_locked:
            if self._is_locked == FROZEN:
                raise RuntimeError(
                    f"TensorDict.{api}: cannot write key {key!r}: this TensorDict belongs to a "
                    f"frozen TensorClass, which refuses every write."
                )
            raise RuntimeError(
                f"{type(self).__name__}.{api}: cannot add, replace, delete or rename key "
                f"{key!r}: it is locked. {LOCK_ERROR} Or call td.unlock_() first."
            )

    def _write(self, items, inplace, merge: bool, api: str, prefix: tuple = ()) -> None:
        """Write ``(key, value)`` pairs atomically (see ``_writes.write``)."""
        write(self, items, inplace, merge, api, prefix)

    def set(self, key, value: Any, *, inplace: bool = False, non_blocking: bool = False) -> Self:
        """Write ``value`` at ``key`` (creating nested TensorDicts as needed); returns self.

        With ``inplace=True`` an existing tensor is written in place. A locked
        TensorDict refuses to replace an entry: write it in place (``inplace=True``
        or ``set_``). With
        ``non_blocking=True`` a tensor that must change device is sent without
        blocking (``Tensor.to(..., non_blocking=True)``).

        Example:
            >>> td = TensorDict({}, [2])
            >>> td.set(("a", "b"), torch.zeros(2, 5))["a", "b"].shape
            torch.Size([2, 5])
        """
        if not inplace and set_fast(self, key, value):  # a tensor under existing levels
            return self
        if non_blocking and isinstance(value, _Tensor):
            value = send_for_set(self, key, value, inplace)
        self._write(((key, value),), inplace, False, "set")
        return self

    def set_(self, key, value: Any) -> Self:
        """Copy ``value`` into the existing entry at ``key`` (in place); returns self.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2)}, [2])
            >>> before = td["a"]
            >>> _ = td.set_("a", torch.ones(2))
            >>> before.tolist()
            [1.0, 1.0]
        """
        self._write(((key, value),), "strict", False, "set_")
        return self

    def __setitem__(self, index, value: Any) -> None:
        kind = type(index)
        if (kind is str or kind is tuple) and set_fast(self, index, value):
            return  # fast path: a tensor under existing, unlocked levels
        if kind is str or is_key(index):
            self.set(index, value)
        else:
            self._set_at_index(index, value)

    def update(
        self,
        other: Mapping | None = None,
        clone: bool = False,
        inplace: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update=None,
        is_leaf=None,
        update_batch_size: bool = False,
        ignore_lock: bool = False,
        **entries: Any,
    ) -> Self:
        """Write every entry of ``other``; nested mappings merge into nested TensorDicts.

        Atomic: when an entry is invalid, nothing is written. ``clone=True``
        writes copies, ``keys_to_update`` limits the update to these keys (and
        what is below them; a level of a listed key that this container lacks is
        written whole, as in tensordict), keyword ``entries`` are written too, and
        ``ignore_lock=True`` writes into a locked TensorDict as if it were not.
        ``is_leaf(type)`` true for a nested container (or ``TensorDict`` for a
        nested mapping) writes it whole instead of merging it into the existing
        one. ``update_batch_size=True`` gives this container (and the nested
        containers ``other`` merges into) ``other``'s batch size; entries the
        update keeps must fit it.

        Example:
            >>> td = TensorDict({"a": {"b": torch.zeros(())}})
            >>> sorted(td.update({"a": {"c": torch.ones(())}}).keys(True, True))
            [('a', 'b'), ('a', 'c')]
        """
        self._check_mutable("update")
        check_batch_sizes(self, other, update_batch_size, inplace)
        if ignore_lock:  # lifting the lock never lifts frozen: refuse before anything changes
            refuse_frozen_inside(self, "update")
        items = update_items(
            other, clone, keys_to_update, non_blocking, self._device, "update", self
        )
        if entries:
            items = list(items) + update_items(entries, clone, keys_to_update, False, None)
        merge = merge_rule(is_leaf, self._plain_tensordict())
        if update_batch_size:
            plan = resize_plan(self, other, merge)
            return resized(self, plan, items, inplace, merge, ignore_lock)
        if ignore_lock and self._is_locked:
            write_through_lock(self, items, inplace, merge)
            return self
        self._write(items, inplace, merge, "update")
        return self

    def update_(
        self,
        other: Mapping | None = None,
        clone: bool = False,
        *,
        non_blocking: bool = False,
        keys_to_update=None,
        **entries: Any,
    ) -> Self:
        """Copy every entry of ``other`` into the existing entries (in place, atomic).

        ``keys_to_update`` limits the copy to these keys (and what is below them);
        keyword ``entries`` are copied too.

        Example:
            >>> td = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2])
            >>> new = {"a": torch.ones(2), "b": torch.ones(2)}
            >>> td.update_(new, keys_to_update=["a"])["b"].tolist()
            [0.0, 0.0]
        """
        if keys_to_update is None and not clone and not entries and other is not None:
            items = items_of(other, "update_")
        else:
            items = update_items(other, clone, keys_to_update, non_blocking, None, "update_")
            if entries:
                items = list(items) + update_items(entries, clone, keys_to_update, False, None)
        self._write(items, "strict", True, "update_")
        return self

    def copy_(self, other: Mapping, non_blocking: bool = False) -> Self:
        """Copy the values of ``other`` into this container's tensors, in place.

        The in-place counterpart of ``clone``: every entry of ``other`` must
        already exist here with the same shape; the tensors stay the same objects
        (a hard target-network update keeps the target's parameters registered).
        ``non_blocking`` is accepted for compatibility; copies are synchronous.

        Example:
            >>> target = TensorDict({"w": torch.zeros(2)}, batch_size=[])
            >>> w = target["w"]
            >>> _ = target.copy_(TensorDict({"w": torch.ones(2)}, batch_size=[]))
            >>> target["w"] is w, w.tolist()
            (True, [1.0, 1.0])
        """
        self._write(items_of(other, "copy_"), "strict", True, "copy_")
        return self

    def setdefault(self, key, default: Any) -> Any:
        """The value at ``key``; if missing, write ``default`` there first."""
        if key not in self:
            self.set(key, default)
        return self.get(key)

    def __delitem__(self, key) -> None:
        self.del_(key)

    def del_(self, key) -> Self:
        """Remove ``key`` (nested keys too); returns self."""
        self._check_mutable("del_")
        parts = key_parts(key, f"{type(self).__name__}.del_")
        # A locked container refuses the deletion whether or not the key exists (or a
        # leaf is in the way), as tensordict does: the lock is the error to report.
        refuse_if_owner_locked(self, parts, "del_")
        node = self._get_leaf(parts[:-1], "del_") if len(parts) > 1 else self
        if not is_tensor_collection(node):
            raise self._missing(key, "del_")
        if node is not self:  # a write through this container into a nested one
            node = writable_view(node, "del_", unravel_key(key))
        # A locked container refuses the deletion whether or not the key exists, as
        # tensordict does: the lock is the error to report, not the missing key.
        node._check_writable("del_", unravel_key(key))
        if parts[-1] not in node._data:
            raise self._missing(key, "del_")
        del node._data[parts[-1]]
        return self

    def pop(self, key, default: Any = _NO_DEFAULT) -> Any:
        """Remove ``key`` and return its value (or ``default`` when missing)."""
        self._check_mutable("pop")
        if self._is_locked:  # refused whether or not the key exists, as del_ is
            refuse_if_owner_locked(self, self._key_parts(key, "pop"), "pop")
        value = pop_fast(self, key)  # fast path: unlocked TensorDicts all the way
        if value is not _NO_DEFAULT:
            return _read(value)
        parts = self._key_parts(key, "pop")
        refuse_if_owner_locked(self, parts, "pop")  # a locked nested level holds the key
        value = self._get_nested(parts)
        if value is _NO_DEFAULT:
            if default is _NO_DEFAULT:
                message = self._missing(key, "pop").args[0]
                raise KeyError(
                    f"{message} You are trying to pop key {unravel_key(key)!r}, which is not "
                    f"there: pass a default (td.pop(key, None)) to get it instead of an error."
                )
            return default
        self.del_(key)
        return _read(value)

    def clear(self) -> Self:
        """Remove every key; returns self."""
        self._check_mutable("clear")
        if self._data:
            self._check_writable("clear", list(self._data))
        self._data.clear()
        return self

    def rename_keys(self, mapping, *, strict: bool = True) -> Self:
        """A new container with several keys renamed at once (this one is unchanged).

        Every source is read before any destination is written, so swaps
        (``{"a": "b", "b": "a"}``) and chains work; keys may be nested on both sides. The
        result shares the leaves, is not locked, and drops the nested containers the
        renaming empties. ``strict=False`` skips missing sources (``KeyError`` otherwise);
        a destination already present and not renamed away is a ``ValueError``.

        Example:
            >>> td = TensorDict(raw=TensorDict(p=torch.zeros(3), u=torch.ones(3)))
            >>> out = td.rename_keys({("raw", "p"): "pressure", ("raw", "u"): "velocity"})
            >>> sorted(out.keys(include_nested=True))
            ['pressure', 'velocity']
        """
        return rename_keys(self, mapping, strict)

    def rename_key_(self, old_key, new_key, safe: bool = False) -> Self:
        """Rename ``old_key`` to ``new_key`` in place (atomic); returns self.

        With ``safe=True`` an existing ``new_key`` is an error instead of being replaced.

        Example:
            >>> td = TensorDict({"a": torch.zeros(())})
            >>> list(td.rename_key_("a", ("b", "c")).keys(True, True))
            [('b', 'c')]
        """
        self._check_mutable("rename_key_")
        # a locked container refuses the rename whatever the keys, as tensordict does
        refuse_if_owner_locked(self, self._key_parts(old_key, "rename_key_"), "rename_key_")
        rename_key(self, old_key, new_key, safe)
        return self


class KeyTypeError(TypeError, RuntimeError):
    """Something that is not a key where a key is needed.

    A ``TypeError`` (the wrong type), and the ``RuntimeError`` tensordict raises
    there, so code written against either library catches it.
    """
