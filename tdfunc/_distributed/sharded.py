"""Sharding a stacked ensemble by member across the ranks of a process group.

A stacked ensemble is a container of parameters with batch ``[N]`` (one entry
per member, e.g. from ``TensorDict.from_modules``). Rank ``r`` of ``W`` runs a
contiguous block of members (the first ``N % W`` ranks get one more), with
``vmap`` as in one process, and :func:`gather_members` concatenates the ranks'
outputs in rank order, which is member order: the result equals the
single-process ensemble's.

Example (on every rank of an initialised process group)::

    params = TensorDict.from_modules(*models)            # batch [N]
    local = shard_ensemble(params)                       # this rank's members

    def run(p, x):
        with p.to_module(template):
            return template(x)

    pred = gather_members(vmap(run, (0, None))(local, x))  # [N, ...] on every rank
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree

from .._core.helpers.nontensor.leaves import NonTensorStack
from .layout import _digest, _Layout, _path_str


def shard_range(num_members: int, rank: int, world_size: int) -> range:
    """The members that ``rank`` of ``world_size`` runs: a contiguous block, balanced.

    Example:
        >>> [list(shard_range(5, r, 2)) for r in range(2)]
        [[0, 1, 2], [3, 4]]
    """
    for name, value in (("num_members", num_members), ("rank", rank), ("world_size", world_size)):
        if type(value) is not int:
            raise TypeError(f"shard_range: {name} must be an int, got {value!r}.")
    if num_members < 0 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"shard_range: expected num_members >= 0, world_size >= 1 and 0 <= rank < "
            f"world_size, got num_members={num_members}, rank={rank}, world_size={world_size}."
        )
    base, extra = divmod(num_members, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def _rank_and_world(rank: int | None, world_size: int | None, group: Any, api: str):
    if rank is not None and world_size is not None:
        return rank, world_size
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"{api}: pass rank= and world_size=, or initialise torch.distributed first "
            f"(torch.distributed.init_process_group) so that they can be read from the group."
        )
    return (
        dist.get_rank(group) if rank is None else rank,
        dist.get_world_size(group) if world_size is None else world_size,
    )


def shard_ensemble(
    params: Any, rank: int | None = None, world_size: int | None = None, *, group: Any = None
) -> Any:
    """The slice of a stacked ensemble (batch ``[N, ...]``) that this rank runs.

    Args:
        params: a TensorDict / TensorClass (or a tensor) whose first batch dim
            indexes the members.
        rank: this rank's index in ``group``; read from ``torch.distributed`` when omitted.
        world_size: the number of ranks sharing the ensemble; same default.
        group: the process group used for the defaults.

    Returns:
        ``params[start:stop]`` (a view, no copy), members of :func:`shard_range`.
        A rank may get zero members when ``world_size > N``.

    Example:
        >>> params = TensorDict({"w": torch.randn(5, 3)}, [5])
        >>> shard_ensemble(params, rank=1, world_size=2)["w"].shape
        torch.Size([2, 3])
    """
    size = params.shape if isinstance(params, torch.Tensor) else params.batch_size
    if not size:
        raise ValueError(
            "shard_ensemble: params must have a leading member dim (batch size [N, ...]), got "
            "batch size []. Hint: stack the members, e.g. TensorDict.from_modules(*models)."
        )
    rank, world_size = _rank_and_world(rank, world_size, group, "shard_ensemble")
    members = shard_range(size[0], rank, world_size)
    return params[members.start : members.stop]


def _members(pred: Any, is_tensor: bool) -> tuple[list, list, Exception | None]:
    """The key paths and tensor leaves of ``pred``, and why it cannot be gathered (or None)."""
    if is_tensor:
        paths, tensors = [("pred",)], [pred]
    else:
        if not pred.batch_size:
            why = "pred must have a leading member dim (batch size [n, ...]), got batch size []."
            return [], [], ValueError(f"gather_members: {why}")
        try:
            layout = _Layout(pred, "gather_members")
        except TypeError as error:  # a leaf that cannot be gathered (sparse, nested)
            return [], [], error
        paths, tensors = layout.paths, layout.tensors
        if not tensors:
            return [], [], ValueError("gather_members: pred has no tensor leaf to gather.")
        stacked = _first_stack(pred, ())
        if stacked is not None:
            why = (
                f"the value at {_path_str(stacked)} is a stack of non-tensor values (one per "
                f"member); only tensors are gathered, so the result would keep this rank's "
                f"members only. Hint: gather them with torch.distributed.all_gather_object, "
                f"and pass pred.exclude(key) here."
            )
            return paths, tensors, ValueError(f"gather_members: {why}")
    count = tensors[0].shape[0] if tensors[0].dim() else 0
    for path, tensor in zip(paths, tensors):
        if tensor.dim() == 0 or tensor.shape[0] != count:
            why = (
                f"every leaf must start with the member dim ({count}); the value at "
                f"{_path_str(path)} has shape {list(tensor.shape)}."
            )
            return paths, tensors, ValueError(f"gather_members: {why}")
    return paths, tensors, None


def _first_stack(container: Any, prefix: tuple) -> tuple | None:
    """The key path of the first stack of non-tensor values (one per member), or None."""
    for key, value in container._to_tensordict_view()._data.items():
        if isinstance(value, NonTensorStack):
            return prefix + (key,)
        if getattr(type(value), "_is_tensor_collection", False):
            found = _first_stack(value, prefix + (key,))
            if found is not None:
                return found
    return None


def gather_members(pred: Any, *, group: Any = None, dst: int | None = None) -> Any:
    """Concatenate every rank's member outputs along dim 0, in rank (= member) order.

    Ranks may hold different numbers of members (including zero); the other
    dims, keys and dtypes must agree on every rank, or every rank raises
    ``ValueError``. A non-tensor value (one for all members) is kept as this
    rank holds it; a stack of non-tensor values (one per member) is refused on
    every rank, as only tensors are gathered. Two collectives in all: one for
    the member counts and a structure digest, one for the data (a single uint8
    buffer).

    Args:
        pred: a tensor or a TensorDict / TensorClass whose dim 0 indexes this rank's members.
        group: the process group (default: the default group).
        dst: ``None`` gives the result on every rank (all-gather); a global rank
            gives it on that rank only (gather) and ``None`` elsewhere.

    Example:
        >>> # every rank: full = gather_members(vmap(f, (0, None))(local_params, x))
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "gather_members: torch.distributed is not initialised. Call "
            "torch.distributed.init_process_group(...) on every rank first."
        )
    is_tensor = isinstance(pred, torch.Tensor)
    paths, tensors, problem = _members(pred, is_tensor)
    count = tensors[0].shape[0] if tensors and tensors[0].dim() else 0
    features = [t.shape[1:] for t in tensors]
    member_bytes = [f.numel() * t.element_size() for f, t in zip(features, tensors)]
    digest = _digest(
        "\n".join(f"{p!r}\t{t.dtype}\t{tuple(f)}" for p, t, f in zip(paths, tensors, features))
    )
    if tensors:
        device = tensors[0].device
    elif dist.get_backend(group) == "nccl":  # NCCL talks through GPU tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    world = dist.get_world_size(group)

    # a rank that cannot take part says so in the first collective: every rank then
    # raises, and none waits for the data of a rank that gave up
    meta = torch.tensor([count, digest, problem is not None], dtype=torch.int64, device=device)
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta, group=group)
    counts = [int(m[0]) for m in metas]
    if problem is not None:
        raise problem
    refused = [rank for rank, m in enumerate(metas) if int(m[2])]
    if refused:
        raise ValueError(
            f"gather_members: rank {refused[0]} of the group refused its pred (it raised "
            f"there: see that rank's error), so no rank gathered."
        )
    if any(int(m[1]) != digest for m in metas):
        described = ", ".join(
            f"{_path_str(p)}: {str(t.dtype).replace('torch.', '')}[n, *{list(f)}]"
            for p, t, f in zip(paths[:6], tensors[:6], features[:6])
        )
        raise ValueError(
            f"gather_members: the ranks' outputs differ in keys, dtypes or shapes beyond the "
            f"member dim. This rank (rank {dist.get_rank()}) has {described}. Hint: every "
            f"rank must run the same function on inputs of the same shapes."
        )

    longest = max(counts)
    width = sum(member_bytes)
    local = torch.zeros(longest, width, dtype=torch.uint8, device=device)
    offset = 0
    for tensor, size in zip(tensors, member_bytes):
        flat = tensor.detach().reshape(count, -1) if count else tensor.new_empty(0, 1)
        if count and size:
            local[:count, offset : offset + size] = flat.contiguous().view(torch.uint8)
        offset += size

    receives = dst is None or dist.get_rank() == dst
    pieces = [torch.empty_like(local) for _ in range(world)] if receives else []
    if dst is None:
        dist.all_gather(pieces, local, group=group)
    else:
        dist.gather(local, pieces if receives else None, dst=dst, group=group)
        if not receives:
            return None

    rows = torch.cat([piece[:n] for piece, n in zip(pieces, counts)])
    total = rows.shape[0]
    gathered = []
    offset = 0
    for tensor, feature, size in zip(tensors, features, member_bytes):
        columns = rows[:, offset : offset + size].contiguous()
        offset += size
        gathered.append(columns.view(tensor.dtype).view(total, *feature))
    if is_tensor:
        return gathered[0]
    by_id = {id(t): g for t, g in zip(tensors, gathered)}
    leaves, spec = pytree.tree_flatten(pred)
    result = pytree.tree_unflatten([by_id.get(id(leaf), leaf) for leaf in leaves], spec)
    _keep_names(pred, result)
    return result


def _keep_names(source: Any, target: Any) -> None:
    """Give ``target`` (and its nested containers) the dim names of ``source``.

    Rebuilt from a treespec with a longer dim 0, a container loses its names (a
    treespec cannot tell a longer dim from another one); the dims are the same here.
    """
    source, target = source._to_tensordict_view(), target._to_tensordict_view()
    names = source.names
    if any(name is not None for name in names):
        target.names = names
    for key, value in source._data.items():
        if getattr(type(value), "_is_tensor_collection", False):
            _keep_names(value, target._data[key])
