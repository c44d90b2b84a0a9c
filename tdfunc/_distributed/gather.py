"""``all_gather`` and ``scatter``: one container per rank, built from the messages of
``collectives.py``, with their checks.

tensordict sends the structure of the containers as pickled metadata, so that a rank can
start from ``TensorDict()``; the messages of tdfunc carry no pickled data, so every
rank holds a container of the structure it receives (the same keys, shapes and dtypes on
every rank), and a structure that differs is a ``ValueError`` naming it, as for
``broadcast``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .collectives import _check_rank, _check_ready, _mutable_refusal, broadcast
from .layout import _digest, _Layout


def _global_rank(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def _non_tensor_path(td: Any, path: tuple = ()) -> tuple | None:
    for key, value in td._to_tensordict_view()._data.items():
        if isinstance(value, torch.Tensor):
            continue
        if not getattr(type(value), "_is_tensor_collection", False):
            return (*path, key)
        found = _non_tensor_path(value, (*path, key))
        if found is not None:
            return found
    return None


def _gather_refusal(td: Any) -> BaseException | None:
    """Only tensors travel: a piece holding this rank's non-tensor values would pass
    them off as another rank's."""
    path = _non_tensor_path(td)
    if path is None:
        return None
    return TypeError(
        f"{type(td).__name__}.all_gather: the entry {path!r} is not a tensor; only tensors "
        f"travel, so the other ranks' pieces could not hold their own value of it. Hint: "
        f"gather td.exclude({path[0]!r}) and exchange such values another way "
        f"(torch.distributed.all_gather_object)."
    )


def _batch_sizes(td: Any, path: tuple = ()) -> list:
    sizes = [(path, tuple(td.batch_size))]
    for key, value in td._to_tensordict_view()._data.items():
        if getattr(type(value), "_is_tensor_collection", False):
            sizes.extend(_batch_sizes(value, (*path, key)))
    return sizes


def all_gather(td: Any, *, group: Any = None) -> list:
    _check_ready("all_gather")
    # a frozen TensorClass is received as a TensorDict and rebuilt: the pieces are new
    frozen = getattr(type(td), "_tc_frozen", False)
    refusal = _gather_refusal(td)
    # every piece is built with this rank's batch sizes: they must be every rank's
    salt = _digest(repr(_batch_sizes(td)))
    pieces = []
    for rank in range(dist.get_world_size(group)):
        # a new container per rank, of this rank's structure, written by rank `rank`
        piece = td.to_tensordict() if frozen else td.clone()
        broadcast(
            piece,
            _global_rank(group, rank),
            group=group,
            refusal=refusal if rank == 0 else None,
            api="all_gather",
            salt=salt if rank == 0 else 0,
        )
        pieces.append(type(td).from_tensordict(piece) if frozen else piece)
    return pieces


def _pieces_problem(td: Any, tensordicts: Any, world: int, group: Any) -> BaseException | None:
    if not isinstance(tensordicts, (list, tuple)) or len(tensordicts) != world:
        described = (
            f"{len(tensordicts)} items"
            if isinstance(tensordicts, (list, tuple))
            else type(tensordicts).__name__
        )
        return ValueError(
            f"{type(td).__name__}.scatter: on the source rank, tensordicts must be a list "
            f"with one container per rank of the group ({world}), got {described}."
        )
    for rank, piece in enumerate(tensordicts):
        if not hasattr(piece, "_to_tensordict_view"):
            return TypeError(
                f"{type(td).__name__}.scatter: tensordicts[{rank}] is a "
                f"{type(piece).__name__}, not a TensorDict or a TensorClass."
            )
    # the source's own piece is copied locally, never compared by a broadcast: check it here
    own = next((r for r in range(world) if _global_rank(group, r) == dist.get_rank()), None)
    if own is None:  # not in the group: torch.distributed refuses the broadcasts
        return None
    try:
        same = _Layout(td, "scatter").digest == _Layout(tensordicts[own], "scatter").digest
    except TypeError:  # a leaf that cannot travel: the broadcasts refuse it
        return None
    if not same:
        return ValueError(
            f"{type(td).__name__}.scatter: on the source rank, tensordicts[{own}] (this rank's "
            f"piece) does not have the structure of the receiving container: "
            f"{_Layout(tensordicts[own], 'scatter').describe()} against "
            f"{_Layout(td, 'scatter').describe()}. Hint: every piece and every rank's container "
            f"must have the same keys, shapes and dtypes."
        )
    return None


def scatter(td: Any, src: int, tensordicts: Any = None, *, group: Any = None) -> Any:
    """One broadcast per rank from ``src``: the rank it is for writes it into ``td``, the
    others into a scratch copy. A refusal on any rank (a bad list on the source, a frozen
    container) is raised by every rank in the first round, before anything is written."""
    _check_ready("scatter")
    _check_rank("scatter", "src", src)
    world = dist.get_world_size(group)
    me = dist.get_rank()
    problem = _mutable_refusal(td, "scatter")
    if me == src and problem is None:
        problem = _pieces_problem(td, tensordicts, world, group)
    scratch = None
    for rank in range(world):
        destination = _global_rank(group, rank)
        if me == src:
            buffer = td if problem is not None else tensordicts[rank]
        elif me == destination:
            buffer = td
        else:
            scratch = td.clone() if scratch is None else scratch
            buffer = scratch
        refusal = problem if rank == 0 else None
        broadcast(buffer, src, group=group, refusal=refusal, api="scatter")
        if me == src == destination:
            td.update_(tensordicts[rank])
    return td


class GatherMixin:
    """Methods of ``TensorDict`` and ``TensorClass``: ``all_gather``, ``scatter``."""

    __slots__ = ()

    def all_gather(self, *, group: Any = None) -> list:
        """Every rank's container, on every rank: a list of new containers in rank order.

        Every rank of ``group`` calls it with a container of the same structure (keys,
        shapes, dtypes, batch sizes), or every rank raises ``ValueError``. Only tensors travel: a
        non-tensor entry on any rank is a ``TypeError`` there, and every other rank raises
        too (exclude such entries and exchange them another way).

        Example:
            >>> # every rank: pieces = metrics.all_gather(); len(pieces) == world_size
        """
        return all_gather(self, group=group)

    def scatter(self, src: int, tensordicts: Any = None, *, group: Any = None, device: Any = None):
        """Write ``tensordicts[rank]`` of rank ``src`` into each rank's container; returns it.

        On rank ``src``, ``tensordicts`` holds one container per rank of ``group``, in rank
        order; the others ignore it. Every rank's container and every piece have the same
        structure (keys, shapes, dtypes), or every rank raises ``ValueError``; a list of the
        wrong length on the source is refused by every rank too, before anything is written.
        ``device`` is accepted for tensordict's signature: the values arrive on the device of
        the container they are written into.

        Example:
            >>> # rank 0: shard = TensorDict(x=torch.zeros(4), batch_size=[4])
            >>> # rank 0: shard.scatter(src=0, tensordicts=[piece_0, piece_1])
            >>> # rank 1: shard.scatter(src=0)  # shard now holds piece_1's values
        """
        return scatter(self, src, tensordicts, group=group)
