"""``init_remote`` / ``from_remote_init``: a TensorDict sent to a rank that does not know
its structure.

The structure travels as JSON (keys, batch sizes, leaf shapes and dtypes: never pickled
data), in two messages (its length, then its bytes); the values follow as one ordinary
message (``send`` / ``broadcast``), into a TensorDict the receiver builds from that
description. The receiver checks the description before allocating anything: a length or
a shape past the limits, an unknown dtype or a malformed tree is a ``ValueError``.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any

import torch
import torch.distributed as dist

from .collectives import _check_rank, _check_ready, broadcast, recv, send

_MAX_DESCRIPTION_BYTES = 1 << 24  # a structure of about a hundred thousand leaves
_MAX_ELEMENTS = 1 << 40  # per leaf: more than any host holds, less than an overflow
_REFUSED = -1  # the length a sender announces when it cannot describe its TensorDict


def _describe(td: Any, api: str, path: tuple = ()) -> dict:
    if hasattr(type(td), "_tc_field_names"):
        raise TypeError(
            f"TensorDict.{api}: a {type(td).__name__} (a TensorClass) cannot be rebuilt from "
            f"a description by the receiver (that would import its class by name). Send "
            f"instance.to_tensordict() and rebuild it with "
            f"{type(td).__name__}.from_tensordict(...) on the receiver."
        )
    entries: dict = {}
    for key, value in td._data.items():
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.is_nested:
                raise TypeError(
                    f"TensorDict.{api}: the leaf {(*path, key)!r} is not a dense tensor; "
                    f"only dense tensors can be sent."
                )
            entries[key] = {"shape": list(value.shape), "dtype": str(value.dtype)}
        elif getattr(type(value), "_is_tensor_collection", False):
            entries[key] = _describe(value, api, (*path, key))
        else:
            raise TypeError(
                f"TensorDict.{api}: the entry {(*path, key)!r} holds a "
                f"{type(value).__name__}, which is not sent (only tensors travel). Hint: "
                f"send td.exclude(...) without it, or keep such values out of the message."
            )
    return {"batch_size": list(td.batch_size), "entries": entries}


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name[len("torch.") :], None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype) or not name.startswith("torch."):
        raise ValueError(f"TensorDict.from_remote_init: unknown dtype {name!r} in the description.")
    return dtype


def _sizes(value: Any, what: str) -> list:
    if not isinstance(value, list) or not all(type(s) is int and s >= 0 for s in value):
        raise ValueError(
            f"TensorDict.from_remote_init: {what} must be a list of non-negative ints, got "
            f"{str(value)[:80]}."
        )
    if math.prod(value) > _MAX_ELEMENTS:
        raise ValueError(f"TensorDict.from_remote_init: {what} {value} is too large.")
    return value


def _build(cls: type, description: Any, device: Any, path: tuple = ()) -> Any:
    if not isinstance(description, dict) or not isinstance(description.get("entries"), dict):
        raise ValueError(
            f"TensorDict.from_remote_init: the description at {path!r} is not a TensorDict's."
        )
    batch_size = _sizes(description.get("batch_size"), f"the batch size at {path!r}")
    data = {}
    for key, entry in description["entries"].items():
        if isinstance(entry, dict) and "entries" in entry:
            data[key] = _build(cls, entry, device, (*path, key))
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"TensorDict.from_remote_init: bad entry at {(*path, key)!r}.")
        shape = _sizes(entry.get("shape"), f"the shape of {(*path, key)!r}")
        data[key] = torch.empty(shape, dtype=_dtype(entry.get("dtype")), device=device)
    return cls(data, batch_size=batch_size, device=device)


def init_remote(
    td: Any, dst: int | None = None, group: Any = None, use_broadcast: bool = False
) -> None:
    api = "init_remote"
    _check_ready(api)
    if not use_broadcast:
        if dst is None:
            raise ValueError(f"TensorDict.{api}: pass dst= (the receiver's rank).")
        _check_rank(api, "dst", dst)
    me = dist.get_rank()
    try:
        payload = json.dumps(_describe(td, api)).encode()
    except TypeError:
        # the receivers wait for a length: tell them this rank refused, so they raise too
        refused = torch.tensor([_REFUSED], dtype=torch.int64)
        if use_broadcast:
            dist.broadcast(refused, me, group=group)
        else:
            dist.send(refused, dst, group=group)
        raise
    length = torch.tensor([len(payload)], dtype=torch.int64)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    if use_broadcast:
        dist.broadcast(length, me, group=group)
        dist.broadcast(data, me, group=group)
        broadcast(td, me, group=group, api=api)
        return
    dist.send(length, dst, group=group)
    dist.send(data, dst, group=group)
    send(td, dst, group=group, api=api)


def from_remote_init(
    cls: type, src: int, group: Any = None, device: Any = None, use_broadcast: bool = False
) -> Any:
    api = "from_remote_init"
    _check_ready(api)
    if hasattr(cls, "_tc_field_names"):
        raise TypeError(
            f"{cls.__name__}.{api}: receive a TensorDict (td = TensorDict.{api}(src=...)), "
            f"then build the instance with {cls.__name__}.from_tensordict(td): the sender "
            f"sends no class."
        )
    _check_rank(api, "src", src)
    length = torch.zeros(1, dtype=torch.int64)
    (dist.broadcast if use_broadcast else dist.recv)(length, src, group=group)
    size = int(length.item())
    if size == _REFUSED:
        raise ValueError(
            f"TensorDict.{api}: rank {src} refused to send its TensorDict (it holds something "
            f"that cannot travel: see that rank's error), so nothing was received."
        )
    if not 0 < size <= _MAX_DESCRIPTION_BYTES:
        raise ValueError(
            f"TensorDict.{api}: rank {src} announced a description of {size} bytes (at most "
            f"{_MAX_DESCRIPTION_BYTES}); it did not call init_remote, or not with this mode."
        )
    data = torch.empty(size, dtype=torch.uint8)
    (dist.broadcast if use_broadcast else dist.recv)(data, src, group=group)
    td, problem = None, None
    try:
        td = _build(cls, json.loads(data.numpy().tobytes().decode()), device)
    except RecursionError:  # a tree nested past the interpreter's limit
        problem = ValueError(f"TensorDict.{api}: rank {src} sent a description nested too deep.")
    except (UnicodeDecodeError, json.JSONDecodeError):
        problem = ValueError(f"TensorDict.{api}: rank {src} sent a description that is not JSON.")
    except (ValueError, TypeError, RuntimeError) as error:  # keys, sizes, allocation
        problem = error
    if problem is not None:
        # the values still come: take them (and refuse them) so that the sender does not wait
        empty = cls({}, batch_size=[])
        # the description's own problem is the one to report, not the mismatch it causes
        with contextlib.suppress(ValueError, RuntimeError):
            if use_broadcast:  # every rank raises: the sender is told another rank refused
                broadcast(empty, src, group=group, refusal=problem, api=api)
            else:  # a refused message is consumed all the same
                recv(empty, src, group=group, api=api)
        raise problem
    if use_broadcast:
        broadcast(td, src, group=group, api=api)
    else:
        recv(td, src, group=group, api=api)
    return td


class RemoteMixin:
    """Methods of every container: ``init_remote`` and the class method ``from_remote_init``
    (both refuse a TensorClass, naming the way through a TensorDict)."""

    __slots__ = ()

    def init_remote(
        self,
        dst: int | None = None,
        group: Any = None,
        device: Any = None,
        use_broadcast: bool = False,
    ) -> None:
        """Send this TensorDict's structure and values to a rank that does not know them.

        The receiver calls :meth:`from_remote_init`. The structure travels as JSON (keys,
        batch sizes, shapes, dtypes), then the values as one message; later batches of the
        same structure go with :meth:`send` into the TensorDict the receiver got. With
        ``use_broadcast=True`` every rank of ``group`` takes part (the others call
        ``from_remote_init(src=..., use_broadcast=True)``). Only tensors travel: a
        non-tensor entry, or a TensorClass (whose class the receiver would have to import
        by name), is a ``TypeError``, and the receivers are told, so that they raise
        ``ValueError`` instead of waiting. ``device`` is accepted and changes nothing here (the
        receiver chooses its own).

        Example:
            >>> # rank 0: batch.init_remote(dst=1)
            >>> # rank 1: batch = TensorDict.from_remote_init(src=0)
        """
        init_remote(self, dst, group=group, use_broadcast=use_broadcast)

    @classmethod
    def from_remote_init(
        cls, src: int, group: Any = None, device: Any = None, use_broadcast: bool = False
    ):
        """Receive what :meth:`init_remote` sends from rank ``src``: a new TensorDict.

        The description is checked before anything is allocated (sizes, dtypes, the tree),
        and the values are received as by :meth:`recv`. ``device``: where to build it.

        Example:
            >>> # rank 1: batch = TensorDict.from_remote_init(src=0)
        """
        return from_remote_init(cls, src, group=group, device=device, use_broadcast=use_broadcast)
