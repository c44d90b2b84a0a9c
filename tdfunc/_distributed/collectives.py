"""Sending TensorDicts between processes with ``torch.distributed``.

tdfunc builds no cluster machinery: every method rides on an initialised
process group (gloo on CPU, NCCL on GPU) and accepts ``group=``. Ranks are
global ranks, as in ``torch.distributed``.

Point-to-point wire format (``send``/``isend`` to ``recv``/``irecv``). Leaves
are ordered by key path (insertion order does not matter) and every message
starts with a 64-byte int64 header: magic, format version, structure digest
(keys, shapes, dtypes), key digest, payload bytes, leaf count, sender rank,
payload message count. Then:

- gloo, payload up to ``_INLINE_BYTES``: the payload follows the header in the
  same message (gloo accepts a message shorter than the receive buffer, so the
  receiver posts one buffer that fits either kind of first message).
- otherwise: the header alone on ``tag``, then on ``tag + 2**30`` the small
  leaves packed in one buffer and each big leaf on its own, without copies
  when contiguous on both sides.

The receiver checks the digest before it posts any payload receive and sizes
those from the header, so a structure mismatch is a clear ``ValueError`` on
the receiver. Whenever the receiver refuses a message (another structure, a
leaf that cannot be received, a frozen TensorClass in the receiving
container), it still receives the header and drains the payload before it
raises, so the sender never waits for a receive that will not come (and a
too-small receive, which aborts gloo, is never posted). A peer that dies or
stops mid-message makes gloo raise within the process group's timeout.

The methods follow tensordict: ``isend`` and ``irecv`` wait for the data
unless ``return_early=True`` / ``return_premature=True``, which return a
:class:`DistributedWork` handle; ``init_tag`` is the message's tag.

Receives are matched in the order they are posted, so the receives of one
channel (group, source, tag) run in order on a helper thread (``irecv``) or
inline (``recv``); gloo's send handles report completion only once waited on,
so ``isend`` handles are waited on by a helper thread too, which also keeps a
dropped handle's send alive until it completes.

Collectives (``broadcast``, ``all_reduce``, ``reduce``) first all-reduce the
structure digests and a refusal flag (one small message) so that a mismatch,
or a rank that cannot take the result (a frozen TensorClass inside, a leaf
that cannot be communicated), raises on every rank instead of hanging, then
move one flat buffer per dtype (``broadcast``: byte buffers, split like
point-to-point payloads).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors

from .layout import _HEADER_BYTES, _HEADER_FORMAT, _MAGIC, _VERSION, _copy_into, _Layout, _path_str
from .work import _POST_LOCK, DistributedWork, _Channel, _channel

_PAYLOAD_TAG = 1 << 30
# gloo: a payload up to this size travels inside the header message (one message instead of
# two round trips); the receiver keeps one buffer of this size per (source, tag)
_INLINE_BYTES = 1 << 20


# ---------------------------------------------------------------- checks
class ProcessGroupMissingError(RuntimeError, ValueError):
    """No process group: a ``RuntimeError``, and a ``ValueError`` as torch.distributed's
    own calls raise (and tensordict's with them), so either ``except`` clause catches it."""


def _check_ready(api: str, tag: int = 0) -> None:
    if type(tag) is not int or not 0 <= tag < _PAYLOAD_TAG:
        raise ValueError(
            f"TensorDict.{api}: tag must be an int in [0, 2**30) (tdfunc uses tag + 2**30 "
            f"for the payload), got {tag!r}."
        )
    if not dist.is_available() or not dist.is_initialized():
        raise ProcessGroupMissingError(
            f"TensorDict.{api}: torch.distributed is not initialised. Call "
            f"torch.distributed.init_process_group(backend='gloo', ...) on every rank first."
        )


def _check_rank(api: str, name: str, rank: Any) -> None:
    if type(rank) is not int:
        raise TypeError(f"TensorDict.{api}: {name} must be an int rank, got {rank!r}.")


# ---------------------------------------------------------------- point to point
def _is_gloo(group: Any) -> bool:
    return dist.get_backend(group) == "gloo"


def _post_send(td: Any, dst: int, group: Any, tag: int, api: str) -> list:
    _check_ready(api, tag)
    _check_rank(api, "dst", dst)
    layout = _Layout(td, api)
    gloo = _is_gloo(group)
    if gloo and layout.total <= _INLINE_BYTES:  # one message: header and payload
        message = layout.pack(list(range(len(layout.tensors))), layout.header(0, True))
        return [dist.isend(message, dst, group=group, tag=tag)]
    segments = layout.segments(split=gloo)
    header = layout.header(len(segments), False)
    buffers = [layout.pack(indices) for indices in segments]
    with _POST_LOCK:  # the messages of one send stay consecutive, whatever other threads do
        works = [dist.isend(header, dst, group=group, tag=tag)]
        for buffer in buffers:
            works.append(dist.isend(buffer, dst, group=group, tag=tag + _PAYLOAD_TAG))
    return works


def send(td: Any, dst: int, *, group: Any = None, tag: int = 0, api: str = "send") -> None:
    for work in _post_send(td, dst, group, tag, api):
        work.wait()


def isend(td: Any, dst: int, *, group: Any = None, tag: int = 0) -> DistributedWork:
    works = _post_send(td, dst, group, tag, "isend")
    handle = DistributedWork("isend")

    def wait_all(channel: _Channel) -> None:
        for work in works:
            work.wait()

    _channel(group, "send", dst, tag).submit(handle, wait_all)
    return handle


def _drain(header: tuple, group: Any, tag: int, device: torch.device) -> None:
    """Receive and discard the payload announced by ``header`` (so the sender completes)."""
    total, sender, flags = header[4], header[6], header[7]
    messages = 0 if flags & 1 else flags >> 1
    if messages:
        scratch = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
        for _ in range(messages):  # each message is at most `total` bytes
            dist.recv(scratch, sender, group=group, tag=tag + _PAYLOAD_TAG)


def _receive(td: Any, src: int | None, group: Any, tag: int, api: str, channel: _Channel) -> int:
    refusal: BaseException | None = None
    try:
        layout = _Layout(td, api, receive=True)
        device = layout.device
    except (TypeError, RuntimeError, AttributeError) as error:  # a container that cannot receive
        refusal, device = error, torch.device("cpu")
    gloo = _is_gloo(group)
    # gloo accepts a message shorter than the receive buffer: one buffer fits both kinds of
    # first message (header alone, or header and a payload of up to _INLINE_BYTES)
    first = channel.scratch(_HEADER_BYTES + (_INLINE_BYTES if gloo else 0), device)
    dist.recv(first, src, group=group, tag=tag)
    header = struct.unpack(_HEADER_FORMAT, first[:_HEADER_BYTES].cpu().numpy().tobytes())
    magic, version, digest, key_digest, total, count, sender, flags = header
    if magic != _MAGIC or version != _VERSION:
        raise RuntimeError(
            f"TensorDict.{api}: the message received on tag {tag} is not a tdfunc TensorDict "
            f"header (magic {magic:#x}, version {version}); was it sent with "
            f"TensorDict.send/isend of the same tdfunc version?"
        )
    if refusal is not None:  # the sender must not wait for receives that will not come
        _drain(header, group, tag, device)
        refusal.add_note(
            f"The TensorDict sent by rank {sender} (tag {tag}) was received and discarded."
        )
        raise refusal
    if digest != layout.digest or total != layout.total:
        _drain(header, group, tag, device)  # the sender completes, the channel stays usable
        what = (
            "the keys differ"
            if key_digest != layout.key_digest
            else "same keys, but some shapes or dtypes differ"
        )
        raise ValueError(
            f"TensorDict.{api}: the TensorDict sent by rank {sender} (tag {tag}) does not have "
            f"the structure of the receiving one: {what}. Sender: {count} tensor leaves, "
            f"{total} bytes. Receiver expects {layout.describe()}. The payload was received "
            f"and discarded. Hint: the receiving TensorDict must have the same keys, shapes "
            f"and dtypes as the sent one (e.g. torch.zeros_like(template) on every rank)."
        )
    if flags & 1:  # inline: the payload came with the header
        layout.unpack(list(range(len(layout.tensors))), first[_HEADER_BYTES:])
        return sender
    pending = []
    for indices in layout.segments(split=gloo):
        buffer, must_unpack = layout.receive_buffer(indices)
        work = dist.irecv(buffer, sender, group=group, tag=tag + _PAYLOAD_TAG)
        pending.append((work, indices, buffer, must_unpack))
    for work, indices, buffer, must_unpack in pending:
        work.wait()  # type: ignore[union-attr]
        if must_unpack:
            layout.unpack(indices, buffer)
    return sender


def recv(
    td: Any, src: int | None = None, *, group: Any = None, tag: int = 0, api: str = "recv"
) -> int:
    _check_ready(api, tag)
    if src is not None:
        _check_rank(api, "src", src)
    channel = _channel(group, "recv", src, tag)
    return channel.run_now(partial(_receive, td, src, group, tag, api))


def irecv(td: Any, src: int | None = None, *, group: Any = None, tag: int = 0):
    _check_ready("irecv", tag)
    if src is not None:
        _check_rank("irecv", "src", src)
    # a container that cannot receive is refused by the job, after it drained the message
    handle = DistributedWork("irecv")
    _channel(group, "recv", src, tag).submit(
        handle, partial(_receive, td, src, group, tag, "irecv")
    )
    return handle


# ---------------------------------------------------------------- collectives
def _collective_layout(
    td: Any,
    group: Any,
    api: str,
    writes: bool,
    refusal: BaseException | None = None,
    salt: int = 0,
) -> _Layout:
    """The layout, once every rank of ``group`` agreed on the structure.

    All-reduces (max) the digests and their negations, and a refusal flag: a rank
    whose container cannot take the result (a frozen TensorClass, an expanded leaf) refuses,
    and then every rank raises instead of the others waiting for it. ``refusal``:
    the method's own (a frozen instance refuses every collective), sent the same way.
    """
    layout: _Layout | None = None
    try:
        layout = _Layout(td, api, receive=writes and refusal is None)
    except (RuntimeError, AttributeError) as error:  # a frozen TensorClass: refused
        refusal = error
        layout = _Layout(td, api)
    except TypeError as error:  # a leaf that cannot be communicated: no layout at all
        refusal = error
    # digests, bytes, "refuses", "has no layout" (its digests mean nothing)
    # ``salt``: more of the structure that must agree (all_gather's batch sizes)
    digest = 0 if layout is None else layout.digest ^ salt
    values = [0, 0, 0, 1, 1] if layout is None else [digest, layout.key_digest, layout.total]
    if layout is not None:
        values += [int(refusal is not None), 0]
    device = torch.device("cpu") if layout is None else layout.device
    probe = torch.tensor(values + [-v for v in values], dtype=torch.int64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
    high = probe[:5].tolist()
    low = [-v for v in probe[5:].tolist()]
    if layout is None:
        raise refusal  # type: ignore[misc]
    if high[4]:
        raise RuntimeError(
            f"TensorDict.{api}: another rank of the group holds a leaf that cannot be "
            f"communicated (see that rank's error), so no rank ran {api}."
        )
    if high[:3] != low[:3]:
        what = "the keys differ" if high[1] != low[1] else "some shapes or dtypes differ"
        if salt and high[1] == low[1]:
            what += ", or the batch sizes"
        raise ValueError(
            f"TensorDict.{api}: the TensorDicts on the ranks of the group do not have the same "
            f"structure ({what}). This rank (rank {dist.get_rank()}) has {layout.describe()}. "
            f"Hint: every rank must call {api} with TensorDicts of the same keys, shapes and "
            f"dtypes."
        )
    if refusal is not None:
        raise refusal
    if high[3]:
        raise RuntimeError(
            f"TensorDict.{api}: another rank of the group refused (see that rank's error: a "
            f"frozen TensorClass, an expanded leaf, or an entry that cannot travel), so no "
            f"rank ran {api}."
        )
    return layout


def _result(td: Any, works: list, finish: Callable | None, async_op: bool, api: str):
    handle = DistributedWork(api, works=works, finish=finish)
    if async_op:
        return handle
    handle.wait()
    return td


def broadcast(
    td: Any,
    src: int,
    *,
    group: Any = None,
    async_op: bool = False,
    refusal: Any = None,
    api: str = "broadcast",
    salt: int = 0,
):
    _check_ready(api)
    _check_rank(api, "src", src)
    is_src = dist.get_rank() == src
    layout = _collective_layout(td, group, api, not is_src, refusal, salt)
    works, outputs = [], []
    for indices in layout.segments(split=True):
        if is_src:
            buffer, must_unpack = layout.pack(indices), False
        else:
            buffer, must_unpack = layout.receive_buffer(indices)
        works.append(dist.broadcast(buffer, src, group=group, async_op=True))
        if must_unpack:
            outputs.append((indices, buffer))

    def finish() -> None:
        for indices, buffer in outputs:
            layout.unpack(indices, buffer)

    return _result(td, works, finish, async_op, api)


def _reduce_op(op: Any, layout: _Layout, api: str) -> tuple[Any, bool]:
    """gloo has no AVG: reduce with SUM and divide by the world size afterwards."""
    if op != dist.ReduceOp.AVG:
        return op, False
    for path, tensor in zip(layout.paths, layout.tensors):
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise TypeError(
                f"TensorDict.{api}: ReduceOp.AVG needs floating-point leaves; the value at key "
                f"{_path_str(path)} has dtype {tensor.dtype}. Hint: use ReduceOp.SUM."
            )
    return dist.ReduceOp.SUM, True


def _reduction(
    td: Any, dst: int | None, op: Any, group: Any, async_op: bool, api: str, refusal: Any = None
):
    _check_ready(api)
    receives = dst is None or dist.get_rank() == dst
    layout = _collective_layout(td, group, api, receives, refusal)
    op, average = _reduce_op(op, layout, api)
    world = dist.get_world_size(group)
    works, outputs = [], []
    for members in layout.groups(range(len(layout.tensors))):
        tensors = [layout.tensors[i] for i in members]
        in_place = dst is None and len(tensors) == 1 and tensors[0].is_contiguous()
        if in_place:
            buffer = tensors[0].detach()  # no copy
        else:  # reduce may use the buffer as scratch on the other ranks: always a copy
            with torch.no_grad():
                if len(tensors) == 1:  # (_flatten_dense_tensors returns a view for one)
                    buffer = tensors[0].reshape(-1).clone()
                else:
                    buffer = _flatten_dense_tensors(tensors)
        if dst is None:
            works.append(dist.all_reduce(buffer, op=op, group=group, async_op=True))
        else:
            works.append(dist.reduce(buffer, dst, op=op, group=group, async_op=True))
        outputs.append((tensors, buffer, in_place))

    @torch.no_grad()
    def finish() -> None:
        if not receives:
            return
        for tensors, buffer, in_place in outputs:
            if average:
                buffer.div_(world)
            if not in_place:
                _copy_into(tensors, buffer)

    return _result(td, works, finish, async_op, api)


def all_reduce(
    td: Any, op: Any = None, *, group: Any = None, async_op: bool = False, refusal: Any = None
):
    op = dist.ReduceOp.SUM if op is None else op
    return _reduction(td, None, op, group, async_op, "all_reduce", refusal)


def reduce(
    td: Any,
    dst: int,
    op: Any = None,
    *,
    group: Any = None,
    async_op: bool = False,
    refusal: Any = None,
):
    _check_rank("reduce", "dst", dst)
    op = dist.ReduceOp.SUM if op is None else op
    return _reduction(td, dst, op, group, async_op, "reduce", refusal)


# ---------------------------------------------------------------- methods
def _tag(api: str, tag: int, init_tag: int, pseudo_rand: bool, consolidated: bool = False) -> int:
    """``tag``, or tensordict's ``init_tag`` (one message: the same role)."""
    if type(pseudo_rand) is not bool:
        raise TypeError(f"TensorDict.{api}: pseudo_rand must be a bool, got {pseudo_rand!r}.")
    if type(consolidated) is not bool:
        raise TypeError(f"TensorDict.{api}: consolidated must be a bool, got {consolidated!r}.")
    if init_tag and tag and init_tag != tag:
        raise ValueError(
            f"TensorDict.{api}: got tag={tag!r} and init_tag={init_tag!r}; they name the same "
            f"thing (the message's tag): pass one of them."
        )
    return tag or init_tag


def _mutable_refusal(td: Any, api: str) -> BaseException | None:
    """Why ``td`` refuses ``api`` (a frozen instance), to be raised on every rank.

    Raised at once without a process group; with one, the other ranks are told
    first (see :func:`_collective_layout`), so that none waits for this rank.
    """
    try:
        td._check_mutable(api)
    except (RuntimeError, AttributeError) as error:  # FrozenInstanceError is an AttributeError
        if not (dist.is_available() and dist.is_initialized()):
            raise
        return error
    return None


# The functions above take any container (TensorDict or TensorClass); TensorClass
# forwards its methods to them.
class DistributedMixin:
    """Methods of ``TensorDict``: send, recv, isend, irecv, broadcast, all_reduce, reduce."""

    __slots__ = ()

    def send(
        self,
        dst: int,
        *,
        group: Any = None,
        tag: int = 0,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        consolidated: bool = False,
    ) -> None:
        """Send every tensor leaf to rank ``dst`` (blocking) as one structured message.

        The receiver calls :meth:`recv` (or :meth:`irecv`) on a TensorDict with the
        same keys, shapes and dtypes. Non-tensor leaves are not sent. If the
        receiver refuses the message (another structure, a frozen TensorClass
        inside), it still receives and discards it, so this call completes.

        Args:
            dst: the global rank to send to.
            group: the process group (default: the default group).
            tag: matches sends to receives; tdfunc also uses ``tag + 2**30``.
            init_tag: tensordict's name for ``tag`` (tensordict tags each leaf
                from ``init_tag`` on; tdfunc sends one message, tagged with it).
            pseudo_rand: accepted for tensordict's signature; tdfunc's single
                message needs no per-leaf tag sequence, so it changes nothing.
            consolidated: accepted for tensordict's signature (its one-message
                transfer of a consolidated container); every tdfunc send is one
                message, so either value sends the same, to any matching receiver.

        Example:
            >>> # on every rank: td = TensorDict({"a": torch.zeros(3), "b": {"c": torch.zeros(())}})
            >>> # rank 1: td.send(dst=0)
            >>> # rank 0: td.recv(src=1)  # td now holds rank 1's values
        """
        tag = _tag("send", tag, init_tag, pseudo_rand, consolidated)
        send(self, dst, group=group, tag=tag)

    def isend(
        self,
        dst: int,
        *,
        group: Any = None,
        tag: int = 0,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        return_early: bool = False,
    ) -> DistributedWork | None:
        """Send to rank ``dst``; as in tensordict, waits until the data left unless
        ``return_early=True``, which returns a :class:`DistributedWork` handle at once.

        With ``return_early=True`` do not modify the tensors before ``handle.wait()``;
        a dropped handle does not cancel the send. Other arguments as in :meth:`send`.

        Example:
            >>> # rank 1: data.isend(dst=0)  # returns once rank 0 has the data
            >>> # rank 1: work = data.isend(dst=0, return_early=True); ...; work.wait()
        """
        tag = _tag("isend", tag, init_tag, pseudo_rand)
        if return_early:
            return isend(self, dst, group=group, tag=tag)
        send(self, dst, group=group, tag=tag, api="isend")
        return None

    def recv(
        self,
        src: int | None = None,
        *,
        group: Any = None,
        tag: int = 0,
        init_tag: int = 0,
        pseudo_rand: bool = False,
        consolidated: bool = False,
    ) -> int:
        """Receive into this TensorDict's tensors (in place); returns the sender's rank.

        Raises ``ValueError`` if the sent TensorDict has other keys, shapes or dtypes,
        and refuses to write into a frozen TensorClass (the container or a nested
        one); in both cases the message is received and discarded first, so the
        sender does not hang, and nothing is written. A sender that dies or stops
        mid-message makes it raise within the process group's timeout.

        Args:
            src: the global rank to receive from; ``None`` accepts any rank (do not
                mix it with pending receives from a given rank on the same tag).
            group: the process group (default: the default group).
            tag: must match the sender's ``tag``.
            init_tag: tensordict's name for ``tag`` (see :meth:`send`).
            pseudo_rand: accepted for tensordict's signature (see :meth:`send`).
            consolidated: accepted for tensordict's signature (see :meth:`send`); the
                receiver need not be consolidated.

        Example:
            >>> # rank 0: data = TensorDict({"a": torch.zeros(())}, []); data.recv(src=1)
        """
        tag = _tag("recv", tag, init_tag, pseudo_rand, consolidated)
        return recv(self, src, group=group, tag=tag)

    def irecv(
        self,
        src: int | None = None,
        *,
        group: Any = None,
        tag: int = 0,
        return_premature: bool = False,
        init_tag: int = 0,
        pseudo_rand: bool = False,
    ) -> int | DistributedWork:
        """Receive into this TensorDict; as in tensordict, waits until the data is in place
        (and returns the sender's rank) unless ``return_premature=True``.

        With ``return_premature=True`` it returns a :class:`DistributedWork` handle at
        once: the data is in place after ``handle.wait()``. Receives from one source
        and tag complete in the order they were posted, also when a handle is
        dropped. Errors as in :meth:`recv` (raised by ``wait()`` for a handle).

        Example:
            >>> # rank 0: data.irecv(src=1)  # data holds rank 1's values when it returns
            >>> # rank 0: work = data.irecv(src=1, return_premature=True); ...; work.wait()
        """
        tag = _tag("irecv", tag, init_tag, pseudo_rand)
        if return_premature:
            return irecv(self, src, group=group, tag=tag)
        return recv(self, src, group=group, tag=tag, api="irecv")

    def broadcast(self, src: int, *, group: Any = None, async_op: bool = False):
        """Overwrite every rank's tensors with those of rank ``src`` (in place).

        Every rank of ``group`` must call it with a TensorDict of the same structure,
        or every rank raises ``ValueError``. Returns self (or a handle with
        ``async_op=True``).

        Example:
            >>> # every rank: params.broadcast(src=0)  # all ranks start from rank 0's params
        """
        refusal = _mutable_refusal(self, "broadcast")
        return broadcast(self, src, group=group, async_op=async_op, refusal=refusal)

    def all_reduce(self, op: Any = None, *, group: Any = None, async_op: bool = False):
        """Reduce every leaf across the ranks of ``group``, in place on every rank.

        One flat buffer per dtype is reduced. ``op`` is a ``torch.distributed.ReduceOp``
        (default ``SUM``); ``AVG`` works on gloo too (sum, then divide). Returns self
        (or a handle with ``async_op=True``).

        Example:
            >>> # every rank: grads.all_reduce(torch.distributed.ReduceOp.AVG)
        """
        refusal = _mutable_refusal(self, "all_reduce")
        return all_reduce(self, op, group=group, async_op=async_op, refusal=refusal)

    def reduce(self, dst: int, op: Any = None, *, group: Any = None, async_op: bool = False):
        """Reduce every leaf across ``group`` into rank ``dst``'s tensors (in place).

        The other ranks' tensors are left unchanged. Returns self (or a handle with
        ``async_op=True``).

        Example:
            >>> # every rank: metrics.reduce(dst=0)  # rank 0 holds the sums
        """
        refusal = _mutable_refusal(self, "reduce")
        return reduce(self, dst, op, group=group, async_op=async_op, refusal=refusal)
