"""The members of an ``Ensemble``: selections, per-member state dicts, shared tensors.

- :class:`EnsembleMembers` runs K of the N members on the batched path. It holds
  no tensors: every call reads the ensemble's stacked parameters and takes the
  selected rows (views for a slice, a gather otherwise), so optimizer steps on
  the ensemble are seen at once and gradients flow back into the stacked
  parameters.
- ``member_state_dicts`` / ``load_member_state_dicts``: the ensemble as N
  ordinary state dicts (keys as the template module's ``state_dict()``), and
  back, in place.
- Shared tensors (``Ensemble(..., shared=[...])``) are kept once, unstacked;
  ``check_shared`` validates the names and that every member holds the same value.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from .._core.helpers.tracing import compiling as _is_compiling
from .layout import _rebuild
from .member_inputs import DEFAULT

if TYPE_CHECKING:
    from .._assembly import TensorDict
    from .ensemble import Ensemble


def member_index(index: Any, num_members: int, api: str) -> tuple[Any, int, bool]:
    """``index`` as ``(slice or LongTensor, K, squeeze)``; ``squeeze`` for an int."""
    if isinstance(index, bool):
        raise TypeError(f"{api}: expected member indices, got a bool.")
    if isinstance(index, int):
        if not -num_members <= index < num_members:
            raise IndexError(
                f"{api}: member {index} is out of range for an ensemble of {num_members} members."
            )
        index %= num_members
        return slice(index, index + 1), 1, True
    if isinstance(index, slice):
        count = len(range(*index.indices(num_members)))
        if count == 0:
            raise IndexError(f"{api}: the slice {index} selects no member of {num_members}.")
        if index.indices(num_members)[2] > 0:
            return index, count, False
        index = list(range(*index.indices(num_members)))  # torch slices step forwards only
    if isinstance(index, torch.Tensor):
        tensor = index
    elif isinstance(index, Sequence) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in index
    ):
        # Checked in Python, not on a tensor: a check of a tensor's values is a
        # data-dependent guard that torch.export and fullgraph compiles refuse.
        positions = list(index)
        if not positions:
            raise IndexError(f"{api}: the index selects no member.")
        outside = [i for i in positions if not -num_members <= i < num_members]
        if outside:
            raise IndexError(
                f"{api}: member indices {outside} out of range for an ensemble of "
                f"{num_members} members."
            )
        tensor = torch.tensor([i % num_members for i in positions], dtype=torch.long)
        return tensor, len(positions), False
    else:
        raise TypeError(
            f"{api}: expected an int, a slice, a sequence of ints or an integer/bool tensor, "
            f"got {type(index).__name__}."
        )
    if tensor.dtype == torch.bool:
        if tensor.shape != (num_members,):
            raise IndexError(
                f"{api}: a boolean mask must have shape [{num_members}], got {list(tensor.shape)}."
            )
        tensor = tensor.nonzero().flatten()
    if tensor.dim() != 1 or tensor.dtype not in (torch.long, torch.int, torch.int16, torch.int8):
        raise TypeError(
            f"{api}: an index tensor must be 1-d with an integer dtype, got shape "
            f"{list(tensor.shape)} and dtype {tensor.dtype}."
        )
    if tensor.numel() == 0:
        raise IndexError(f"{api}: the index selects no member.")
    if _is_compiling():
        # The values are data while tracing: a branch on them is a guard that
        # torch.export and fullgraph compiles refuse, so the range is checked
        # when the graph runs (a compiled gather would wrap -5 round silently).
        tensor = tensor.long()
        torch._assert_async(
            ((tensor >= -num_members) & (tensor < num_members)).all(),
            f"{api}: a member index is out of range for an ensemble of {num_members} members.",
        )
        return tensor % num_members, tensor.numel(), False
    low, high = (int(v) for v in torch.aminmax(tensor))  # one pass: a selection per step is common
    if low < -num_members or high >= num_members:
        raise IndexError(
            f"{api}: member indices {tensor.tolist()} out of range for an ensemble of "
            f"{num_members} members."
        )
    if tensor.dtype != torch.long:
        tensor = tensor.long()
    return (tensor if low >= 0 else tensor % num_members), tensor.numel(), False


class EnsembleMembers:
    """K members of an :class:`~tdfunc.Ensemble`, run as batched kernels.

    Made by ``ensemble.select_members(index)`` or ``ensemble[index]``. It is a
    view: no tensor is copied when it is made, each call reads the ensemble's
    current parameters, and gradients reach the ensemble's stacked parameters
    (rows of members not selected get zero gradients). Outputs carry a leading
    dim of size K (none for an int index, which selects one member).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from tdfunc import Ensemble
        >>> ensemble = Ensemble(*[nn.Linear(3, 1) for _ in range(10)])
        >>> pair = ensemble.select_members(torch.tensor([7, 2]))
        >>> q = pair(torch.randn(5, 3))
        >>> q.shape, len(pair)
        (torch.Size([2, 5, 1]), 2)
        >>> q.sum().backward()
        >>> ensemble.stacked.weight.grad.abs().sum(dim=(1, 2)).nonzero().flatten().tolist()
        [2, 7]
    """

    __slots__ = ("_count", "_ensemble", "_index", "_run_index", "_squeeze")

    def __init__(self, ensemble: Ensemble, index: Any) -> None:
        self._ensemble = ensemble
        self._index, self._count, self._squeeze = member_index(
            index, ensemble.num_members, "Ensemble.select_members"
        )
        # The forward runs on views for a slice of step 1; a strided slice's views
        # are not contiguous, and a vmapped layer's in-place update of one (running
        # statistics) is lost, so those rows are gathered and written back instead.
        self._run_index = self._index
        if isinstance(self._index, slice) and self._index.indices(ensemble.num_members)[2] != 1:
            self._run_index = torch.tensor(self.indices, dtype=torch.long)

    def __len__(self) -> int:
        return self._count

    @property
    def indices(self) -> list[int]:
        """The selected members' positions in the ensemble."""
        if isinstance(self._index, slice):
            return list(range(*self._index.indices(self._ensemble.num_members)))
        return self._index.tolist()

    @property
    def params(self) -> TensorDict:
        """The selected members' parameters, batch ``[K]`` (a slice gives views)."""
        return self._ensemble.params[self._index]

    def __call__(self, *args, in_dims: Any = DEFAULT, **kwargs) -> Any:
        """The selected members' outputs; per-member inputs carry K slices."""
        ensemble = self._ensemble
        leaves = ensemble._member_leaves(self._run_index, self._count)
        if isinstance(self._run_index, slice):  # views: in-place updates reach the ensemble
            out = ensemble._run(leaves, args, kwargs, in_dims, self._count)
        elif _is_compiling():
            out = ensemble._run(leaves, args, kwargs, in_dims, self._count)
            self._write_back_traced(leaves)
        else:
            versions = [None if leaf.is_inference() else leaf._version for leaf in leaves]
            out = ensemble._run(leaves, args, kwargs, in_dims, self._count)
            self._write_back(leaves, versions)
        if self._squeeze:
            return torch.utils._pytree.tree_map(
                lambda v: v[0] if isinstance(v, torch.Tensor) else v, out
            )
        return out

    def _write_back(self, leaves: tuple, versions: list) -> None:
        # The selected rows were gathered (copies): what the forward updated in
        # place (a batch norm's running statistics in training) goes back to the
        # ensemble's tensors, as it would in the members run one by one. A kernel's
        # own in-place update (F.batch_norm's running statistics) does not bump the
        # version counter, so a buffer's rows are compared by value.
        ensemble, index = self._ensemble, self._run_index
        changed = []
        for i, (leaf, version) in enumerate(zip(leaves, versions)):
            if i in ensemble._shared:
                continue
            owner, key = ensemble._slots[i]
            own = owner[key]
            if (version is not None and leaf._version != version) or (
                not isinstance(own, torch.nn.Parameter) and not _same(leaf, select(own, index))
            ):
                changed.append(i)
        if not changed:
            return
        if torch.unique(index).numel() != index.numel():
            names = [ensemble._named_slots()[i][0] for i in changed]
            raise ValueError(
                f"Ensemble.select_members: the forward updated {names} in place (running "
                f"statistics in training mode), but the selection {index.tolist()} repeats "
                f"members, whose updates would follow one another. Select each member once, "
                f"or call .eval() first."
            )
        with torch.no_grad():
            for i in changed:
                owner, key = ensemble._slots[i]
                target = owner[key]
                target.index_copy_(0, index.to(target.device), leaves[i])

    def _write_back_traced(self, leaves: tuple) -> None:
        # _write_back's rules without a data-dependent branch, which torch.export
        # and fullgraph compiles refuse: a buffer's selected rows are written back
        # whether or not the forward changed them (unchanged rows rewrite their own
        # values), and a repeated member whose rows changed fails at run time.
        # Version counters are symbolic while tracing, so parameters (which a
        # forward does not write) are not compared: that would read every
        # selected parameter on every call.
        ensemble, index = self._ensemble, self._run_index
        buffers = []
        for i, leaf in enumerate(leaves):
            owner, key = ensemble._slots[i]
            if i not in ensemble._shared and not isinstance(owner[key], torch.nn.Parameter):
                buffers.append((i, leaf, owner[key]))
        if not buffers:
            return
        ordered = torch.sort(index).values
        repeats = (ordered[1:] == ordered[:-1]).any()
        # Every check before the first write, and outside no_grad: a compiled
        # graph that fails inside a no_grad region leaves grad mode off.
        for i, leaf, own in buffers:
            name = ensemble._named_slots()[i][0]
            torch._assert_async(
                ~repeats | _same_values(leaf.detach(), select(own.detach(), index)),
                f"Ensemble.select_members: the forward updated {name!r} in place, but the "
                f"selection repeats members, whose updates would follow one another. Select "
                f"each member once, or call .eval() first.",
            )
        with torch.no_grad():
            for _, leaf, own in buffers:
                own.index_copy_(0, index.to(own.device), leaf)

    def __repr__(self) -> str:
        return f"EnsembleMembers(indices={self.indices}, of {self._ensemble.num_members})"


def _same(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Equal values, NaN equal to NaN."""
    if left.is_floating_point() or left.is_complex():
        return bool(_same_values(left, right))
    return torch.equal(left, right)


def _same_values(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Equal values, NaN equal to NaN, as a 0-d bool tensor (no sync)."""
    if left.is_floating_point() or left.is_complex():
        return ((left == right) | (left.isnan() & right.isnan())).all()
    return (left == right).all()


def select(leaf: torch.Tensor, index: Any) -> torch.Tensor:
    """The selected members' rows of a stacked tensor (a view for a slice)."""
    if isinstance(index, slice):
        return leaf[index]
    if index.device != leaf.device:
        index = index.to(leaf.device)
    return torch.index_select(leaf, 0, index)


# ------------------------------------------------------------------ state dicts
def member_state_dicts(ensemble: Ensemble, keep_vars: bool = False) -> list[dict]:
    """Each member's ``state_dict()``, as the template module would give it."""
    # the attribute, not the property: handing the template out turns on a per-call check
    template = ensemble._template
    params = ensemble.params
    out = []
    for k in range(ensemble.num_members):
        with params[k].to_module(template):
            out.append(dict(template.state_dict(keep_vars=keep_vars)))
    return out


def load_member_state_dicts(
    ensemble: Ensemble, state_dicts: Iterable[Mapping[str, Any]], strict: bool = True
) -> None:
    """Copy N member state dicts into the stacked tensors in place (see ``Ensemble``).

    Each state dict goes through the template's own ``load_state_dict``, as it
    would in a loop over N modules (load hooks, dtype casts, tied weights and
    ``strict=False`` act per member), but into a scratch copy of the stacked
    tensors: the ensemble's tensors are written only once every member loaded.
    """
    api = "Ensemble.load_member_state_dicts"
    state_dicts = list(state_dicts)
    members = ensemble.num_members
    if len(state_dicts) != members:
        raise ValueError(
            f"{api}: expected {members} state dicts (one per member), got {len(state_dicts)}."
        )
    # the attribute, not the property: handing the template out turns on a per-call check
    template = ensemble._template
    shapes = {name: value.shape for name, value in template.state_dict(keep_vars=True).items()}
    for position, state in enumerate(state_dicts):
        _check_values(api, position, state, shapes)
    named = ensemble._named_slots()
    shared = ensemble._shared_names
    with torch.no_grad():
        scratch = [
            owner[key].detach().expand(members, *owner[key].shape).clone()
            if name in shared
            else owner[key].detach().clone()
            for name, owner, key in named
        ]
        loaded = []  # per member: the names its state dict wrote
        for position, state in enumerate(state_dicts):
            rows = _rebuild(ensemble._layout, [leaf[position] for leaf in scratch], [0])
            with rows.to_module(template):
                try:
                    result = template.load_state_dict(state, strict=False)
                except RuntimeError as error:  # a load hook's refusal, say
                    raise ValueError(
                        f"{api}: state dict {position} does not load into member {position}: "
                        f"{error}"
                    ) from None
            if strict and (result.missing_keys or result.unexpected_keys):
                hint = _prefix_hint(sorted(result.unexpected_keys), set(shapes))
                raise KeyError(
                    f"{api}: state dict {position} does not match the members' keys: missing "
                    f"{sorted(result.missing_keys)}, unexpected "
                    f"{sorted(result.unexpected_keys)}.{hint}"
                )
            loaded.append(set(result.missing_keys))
        updates = []
        for (name, owner, key), value in zip(named, scratch):
            if name in shared:
                givers = [k for k in range(members) if name not in loaded[k]]
                if not givers:
                    continue
                first = givers[0]
                for position in givers[1:]:
                    if not torch.equal(value[position], value[first]):
                        raise ValueError(
                            f"{api}: {name!r} is shared by the members, but state dict "
                            f"{position} holds a different value than state dict {first}."
                        )
                value = value[first]
            updates.append((owner[key], value))
        for target, value in updates:  # everything loaded and checked: nothing half written
            target.copy_(value)


def _check_values(api: str, position: int, state: Any, expected: dict) -> None:
    """Types and shapes of one state dict, checked before any member loads."""
    if not isinstance(state, Mapping):
        raise TypeError(
            f"{api}: state dict {position} is a {type(state).__name__}, expected a mapping "
            f"of names to tensors."
        )
    for name, shape in expected.items():
        if name not in state:
            continue
        value = state[name]
        if not torch.overrides.is_tensor_like(value):
            raise TypeError(
                f"{api}: state dict {position} holds a {type(value).__name__!r} at {name!r}, "
                f"expected a tensor of shape {list(shape)} (one member's {name!r})."
            )
        # A 1-element vector loads into a 0-d tensor, as module.load_state_dict allows.
        if value.shape != shape and not (len(shape) == 0 and tuple(value.shape) == (1,)):
            raise ValueError(
                f"{api}: state dict {position} holds {name!r} with shape {list(value.shape)}, "
                f"expected {list(shape)} (one member's {name!r})."
            )


def _prefix_hint(unexpected: list, expected: set) -> str:
    if not unexpected:
        return ""
    name = unexpected[0]
    for cut in range(1, name.count(".") + 1):
        stripped = name.split(".", cut)[-1]
        if stripped in expected:
            prefix = name[: len(name) - len(stripped)]
            return (
                f" The keys carry a prefix ({prefix!r}...): strip it, e.g. "
                f"{{k[len({prefix!r}):]: v for k, v in sd.items() if k.startswith({prefix!r})}}."
            )
    close = difflib.get_close_matches(name, sorted(expected), n=1)
    return f" Did you mean {close[0]!r} for {name!r}?" if close else ""


# ------------------------------------------------------------------ shared tensors
def check_shared(names: Iterable[str], stacked: TensorDict, api: str = "Ensemble") -> frozenset:
    """The ``shared`` names, checked: they exist and every member holds one value."""
    if isinstance(names, str):
        raise TypeError(f"{api}: shared must be a list of names, got the string {names!r}.")
    names = list(names)
    flat = {".".join(key) if isinstance(key, tuple) else key: key for key in
            stacked.keys(include_nested=True, leaves_only=True)}  # fmt: skip
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{api}: shared names must be strings, got {name!r}.")
        if name not in flat:
            close = difflib.get_close_matches(name, sorted(flat), n=3)
            raise KeyError(
                f"{api}: shared={names!r}: the members have no parameter or buffer {name!r}. "
                f"Names are those of model.named_parameters() / named_buffers()"
                + (f"; close: {close}." if close else ".")
            )
        value = stacked.get(flat[name])
        for k in range(1, value.shape[0]):
            if not torch.equal(value[k], value[0]):
                raise ValueError(
                    f"{api}: {name!r} is listed in shared, but member {k} holds a different "
                    f"value than member 0. Build the members around one shared tensor (the same "
                    f"nn.Parameter), or give them equal values."
                )
    return frozenset(names)


# ------------------------------------------------------------------ optimizer groups
def optimizer_groups(source: Any) -> list[dict] | None:
    """``source``'s parameters as param groups that declare their member dim, or ``None``.

    ``source`` an ``Ensemble`` or a selection of its members (the optimizer then
    steps the ensemble's tensors): the stacked parameters carry the member dim
    at dim 0 (``"member_dim": True``), the tensors kept ``shared`` carry none
    (``"member_dim": False``), whatever their sizes. Anything else gives ``None``.
    """
    if isinstance(source, EnsembleMembers):
        source = source._ensemble
    slots = getattr(source, "_slots", None)
    positions = getattr(source, "_shared", None)
    if not isinstance(source, torch.nn.Module) or slots is None or positions is None:
        return None
    shared = {id(owner[key]) for owner, key in (slots[i] for i in positions)}
    stacked, kept = [], []
    for param in source.parameters():
        (kept if id(param) in shared else stacked).append(param)
    groups = [{"params": stacked, "member_dim": True}] if stacked else []
    if kept:
        groups.append({"params": kept, "member_dim": False})
    return groups
