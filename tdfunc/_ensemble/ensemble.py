"""``Ensemble``: N copies of one architecture run as batched kernels.

The members' parameters are stacked along a new leading dim and registered as
``nn.Parameter``s of the ensemble (under ``stacked``, mirroring the model's
module names), so ``torch.optim``, ``state_dict`` and ``.to()`` see them like
any other module's. One *template* copy of the model supplies the code; it is
kept out of the module tree (its own tensors are moved to the ``meta`` device:
they are never used, so they take no memory).

The forward runs a *batched plan* built once per train/eval mode
(``plan.py``, ``layers.py``): every layer with a batched form runs once for all members on
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
from itertools import starmap
from operator import getitem
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

from .._assembly import TensorDict
from .._core.helpers.tracing import compiling as _is_compiling
from .._core.helpers.tracing import jit_tracing as _tracing
from . import BatchContext, build_batched_plan
from . import members as _members
from .cache import DerivedCache
from .checks import check_members
from .explain import Explanation, has_fallbacks, warn_fallbacks
from .layout import (
    _fresh_copies,
    _leaf_names,
    _leaves_of,
    _named_slots,
    _Pinned,
    _rebuild,
    _register,
    _slot_index,
    _slots,
    _store_linear_weights_transposed,
    _to_meta,
    bind_cache,
)
from .member_inputs import DEFAULT, check_in_dims, lead_input, lead_inputs, slice_members
from .plan import consults_fast_path, vmap_call
from .shared import declare_shared
from .template_watch import only_modes_changed, slot_names, template_state, unchanged

_RANDOMNESS = ("error", "different", "same")
# torch's global module hooks (dicts filled in place by register_module_*_hook).
_GLOBAL_HOOKS = (
    _module._global_forward_hooks,
    _module._global_forward_pre_hooks,
    _module._global_backward_hooks,
    _module._global_backward_pre_hooks,
)
_SCALAR = torch.Size([])
# what _plan_for_mode sets: the plans per mode, the one in use, and what it was built for
_PLAN_STATE = ("_plans", "_batched", "_report", "_modal", "_modal_flags")


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
        shared: names (as in ``model.named_parameters()`` / ``named_buffers()``)
            of tensors kept once for all members instead of stacked, e.g. a
            learned bound every member uses. Each member sees the one tensor, so
            its gradient is the sum over the members, as for N modules holding
            the same ``nn.Parameter``. The given members must hold equal values.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Sequential(nn.Linear(3, 16), nn.Tanh(), nn.Linear(16, 1))
        >>> ensemble = Ensemble(model, num_members=5)
        >>> ensemble(torch.randn(10, 3)).shape
        torch.Size([5, 10, 1])
        >>> optimizer = torch.optim.SGD(ensemble.parameters(), lr=0.1)
        >>> ensemble.member(2)(torch.randn(10, 3)).shape
        torch.Size([10, 1])
        >>> ensemble(torch.randn(5, 10, 3), in_dims=0).shape  # one batch per member
        torch.Size([5, 10, 1])
        >>> ensemble[[0, 3]](torch.randn(10, 3)).shape  # two members, batched
        torch.Size([2, 10, 1])
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
        shared: Sequence[str] = (),
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
            models = tuple(_fresh_copies(models[0], num_members, init, shared))
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
        shared_names = _members.check_shared(shared, stacked)
        template = copy.deepcopy(models[0])
        self.stacked, layout = _register(stacked, template, (), shared_names)
        self._layout = _Pinned(layout)
        if not self._layout:
            raise ValueError(
                f"Ensemble: the model ({type(template).__name__}) has no parameters or "
                f"buffers, so its members would all be the same."
            )
        self._shared_names = shared_names
        self._shared = tuple(
            position
            for position, (name, _, _) in enumerate(_leaf_names(self._layout))
            if name in shared_names
        )
        _store_linear_weights_transposed(self._layout, template, set(self._shared))
        self._slots = _Pinned(_slots(self._layout))
        # optimizers given ensemble.parameters() learn here which tensors have no member dim
        declare_shared(self._slots[i][0][self._slots[i][1]] for i in self._shared)
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
        bind_cache(self.stacked, self._derived)
        # __call__ goes straight to _run unless a subclass has its own forward
        self._own_forward = type(self).forward is Ensemble.forward
        self._plan_for_mode()

    # ------------------------------------------------------------- configuration
    @property
    def in_dims(self) -> int | tuple | None:
        """Where the member dim is in the positional inputs (``None``: shared inputs).

        The default for calls that do not pass ``in_dims=`` themselves.
        """
        return self._in_dims

    @in_dims.setter
    def in_dims(self, value) -> None:
        self._in_dims = check_in_dims(value)
        self._refresh_fast()

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
        self._refresh_fast()

    def _refresh_fast(self) -> None:
        # __call__'s fast path, decided once here: one tensor shared by the members
        # (no in_dims), no chunks, a batched plan. Called by whatever changes one of these.
        state = self.__dict__
        state["_fast"] = (
            state.get("_in_dims") is None
            and state.get("_chunk_size") is None
            and state.get("_batched") is not None
        )

    @property
    def num_members(self) -> int:
        """The number of members N."""
        return self._num_members

    def __len__(self) -> int:
        return self._num_members

    @property
    def template(self) -> nn.Module:
        """The module the members' parameters are swapped into (its own tensors are on ``meta``).

        Changing it (an attribute, a hook, a submodule of the same parameters) changes
        every member: the next call builds its plan again.
        """
        self._watch_template()
        return self._template

    def _watch_template(self) -> None:
        # Handed out: from now on every call checks that the plan still describes it.
        state = self.__dict__
        if "_template_seen" not in state:
            template = state["_template"]
            state["_template_seen"] = (template_state(template), slot_names(template))

    def _check_template(self) -> None:
        """Build the plans again if the template changed since they were built.

        Not while ``torch.compile`` traces a call: a change made after the last eager
        call reaches a compiled ensemble at its next eager call, or ``torch._dynamo.reset()``.
        """
        recorded, names = self.__dict__["_template_seen"]
        template = self._template
        if unchanged(recorded):
            return
        if only_modes_changed(recorded, template):  # the plans are kept per mode
            self.__dict__["_template_seen"] = (template_state(template), names)
            return
        now = slot_names(template)
        if now != names:
            added = sorted(set(now) - set(names))
            removed = sorted(set(names) - set(now))
            raise ValueError(
                f"Ensemble: the template's parameters and buffers changed (added {added}, "
                f"removed {removed}); the stacked tensors were made for the template as it "
                f"was. Build a new Ensemble from members of the new structure."
            )
        self._prepare_swap()  # a submodule may have been replaced
        self._derived.clear()
        for name in _PLAN_STATE:
            self.__dict__.pop(name, None)
        self._plan_for_mode()
        self.__dict__["_template_seen"] = (template_state(template), now)

    @property
    def params(self) -> TensorDict:
        """The stacked parameters and buffers, batch ``[N]``; the leaves are this module's own.

        A tensor kept shared (``shared=``) appears expanded to ``[N, ...]`` (a view
        of the one tensor).

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 3) for _ in range(4)])
            >>> ensemble.params["weight"] is ensemble.stacked.weight
            True
        """
        leaves = self._with_shared(tuple([owner[key] for owner, key in self._slots]))
        return _rebuild(self._layout, leaves, [0], self._batch_size)

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

    def functional_call(self, params: TensorDict, *args, in_dims: Any = DEFAULT, **kwargs):
        """The batched forward with the given stacked parameters instead of the registered
        ones: a TensorDict shaped like :attr:`params`, with a leading dim of any
        size K (``ensemble.params[idx]`` runs K members). Honours ``in_dims`` (a
        per-member input carries K slices), ``randomness`` and ``chunk_size``.

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> zeros = ensemble.params.apply(torch.zeros_like)
            >>> ensemble.functional_call(zeros, torch.randn(4, 2)).abs().sum().item()
            0.0
            >>> ensemble.functional_call(ensemble.params[[0, 2]], torch.randn(4, 2)).shape
            torch.Size([2, 4, 1])
        """
        leaves = _leaves_of(self._layout, params, [], ())
        members = self._given_members(leaves)
        return self._run(tuple(leaves), args, kwargs, in_dims, members)

    def forward(self, *args, in_dims: Any = DEFAULT, **kwargs) -> torch.Tensor:
        """Every member's output, stacked along a new dim 0.

        ``in_dims`` (keyword) overrides the module's :attr:`in_dims` for this call.
        """
        return self._run(None, args, kwargs, in_dims, self._num_members)

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        # nn.Module.__call__ takes two Python frames to reach forward when no hook
        # is set; at small sizes those, and forward's own frame, are a visible
        # part of the call. The same checks here, then the fast path or _run, the
        # path of every other forward; any hook, module.compile(), torch.compile, jit
        # tracing or a subclass's own forward takes torch's full path (which ends
        # in _run too). The state is read from the instance dict: nn.Module
        # defines __getattr__, which makes every `self.x` a slower lookup.
        state = self.__dict__
        if (
            state["_own_forward"]
            and not (
                state["_forward_hooks"]
                or state["_forward_pre_hooks"]
                or state["_backward_hooks"]
                or state["_backward_pre_hooks"]
                or any(_GLOBAL_HOOKS)
            )
            and state.get("_compiled_call_impl") is None
            and not _is_compiling()
            and not _tracing()
        ):
            if "_template_seen" in state:  # handed out: the plan may be stale
                self._check_template()
            if kwargs:
                in_dims = kwargs.pop("in_dims", DEFAULT)
            elif (
                state["_fast"]
                and len(args) == 1
                and isinstance(args[0], torch.Tensor)
                and (
                    not state["_modal"]
                    or [module.training for module in state["_modal"]] == state["_modal_flags"]
                )
            ):
                # The fast path: _run's general path with every branch decided (the
                # registered parameters, one tensor shared by the members, no chunks,
                # the plan built for the flags its modules hold; see _refresh_fast).
                # tests/ensemble/test_differential.py (test_fast_path_equals_general_path)
                # runs both on the same calls.
                x = args[0]
                extended = state["_derived"].extend(
                    state["_context"],
                    tuple(starmap(getitem, state["_slots"])),  # owner[key] per slot
                    self._with_shared if state["_shared"] else None,
                    False,  # nothing compiles, exports or jit-traces: asked above
                )
                return state["_batched"](extended, x.expand(state["_num_members"], *x.shape))
            else:
                in_dims = DEFAULT
            return self._run(None, args, kwargs, in_dims, state["_num_members"])
        return super().__call__(*args, **kwargs)

    @property
    def batched_summary(self) -> str:
        """Which layers run as batched kernels and which under ``vmap`` (also in the repr).

        Example:
            >>> ensemble = Ensemble(nn.Sequential(nn.Linear(2, 4), nn.ReLU()), num_members=3)
            >>> ensemble.batched_summary
            '2/2 layers batched'
        """
        return self._report.summary()

    def explain(self) -> Explanation:
        """Which path each part of the template takes: batched, traced or ``vmap`` (and why).

        One row per submodule the plan meets and per op of a traced ``forward``
        that runs under ``vmap``, for the current train/eval mode: a named tuple
        ``(path, module, route, reason)``, where ``route`` is ``"batched"``,
        ``"traced"`` (a custom ``forward`` rewritten to run batched; its parts have
        rows of their own) or ``"vmap"``, and ``reason`` says why. Printed, it is a
        table. ``explain().fallbacks`` holds the rows that run under ``vmap``. An
        ensemble with such rows warns once (:class:`~tdfunc.EnsembleFallbackWarning`).

        Example:
            >>> ensemble = Ensemble(nn.Sequential(nn.Linear(3, 4), nn.Tanh()), num_members=2)
            >>> print(ensemble.explain())
            path  module  route    why
            0     Linear  batched
            1     Tanh    batched
            >>> ensemble.explain().fallbacks
            ()
        """
        return Explanation(self._report.routes)

    def _plan_for_mode(self) -> None:
        # One plan per train/eval state: a traced forward reads `self.training` of
        # its modules when it is traced, and members may hold submodules in another
        # mode than the top one (a frozen normalisation in eval), so the key is
        # every module's flag, not the top one's. A submodule of the template may
        # be switched directly (ens.template.block.eval()): _run compares the flags
        # the plan read (_modal) with those it was built for, and comes back here.
        mode = tuple(module.training for module in self._template.modules())
        plans = self.__dict__.setdefault("_plans", {})
        fresh = mode not in plans
        if fresh:
            index = _slot_index(self._layout, self._template)
            plans[mode] = build_batched_plan(self._template, index, self._context)
        self._batched, self._report, modal = plans[mode]
        self.__dict__["_modal"] = modal
        self.__dict__["_modal_flags"] = [module.training for module in modal]
        self._refresh_fast()
        # once per ensemble, any mode; the plan is in place first, so a warning turned
        # into an error (-W error) leaves the ensemble consistent
        if fresh and "_fallback_warned" not in self.__dict__ and has_fallbacks(self._report):
            self.__dict__["_fallback_warned"] = True
            warn_fallbacks(self._report.routes, type(self._template).__name__)

    def _given_members(self, leaves: list) -> int:
        """K, the leading size every given leaf shares (shared ones may come unstacked)."""
        shared = self._shared
        sizes = {leaf.shape[0] for i, leaf in enumerate(leaves) if i not in shared}
        if not sizes:  # every tensor shared: the first one tells
            sizes = {leaves[0].shape[0]}
        if len(sizes) != 1:
            raise ValueError(
                f"Ensemble.functional_call: the parameters must share one leading member dim; "
                f"got sizes {sorted(sizes)}. Pass ensemble.params or ensemble.params[idx]."
            )
        members = sizes.pop()
        for i in shared:  # a shared tensor given as it is stored: expand it
            own = self._slots[i][0][self._slots[i][1]]
            if leaves[i].dim() == own.dim():
                leaves[i] = leaves[i].expand(members, *leaves[i].shape)
        return members

    def _with_shared(self, leaves: tuple) -> tuple:
        """The registered leaves with the shared ones expanded to ``[N, ...]``."""
        if not self._shared:
            return leaves
        members, out = self._num_members, list(leaves)
        for i in self._shared:
            out[i] = out[i].expand(members, *out[i].shape)
        return tuple(out)

    def _member_leaves(self, index: Any, count: int) -> tuple:
        """The leaves of the members ``index`` selects (K = ``count``), shared ones expanded."""
        shared = self._shared
        leaves = [owner[key] for owner, key in self._slots]
        return tuple(
            leaf.expand(count, *leaf.shape) if i in shared else _members.select(leaf, index)
            for i, leaf in enumerate(leaves)
        )

    def _run(self, leaves: tuple | None, args: tuple, kwargs: dict, in_dims: Any, members: int):
        """The one general path of every forward: ``__call__`` (but for its fast
        path), ``forward`` (hooks, compiled calls), ``functional_call`` and a
        selection of members all end here.

        ``leaves``: member-leading ``[K, ...]`` tensors (shared ones expanded), or
        ``None`` for the registered ones (their derived views are cached).
        """
        state = self.__dict__
        # (a compiled call is traced: dynamo reads no dict views, and the eager calls
        # around it have checked; see _check_template)
        if "_template_seen" in state and not _is_compiling():
            self._check_template()
        modal = state["_modal"]
        if modal and [module.training for module in modal] != state["_modal_flags"]:
            self._plan_for_mode()
        batched = state["_batched"]
        in_dims = state["_in_dims"] if in_dims is DEFAULT else check_in_dims(in_dims)
        chunk = state["_chunk_size"]
        if leaves is None:
            raw = tuple(starmap(getitem, state["_slots"]))
            if batched is None or chunk is not None:
                leaves = self._with_shared(raw)
            else:
                extended = self._extended(raw)
        if batched is None:
            return self._run_vmapped(leaves, args, kwargs, in_dims)
        args = lead_inputs(args, in_dims, members)
        if kwargs:
            kwargs = {key: lead_input(value, None, members, key) for key, value in kwargs.items()}
        if chunk is None or chunk >= members:
            if leaves is not None:
                extended = state["_context"].extend(leaves)
            return batched(extended, *args, **kwargs)
        outputs = []
        for start in range(0, members, chunk):
            # Derived views are not member-leading: slice, then derive.
            part = slice(start, start + chunk)
            outputs.append(
                batched(
                    state["_context"].extend(tuple([leaf[part] for leaf in leaves])),
                    *slice_members(args, part),
                    **slice_members(kwargs, part),
                )
            )
        return torch.utils._pytree.tree_map(lambda *xs: torch.cat(xs), *outputs)

    def _extended(self, leaves: tuple) -> tuple:
        # The derived leaves (views such as weight.mT) are kept while nothing
        # they depend on changed (cache.py has the rules); shared tensors are
        # expanded to the member dim first, and cached with them.
        return self._derived.extend(
            self._context, leaves, self._with_shared if self._shared else None
        )

    def apply(self, fn: Callable[[nn.Module], None]) -> Ensemble:
        """``fn`` on every submodule of every member, in member order, as
        ``for model in models: model.apply(fn)`` would, then on the ensemble itself.

        The stacked layers hold no ``nn.Linear`` or ``nn.Conv2d`` a function could
        recognise, so each member is run as a standalone module (:meth:`member`) and
        its new values are loaded back in place: the parameters stay the same objects,
        and an initialiser draws the same random numbers as on a list of models. The
        template (whose tensors are on the ``meta`` device: no random number is drawn
        there) gets ``fn`` too, once, so that a setting it changes (a dropout's ``p``)
        reaches the batched code, whose plans are rebuilt. A function that adds or
        removes tensors is refused by the load, before anything is written.

        Example:
            >>> def init(module):
            ...     if isinstance(module, nn.Linear):
            ...         nn.init.zeros_(module.weight)
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)]).apply(init)
            >>> bool((ensemble.params["weight"] == 0).all())
            True
        """
        members = [self.member(index) for index in range(self._num_members)]
        for module in members:
            module.apply(fn)
        self.load_member_state_dicts([module.state_dict() for module in members])
        self._template.apply(fn)
        self._derived.clear()
        for name in _PLAN_STATE:
            self.__dict__.pop(name, None)
        self._plan_for_mode()
        if "_template_seen" in self.__dict__:
            template = self._template
            self.__dict__["_template_seen"] = (template_state(template), slot_names(template))
        fn(self)
        return self

    def _apply(self, fn, recurse: bool = True):
        # .to() / .double() may swap a parameter's data in place of the object.
        self._derived.clear()
        return super()._apply(fn, recurse)

    def _run_vmapped(self, leaves: tuple, args: tuple, kwargs: dict, in_dims: Any):
        # vmap sees a flat tuple of tensors, not the nested TensorDict: flattening
        # a tuple is cheaper than a tree of containers, and the member function
        # rebuilds the (unbatched) TensorDict from the layout in a few dict writes.
        members = leaves[0].shape[0]
        lead_inputs(args, in_dims, members)  # checks the member dims (vmap's errors are vaguer)
        if isinstance(in_dims, tuple):
            if len(in_dims) != len(args):
                raise ValueError(
                    f"Ensemble: in_dims has {len(in_dims)} entries but the forward got "
                    f"{len(args)} positional inputs; give one int | None per input."
                )
            dims = (0, *in_dims)
        else:
            dims = (0,) + (in_dims,) * len(args)
        # keyword inputs are shared: expanded, then mapped like the member-leading ones
        kwargs = {key: lead_input(value, None, members, key) for key, value in kwargs.items()}
        return vmap_call(self._call_leaves, leaves, args, kwargs, dims, self._randomness,
                         self._chunk_size, consults_fast_path(self._template))  # fmt: skip

    def _call_leaves(self, leaves: tuple, *args, **kwargs):
        template = self._template
        with _rebuild(self._layout, leaves, [0]).to_module(template):
            return template(*args, **kwargs)

    # ------------------------------------------------------------------ members
    def select_members(self, index: Any) -> _members.EnsembleMembers:
        """K of the members, run as batched kernels: a view, no copy (``ens[index]`` too).

        ``index``: a sequence of ints, an integer or boolean tensor, a slice, or
        an int (one member, outputs without the member dim). Each call reads the
        current parameters, so optimizer steps on the ensemble are seen, and
        gradients flow back into the stacked parameters.

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(3, 1) for _ in range(10)])
            >>> x = torch.randn(4, 3)
            >>> two = ensemble.select_members(torch.randperm(10)[:2])
            >>> two(x).min(dim=0).values.shape  # REDQ's target: min over 2 of 10
            torch.Size([4, 1])
            >>> torch.allclose(ensemble[3](x), ensemble(x)[3], atol=1e-6)
            True
        """
        return _members.EnsembleMembers(self, index)

    def __getitem__(self, index: Any) -> _members.EnsembleMembers:
        return _members.EnsembleMembers(self, index)

    def member_state_dicts(self, keep_vars: bool = False) -> list[dict[str, Any]]:
        """Each member's ``state_dict()``, keyed as the model's own (views, no copy).

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> states = ensemble.member_state_dicts()
            >>> len(states), sorted(states[0]), states[0]["weight"].shape
            (3, ['bias', 'weight'], torch.Size([1, 2]))
        """
        return _members.member_state_dicts(self, keep_vars)

    def load_member_state_dicts(self, state_dicts: Any, strict: bool = True) -> None:
        """Load one ``state_dict`` per member into the stacked tensors, in place.

        The keys are the model's own (``nn.Linear``: ``weight``, ``bias``); the
        registered parameters stay the same objects, so an optimizer built on the
        ensemble keeps working. Shapes are checked before anything is written.
        A tensor kept ``shared`` must hold the same value in every state dict.

        Example:
            >>> models = [nn.Linear(2, 1) for _ in range(3)]
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> ensemble.load_member_state_dicts([m.state_dict() for m in models])
            >>> torch.equal(ensemble.stacked.weight[1], models[1].weight)
            True
        """
        _members.load_member_state_dicts(self, state_dicts, strict)

    def _named_slots(self) -> list:
        return _leaf_names(self._layout)

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
        # contiguous: a standalone module's tensors in the layout nn.Module makes
        params = self.params[index].apply(
            lambda tensor: tensor.detach().clone(memory_format=torch.contiguous_format)
        )
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
        self._own_forward = type(self).forward is Ensemble.forward
        self._prepare_swap()  # a copy (deepcopy, pickle) has a new template
        bind_cache(self.stacked, self._derived)
        self._plan_for_mode()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_derived"] = DerivedCache()
        state.pop("_template_seen", None)  # a copy's template has not been handed out
        for name in _PLAN_STATE:  # closures over the template, its modules
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
        Tensors kept ``shared`` belong to no single member and are left as they are.

        Example:
            >>> ensemble = Ensemble(*[nn.Linear(2, 1) for _ in range(3)])
            >>> ensemble(torch.randn(4, 2)).sum().backward()
            >>> ensemble.clip_grad_norm_(0.5).shape
            torch.Size([3])
        """
        shared = {id(owner[key]) for owner, key in (self._slots[i] for i in self._shared)}
        grads = [p.grad for p in self.parameters() if p.grad is not None and id(p) not in shared]
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
