"""``Ensemble``: N copies of one architecture run as batched kernels.

The members' parameters are stacked along a new leading dim and registered as
``nn.Parameter``s of the ensemble (under ``stacked``, mirroring the model's
module names), so ``torch.optim``, ``state_dict`` and ``.to()`` see them like
any other module's. One *template* copy of the model supplies the code; it is
kept out of the module tree (its own tensors are moved to the ``meta`` device:
they are never used, so they take no memory).

The forward runs a *batched plan* built once per train/eval mode
(``batched/``): every layer with a batched form runs once for all members on
member-leading activations ``[N, B, ...]`` (a ``Linear`` is one ``baddbmm``),
custom ``forward`` code runs through its ``torch.fx`` rewrite, and what cannot
be batched runs under ``vmap`` for that part only. When nothing can be
batched, the whole forward runs as before: the stacked tensors are swapped into
the template with :meth:`TensorDict.to_module` inside ``torch.func.vmap``
(construction checks that the swap fills every slot).

What stays fixed is computed once: a *layout* (nested tuples holding the
``_parameters`` and ``_buffers`` dicts of the ``stacked`` modules, in the
TensorDict's key order) and the flat list of leaf slots. The forward reads the
leaves through those dicts (not cached tensors, so ``.to()``,
``load_state_dict(assign=True)`` and ``copy.deepcopy`` stay right) into a flat
tuple that the plan's steps index by position. Views of the leaves that steps
need (``weight.mT``) are kept between calls while the leaves are the same
objects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from .._assembly import TensorDict
from .._modules.slots import iter_slots
from . import BatchContext, build_batched_plan
from .cache import DerivedCache
from .checks import check_members

_RANDOMNESS = ("error", "different", "same")
_SCALAR = torch.Size([])


class _Pinned(tuple):
    """A tuple that pytree functions treat as a leaf (a class they do not know).

    The layout and the slots hold the ``_parameters`` and ``_buffers`` dicts of
    the ``stacked`` modules. Tools that snapshot a module's attributes with
    ``tree_map`` and write the snapshot back (``torch.export`` does, around
    its trace) would copy plain tuples and dicts, and the ensemble would then
    read the tensors of the trace instead of its own.
    """

    __slots__ = ()


class _Stacked(nn.Module):
    """One level of stacked parameters, named like the template's module at that level."""

    def extra_repr(self) -> str:
        shapes = [
            f"{name}: {tuple(p.shape)}" for name, p in self._parameters.items() if p is not None
        ]
        shapes += [
            f"{name}: {tuple(b.shape)} (buffer)"
            for name, b in self._buffers.items()
            if b is not None
        ]
        return ", ".join(shapes)


def _reset_parameters(model: nn.Module) -> None:
    """Re-initialise ``model`` in place with its submodules' ``reset_parameters``.

    Raises ``ValueError`` when some parameter is owned by a module that has no
    ``reset_parameters`` (the copies would silently all start the same).
    """
    uncovered = []
    for prefix, module in model.named_modules(remove_duplicate=True):
        reset = getattr(module, "reset_parameters", None) or getattr(
            module, "_reset_parameters", None
        )
        if callable(reset):
            reset()
        else:
            uncovered += [
                f"{prefix}.{name}" if prefix else name
                for name, value in module._parameters.items()
                if value is not None
            ]
    if uncovered:
        raise ValueError(
            f"Ensemble: cannot make independent initialisations: the parameters {uncovered} "
            f"belong to modules without a reset_parameters() method, so every member would "
            f"start from the same values. Pass init=fn (a function that re-initialises a "
            f"module in place), or pass N models: Ensemble(*[make_model() for _ in range(n)])."
        )


def _fresh_copies(model: nn.Module, num_members: int, init: Callable | None) -> list:
    copies = []
    for _ in range(num_members):
        member = copy.deepcopy(model)
        with torch.no_grad():
            if init is None:
                _reset_parameters(member)
            else:
                init(member)
        copies.append(member)
    return copies


def _to_meta(module: nn.Module) -> nn.Module:
    """Move ``module``'s tensors to ``meta`` in place, keeping tied tensors tied.

    (``module.to("meta")`` converts a tied parameter once per slot, untying it.)
    """
    converted: dict[int, Any] = {}
    for slot in list(iter_slots(module, remove_duplicate=True)):
        value = slot.value
        if value is None:
            continue
        new = converted.get(id(value))
        if new is None:
            new = value.detach().to("meta")
            if isinstance(value, nn.Parameter):
                new = nn.Parameter(new, requires_grad=value.requires_grad)
            converted[id(value)] = new
        slot.owner[slot.name] = new
    return module


def _named_slots(module: nn.Module):
    for slot in iter_slots(module):
        yield slot.path, slot.value


def _register(stacked: TensorDict, template: nn.Module, path: tuple) -> tuple[nn.Module, tuple]:
    """Mirror ``stacked`` as a tree of ``_Stacked`` modules; return it and its layout.

    A layout entry is ``(key, owner_dict, None)`` for a leaf (read as
    ``owner_dict[key]``) or ``(key, None, child_layout)`` for a nested level.
    """
    holder = _Stacked()
    layout: list[tuple[str, Any, Any]] = []
    for key, value in stacked._data.items():
        if isinstance(value, TensorDict):
            child_module: Any = template._modules[key]
            child, child_layout = _register(value, child_module, path + (key,))
            if not child_layout:
                continue  # a module without tensors (an activation): no level to swap
            holder.add_module(key, child)
            layout.append((key, None, child_layout))
        elif isinstance(value, torch.Tensor):
            if key in template._parameters:
                original: Any = template._parameters[key]
                holder.register_parameter(
                    key, nn.Parameter(value.detach(), requires_grad=original.requires_grad)
                )
                layout.append((key, holder._parameters, None))
            else:
                persistent = key not in template._non_persistent_buffers_set
                holder.register_buffer(key, value.detach(), persistent=persistent)
                layout.append((key, holder._buffers, None))
        else:
            raise TypeError(
                f"Ensemble: expected tensors and submodules only, found "
                f"{type(value).__name__} at key {path + (key,)!r}."
            )
    return holder, tuple(layout)


def _build(layout: tuple, batch_size: torch.Size) -> TensorDict:
    data = {}
    for key, owner, child in layout:
        data[key] = owner[key] if child is None else _build(child, batch_size)
    return TensorDict._new_unsafe(data, batch_size)


def _slots(layout: tuple) -> list:
    """The (owner dict, key) of every leaf, in layout order."""
    out = []
    for key, owner, child in layout:
        if child is None:
            out.append((owner, key))
        else:
            out += _slots(child)
    return out


def _slot_index(layout: tuple, template: nn.Module) -> dict:
    """``(id(module), name) -> leaf position`` for every tensor slot of ``template``
    (a tied tensor's slots all point to its one leaf)."""
    positions: dict[str, int] = {}

    def walk(layout: tuple, prefix: str) -> None:
        for key, _, child in layout:
            if child is None:
                positions[prefix + key] = len(positions)
            else:
                walk(child, f"{prefix}{key}.")

    walk(layout, "")
    index, by_identity, pending = {}, {}, []
    for path, module, _, name, value, _ in iter_slots(template):
        if value is None:
            continue
        position = positions.get(path)
        if position is None:
            pending.append((module, name, value))
        else:
            index[(id(module), name)] = position
            by_identity[id(value)] = position
    for module, name, value in pending:
        index[(id(module), name)] = by_identity[id(value)]
    return index


def _lead_inputs(args: tuple, in_dims: Any, members: int) -> tuple:
    """The positional inputs with the member dim first (a shared input is expanded)."""
    out = []
    for position, value in enumerate(args):
        dim = in_dims[position] if isinstance(in_dims, tuple) else in_dims
        out.append(_lead_input(value, dim, members))
    return tuple(out)


def _lead_input(value: Any, dim: int | None, members: int) -> Any:
    if isinstance(value, torch.Tensor):
        if dim is None:
            return value.expand(members, *value.shape)
        if value.shape[dim] != members:
            raise ValueError(
                f"Ensemble: an input has size {value.shape[dim]} in its member dim {dim} "
                f"(in_dims), expected {members} (one slice per member)."
            )
        return value if dim == 0 else value.movedim(dim, 0)
    if isinstance(value, (tuple, list, dict)):
        return torch.utils._pytree.tree_map(lambda v: _lead_input(v, dim, members), value)
    return value


def _leaves_of(layout: tuple, td: TensorDict, out: list, path: tuple) -> list:
    """The leaves of ``td`` in layout order; ``td`` must have the layout's keys."""
    data = td._to_tensordict_view()._data
    if len(data) != len(layout):
        expected = sorted(key for key, _, _ in layout)
        raise KeyError(
            f"Ensemble: the parameters at {path!r} must have the keys {expected}, got "
            f"{sorted(data)}. Pass a TensorDict shaped like ensemble.params."
        )
    for key, _, child in layout:
        value = data.get(key)
        if value is None:
            raise KeyError(
                f"Ensemble: the parameters have no key {path + (key,)!r}. Pass a TensorDict "
                f"shaped like ensemble.params."
            )
        if child is None:
            out.append(value)
        else:
            _leaves_of(child, value, out, path + (key,))
    return out


def _rebuild(layout: tuple, leaves, position: list) -> TensorDict:
    """A TensorDict (batch ``[]``) of ``leaves`` in the layout's structure."""
    data = {}
    for key, _, child in layout:
        if child is None:
            data[key] = leaves[position[0]]
            position[0] += 1
        else:
            data[key] = _rebuild(child, leaves, position)
    return TensorDict._new_unsafe(data, _SCALAR)


def _check_in_dims(in_dims: Any) -> Any:
    if in_dims is None or isinstance(in_dims, int):
        return in_dims
    if isinstance(in_dims, (tuple, list)):
        return tuple(in_dims)
    raise TypeError(
        f"Ensemble: in_dims must be None (input shared by all members), an int (the member "
        f"dim of every input, usually 0) or a tuple with one entry per positional input; got "
        f"{type(in_dims).__name__}."
    )


class Ensemble(nn.Module):
    """N models of one architecture, stacked and run as batched kernels.

    Build it from N models (``Ensemble(m1, m2, m3)``), or from one model and a
    number of members (``Ensemble(model, num_members=8)``): each member is then a
    deep copy with fresh parameters (``reset_parameters()`` of every submodule,
    or ``init(copy)`` when given). The members' parameters are stacked along dim
    0 and registered as this module's parameters, so ``ensemble.parameters()``
    go to a ``torch.optim`` optimizer and ``state_dict`` holds them (keys
    ``stacked.<module path>.<name>``, shape ``[N, ...]``).

    The forward runs every member on the inputs and stacks the outputs along a
    new dim 0. By default every member gets the same inputs (``in_dims=None``);
    with ``in_dims=0`` input ``i`` carries one slice per member along dim 0.
    Each layer runs once for all members (batched kernels on the stacked
    parameters); parts without a batched form run under ``torch.func.vmap``,
    with the same results. :attr:`batched_summary` (also in the ``repr``) says
    which; :func:`~tdfunc.register_batched` adds a batched form for a layer type.

    Args:
        *models: the members (same class and parameter shapes), or one model
            when ``num_members`` is given. A single list or tuple of models works too.
        num_members: make this many fresh copies of the one model given.
        init: with ``num_members``: a function that re-initialises a module in
            place, used instead of ``reset_parameters``.
        in_dims: ``None`` (shared inputs), an int (every positional input has the
            member dim there) or a tuple with one ``int | None`` per positional
            input. Keyword inputs are always shared.
        randomness: as in ``torch.func.vmap``: ``"different"`` (default: members
            draw independent random numbers, e.g. dropout masks, like separate
            models would), ``"same"`` or ``"error"``.
        chunk_size: as in ``torch.func.vmap``: run the members this many at a
            time to bound memory (``None``: all at once).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
        >>> ensemble = Ensemble(model, num_members=5)
        >>> ensemble(torch.randn(10, 3)).shape
        torch.Size([5, 10, 1])
        >>> optimizer = torch.optim.SGD(ensemble.parameters(), lr=0.1)
        >>> ensemble.member(2)(torch.randn(10, 3)).shape
        torch.Size([10, 1])
    """

    _template: nn.Module
    _layout: tuple
    _slots: tuple

    def __init__(
        self,
        *models: nn.Module,
        num_members: int | None = None,
        init: Callable[[nn.Module], Any] | None = None,
        in_dims: int | Sequence[int | None] | None = None,
        randomness: str = "different",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__()
        if len(models) == 1 and isinstance(models[0], (list, tuple, nn.ModuleList)):
            models = tuple(models[0])
        for position, model in enumerate(models):
            if not isinstance(model, nn.Module):
                raise TypeError(
                    f"Ensemble: expected nn.Module members, got {type(model).__name__} at "
                    f"position {position}."
                )
        if num_members is not None:
            if len(models) != 1:
                raise ValueError(
                    f"Ensemble: with num_members, pass exactly one model to copy; got "
                    f"{len(models)} models. Use Ensemble(*models) to stack given models."
                )
            if not isinstance(num_members, int) or num_members < 1:
                raise ValueError(
                    f"Ensemble: num_members must be a positive int, got {num_members!r}."
                )
            models = tuple(_fresh_copies(models[0], num_members, init))
        elif init is not None:
            raise ValueError(
                "Ensemble: init re-initialises the copies made with num_members; it cannot be "
                "used with N given models (initialise them yourself)."
            )
        if not models:
            raise ValueError(
                "Ensemble: expected at least one model, e.g. Ensemble(m1, m2) or "
                "Ensemble(model, num_members=8)."
            )
        check_members(models)
        stacked = TensorDict.from_modules(*models)
        template = copy.deepcopy(models[0])
        self.stacked, layout = _register(stacked, template, ())
        self._layout = _Pinned(layout)
        if not self._layout:
            raise ValueError(
                f"Ensemble: the model ({type(template).__name__}) has no parameters or "
                f"buffers, so its members would all be the same."
            )
        self._slots = _Pinned(_slots(self._layout))
        # Outside the module tree: the ensemble must not register (or move) these tensors.
        object.__setattr__(self, "_template", _to_meta(template))
        self._prepare_swap()
        self._num_members = len(models)
        self._batch_size = torch.Size([len(models)])
        self._context = BatchContext(len(self._slots))
        self.training = template.training  # members given in eval mode make an eval ensemble
        self.in_dims = in_dims
        self.randomness = randomness
        self.chunk_size = chunk_size
        self._derived = DerivedCache()
        self._plan_for_mode()

    # ------------------------------------------------------------- configuration
    @property
    def in_dims(self) -> int | tuple | None:
        """Where the member dim is in the positional inputs (``None``: shared inputs)."""
        return self._in_dims

    @in_dims.setter
    def in_dims(self, value) -> None:
        self._in_dims = _check_in_dims(value)
        self._fast_entry = value is None and getattr(self, "_chunk_size", None) is None

    @property
    def randomness(self) -> str:
        """``torch.func.vmap``'s ``randomness`` for the forward."""
        return self._randomness

    @randomness.setter
    def randomness(self, value: str) -> None:
        if value not in _RANDOMNESS:
            raise ValueError(f"Ensemble: randomness must be one of {_RANDOMNESS}, got {value!r}.")
        self._randomness = value
        self._context.randomness = value

    @property
    def chunk_size(self) -> int | None:
        """``torch.func.vmap``'s ``chunk_size`` for the forward."""
        return self._chunk_size

    @chunk_size.setter
    def chunk_size(self, value: int | None) -> None:
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"Ensemble: chunk_size must be None or a positive int, got {value!r}.")
        self._chunk_size = value
        self._fast_entry = value is None and self._in_dims is None

    @property
    def num_members(self) -> int:
        """The number of members N."""
        return self._num_members

    def __len__(self) -> int:
        return self._num_members

    @property
    def template(self) -> nn.Module:
        """The module the members' parameters are swapped into (its own tensors are on ``meta``)."""
        return self._template

    @property
    def params(self) -> TensorDict:
        """The stacked parameters and buffers, batch ``[N]``; the leaves are this module's own.

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 3) for _ in range(4)])
            >>> ensemble.params["weight"] is ensemble.stacked.weight
            True
        """
        return _build(self._layout, self._batch_size)

    # ------------------------------------------------------------------ running
    def call_member(self, params: TensorDict, *args, **kwargs):
        """Run the template with one member's parameters (no vmap).

        The building block for your own transforms, e.g. a vmapped ``grad`` step:

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> x, y = torch.randn(8, 2), torch.randn(8, 1)
            >>> def loss(p, x, y):
            ...     return ((ensemble.call_member(p, x) - y) ** 2).mean()
            >>> grads = torch.func.vmap(torch.func.grad(loss), (0, None, None))(
            ...     ensemble.params, x, y)
            >>> grads["weight"].shape
            torch.Size([3, 1, 2])
        """
        template = self._template
        with params.to_module(template):
            return template(*args, **kwargs)

    def functional_call(self, params: TensorDict, *args, **kwargs):
        """The vmapped forward with the given stacked parameters instead of the registered
        ones (a TensorDict shaped like :attr:`params`); honours ``in_dims``,
        ``randomness`` and ``chunk_size``.

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> zeros = ensemble.params.apply(torch.zeros_like)
            >>> ensemble.functional_call(zeros, torch.randn(4, 2)).abs().sum().item()
            0.0
        """
        return self._run(tuple(_leaves_of(self._layout, params, [], ())), args, kwargs, False)

    def forward(self, *args, **kwargs):
        """Every member's output, stacked along a new dim 0."""
        leaves = tuple([owner[key] for owner, key in self._slots])
        batched = self._batched
        if batched is not None and self._fast_entry and not kwargs and len(args) == 1:
            x = args[0]  # the common call: one input shared by all members
            if isinstance(x, torch.Tensor):
                return batched(self._extended(leaves), x.expand(self._num_members, *x.shape))
        return self._run(leaves, args, kwargs, True)

    @property
    def batched_summary(self) -> str:
        """Which layers run as batched kernels and which under ``vmap`` (also in the repr).

        Example:
            >>> ensemble = Ensemble(nn.Sequential(nn.Linear(2, 4), nn.ReLU()), num_members=3)
            >>> ensemble.batched_summary
            '2/2 layers batched'
        """
        return self._report.summary()

    def _plan_for_mode(self) -> None:
        # One plan per train/eval mode: a traced forward may read self.training.
        mode = self.training
        plans = self.__dict__.setdefault("_plans", {})
        if mode not in plans:
            index = _slot_index(self._layout, self._template)
            plans[mode] = build_batched_plan(self._template, index, self._context)
        self._batched, self._report = plans[mode]

    def _run(self, leaves: tuple, args: tuple, kwargs: dict, own: bool):
        batched = self._batched
        if batched is None:
            return self._run_vmapped(leaves, args, kwargs)
        members = self._num_members
        if self._fast_entry and not kwargs:  # shared inputs, all members at once
            return batched(
                self._extended(leaves) if own else self._context.extend(leaves),
                *[
                    a.expand(members, *a.shape)
                    if isinstance(a, torch.Tensor)
                    else _lead_input(a, None, members)
                    for a in args
                ],
            )
        in_dims = self._in_dims
        if isinstance(in_dims, tuple) and len(in_dims) != len(args):
            raise ValueError(
                f"Ensemble: in_dims has {len(in_dims)} entries but the forward got "
                f"{len(args)} positional inputs; give one int | None per input."
            )
        args = _lead_inputs(args, in_dims, members)
        if kwargs:
            kwargs = {key: _lead_input(value, None, members) for key, value in kwargs.items()}
        chunk = self._chunk_size
        if chunk is None or chunk >= members:
            leaves = self._extended(leaves) if own else self._context.extend(leaves)
            return batched(leaves, *args, **kwargs)
        # A chunk is a slice of members: the stacked leaves are sliced first and
        # the derived leaves made from the slices (a derived leaf such as the
        # [N * out, in] merged weight is not member-leading, slicing it would
        # take rows, not members).
        extend = self._context.extend
        outputs = []
        for start in range(0, members, chunk):
            part = slice(start, start + chunk)
            outputs.append(
                batched(
                    extend(tuple([leaf[part] for leaf in leaves])),
                    *_slice_members(args, part),
                    **_slice_members(kwargs, part),
                )
            )
        return torch.utils._pytree.tree_map(lambda *xs: torch.cat(xs), *outputs)

    def _extended(self, leaves: tuple) -> tuple:
        # The derived leaves (views such as weight.mT) are kept while nothing
        # they depend on changed (batched/cache.py has the rules).
        return self._derived.extend(self._context, leaves)

    def _apply(self, fn, recurse: bool = True):
        # .to() / .double() may swap a parameter's data in place of the object.
        self._derived.clear()
        return super()._apply(fn, recurse)

    def _run_vmapped(self, leaves: tuple, args: tuple, kwargs: dict):
        # vmap sees a flat tuple of tensors, not the nested TensorDict: flattening
        # a tuple is cheaper than a tree of containers, and the member function
        # rebuilds the (unbatched) TensorDict from the layout in a few dict writes.
        in_dims = self._in_dims
        if isinstance(in_dims, tuple):
            if len(in_dims) != len(args):
                raise ValueError(
                    f"Ensemble: in_dims has {len(in_dims)} entries but the forward got "
                    f"{len(args)} positional inputs; give one int | None per input."
                )
            dims = (0, *in_dims)
        else:
            dims = (0,) + (in_dims,) * len(args)
        return torch.func.vmap(
            self._call_leaves,
            in_dims=dims,
            randomness=self._randomness,
            chunk_size=self._chunk_size,
        )(leaves, *args, **kwargs)

    def _call_leaves(self, leaves: tuple, *args, **kwargs):
        template = self._template
        with _rebuild(self._layout, leaves, [0]).to_module(template):
            return template(*args, **kwargs)

    # ------------------------------------------------------------------ members
    def member(self, index: int) -> nn.Module:
        """Member ``index`` as a standalone module: a copy of the model with its own
        ``Parameter``s (cloned: training it does not change the ensemble)."""
        if not isinstance(index, int):
            raise TypeError(f"Ensemble.member: index must be an int, got {type(index).__name__}.")
        if not -self._num_members <= index < self._num_members:
            raise IndexError(
                f"Ensemble.member: index {index} is out of range for an ensemble of "
                f"{self._num_members} members."
            )
        module = copy.deepcopy(self._template)
        params = self.params[index].apply(lambda tensor: tensor.detach().clone())
        handle = params.to_module(module)
        handle.commit()
        return module

    def _prepare_swap(self) -> None:
        # Checks that the swap fills every slot of the template: a leftover meta
        # tensor would not fail, it would compute garbage (an op mixing cpu and
        # meta tensors returns uninitialised data). Also caches the swap plan.
        template = self._template
        own = {id(t) for t in template.parameters()} | {id(t) for t in template.buffers()}
        leaves = [owner[key] for owner, key in self._slots]
        with _rebuild(self._layout, leaves, [0]).to_module(template):
            missed = [
                name
                for name, value in _named_slots(template)
                if value is not None and id(value) in own
            ]
        if missed:
            raise RuntimeError(
                f"Ensemble: internal error: to_module left the template's slots {missed} "
                f"unswapped. Please report this with the model's definition."
            )

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._prepare_swap()  # a copy (deepcopy, pickle) has a new template
        self._plan_for_mode()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_derived"] = DerivedCache()
        for name in ("_plans", "_batched", "_report"):  # closures over the template
            state.pop(name, None)
        return state

    def train(self, mode: bool = True) -> Ensemble:
        super().train(mode)
        self._template.train(mode)
        self._plan_for_mode()
        return self

    # ------------------------------------------------------------------ training
    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> torch.Tensor:
        """Clip each member's gradient norm on its own; returns the N norms before clipping.

        ``torch.nn.utils.clip_grad_norm_(ensemble.parameters(), ...)`` would
        compute one norm over all members and scale them all by it; this is
        ``clip_grad_norm_`` applied to every member alone, in a few batched ops.

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> ensemble(torch.randn(4, 2)).sum().backward()
            >>> ensemble.clip_grad_norm_(0.5).shape
            torch.Size([3])
        """
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        members = self._num_members
        if not grads:
            return torch.zeros(members)
        norm_type = float(norm_type)
        per_tensor = [
            torch.linalg.vector_norm(g.reshape(members, -1), norm_type, dim=1) for g in grads
        ]
        total = torch.linalg.vector_norm(torch.stack(per_tensor, 1), norm_type, dim=1)
        if error_if_nonfinite and not bool(torch.isfinite(total).all()):
            raise RuntimeError(
                f"Ensemble.clip_grad_norm_: the gradient norm of order {norm_type} is not "
                f"finite for members {torch.nonzero(~torch.isfinite(total)).flatten().tolist()}."
            )
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.to(g.dtype).view(members, *(1,) * (g.dim() - 1)))
        return total

    def extra_repr(self) -> str:
        return (
            f"num_members={self._num_members}, in_dims={self._in_dims}, "
            f"randomness={self._randomness!r}, chunk_size={self._chunk_size}, "
            f"template={type(self._template).__name__}, batched: {self._report.summary()}"
        )


def _slice_members(value: Any, part: slice) -> Any:
    return torch.utils._pytree.tree_map(
        lambda v: v[part] if isinstance(v, torch.Tensor) else v, value
    )
