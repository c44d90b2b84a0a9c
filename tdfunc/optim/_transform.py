"""Functional optimizers in the optax contract: ``init``, ``update``, ``apply_updates``.

``update`` reads every pytree once (one flatten each for the gradients, the
state and the parameters), runs the update rule on the flat lists of leaves and
builds the results once (one unflatten each for the updates and the state).
The state is a pytree of the same kind as the parameters: a
:class:`~tdfunc.TensorDict` with the parameters' batch size when they are a
tensor collection (so it saves, loads, indexes and stacks like them), a dict
otherwise. It holds ``step`` (shaped like the batch: every member counts its
own steps) and one subtree per moment, shaped like the parameters.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .._assembly import TensorDict, is_tensor_collection
from .._core.helpers import tracing
from . import _complex, _compose, _kernels, _leaves
from . import _hyper as H
from ._groups import member_rows

_is_compiling = tracing.compiling


def _flatten(tree: Any) -> tuple[list, Any]:
    return pytree.tree_flatten(tree)


def _transformed() -> bool:
    """True under ``torch.compile`` or a ``torch.func`` transform (vmap, grad, ...)."""
    return _is_compiling() or tracing.functorch_level() is not None


_requires_grad = operator.attrgetter("requires_grad")


def _backend(*groups) -> Any:
    if _transformed():
        return _kernels.TENSORWISE
    if torch.is_grad_enabled():
        for group in groups:
            try:
                recorded = any(map(_requires_grad, group))
            except AttributeError:  # a leaf that is not a tensor
                recorded = any(isinstance(v, torch.Tensor) and v.requires_grad for v in group)
            if recorded:
                return _kernels.TENSORWISE
    return _kernels.FOREACH


def _leaf_device(device: torch.device | None, leaves: list) -> torch.device | None:
    """Where the step counter lives: the container's device, else its first leaf's.

    A container built from modules carries no device of its own; a counter made on
    the CPU beside CUDA leaves would fail at the first update.
    """
    if device is not None:
        return device
    return leaves[0].device if leaves else None


def _paths(tree: Any) -> Callable[[int], str]:
    def path(index: int) -> str:
        entries, _ = pytree.tree_flatten_with_path(tree)
        return repr(pytree.keystr(entries[index][0]))

    return path


def apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` leaf by leaf, as a new pytree (nothing is modified).

    Example:
        >>> from tdfunc import TensorDict
        >>> params = TensorDict({"w": torch.ones(2)})
        >>> apply_updates(params, TensorDict({"w": torch.full((2,), -0.5)}))["w"]
        tensor([0.5000, 0.5000])
    """
    read = None if _is_compiling() else _leaves.read(params, [updates])
    if read is not None:  # plain TensorDicts of one structure: read once, built like params
        leaves, (update_leaves,) = read
        return _leaves.build(params, _add(leaves, update_leaves))
    leaves, spec = _flatten(params)
    update_leaves, update_spec = _flatten(updates)
    if len(update_leaves) != len(leaves):
        raise ValueError(
            f"apply_updates: updates has {len(update_leaves)} leaves but params has "
            f"{len(leaves)}; pass the updates returned by opt.update(grads, state, params). "
            f"Structures: params {spec}, updates {update_spec}."
        )
    if update_spec != spec:
        _same_paths(params, updates)
    _same_shapes("apply_updates", "updates", update_leaves, "params", leaves, params)
    return pytree.tree_unflatten(_add(leaves, update_leaves), spec)


def _same_paths(params: Any, updates: Any) -> None:
    """Leaves are added by position: the updates must name them in the params' order.

    Containers of other kinds with the same keys (a dict of updates for a
    TensorDict of parameters) line up; other keys, or the same keys in another
    order, would add each update to another parameter.
    """
    names = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(params)[0]]
    update_names = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(updates)[0]]
    for name, update_name in zip(names, update_names):
        if name != update_name:
            raise ValueError(
                f"apply_updates: updates and params must name their leaves in the same order, "
                f"but the params leaf {name!r} meets the updates leaf {update_name!r}; pass "
                f"the updates returned by opt.update(grads, state, params), or build them "
                f"with the params' keys in the params' order."
            )


def _same_shapes(api: str, name: str, leaves: list, reference: str, expected: list, tree) -> None:
    """Leaves must have the shapes of ``expected``'s: broadcasting would give wrong shapes."""
    for index, (leaf, other) in enumerate(zip(leaves, expected)):
        if (
            isinstance(leaf, torch.Tensor)
            and isinstance(other, torch.Tensor)
            and leaf.shape != other.shape
        ):
            raise ValueError(
                f"{api}: the {name} leaf at {_paths(tree)(index)} has shape "
                f"{list(leaf.shape)}, but the {reference} leaf has shape "
                f"{list(other.shape)}; they must be equal."
            )


def _add(leaves: list, update_leaves: list) -> list:
    if _backend(leaves, update_leaves) is _kernels.FOREACH:
        return torch._foreach_add(leaves, update_leaves)
    return [p + u for p, u in zip(leaves, update_leaves)]


class GradientTransformation:
    """A functional optimizer: ``init(params) -> state``, ``update(grads, state, params)``.

    Built by the transformations (:func:`~tdfunc.optim.scale_by_adam`, ...) and the
    named optimizers (:func:`~tdfunc.optim.adam`, ...), each a list of stages
    (:mod:`tdfunc.optim._compose`) with one state: the step count and every stage's
    moments. Nothing passed in is modified; ``update`` returns the parameter
    *updates* (add them with :func:`apply_updates`) and the new state. Works under
    ``torch.func`` transforms (``grad`` through the update, ``vmap`` over tasks) and
    ``torch.compile``.
    """

    def __init__(
        self, name: str, stages: tuple, hypers: dict, check: Callable | None = None
    ) -> None:
        self._name = name
        self._stages = tuple(stages)
        self._segments = _compose.plan(self._stages)
        self._moments = tuple(name for stage in self._stages for name in stage.moments)
        self.hyperparameters = hypers
        # a check of the resolved hyperparameters on every step, ``check(api, hypers)``
        self._check = check

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={_brief(v)}" for k, v in self.hyperparameters.items())
        return f"tdfunc.optim.{self._name}({shown})"

    def init(self, params: Any) -> Any:
        """The initial state for ``params``: step 0 and zero moments shaped like the leaves.

        Example:
            >>> from tdfunc import TensorDict
            >>> from tdfunc.optim import adam
            >>> opt = adam(lr=0.1)
            >>> state = opt.init(TensorDict({"w": torch.ones(4, 2)}, batch_size=[4]))
            >>> sorted(state.keys()), state["step"].shape
            (['exp_avg', 'exp_avg_sq', 'step'], torch.Size([4]))
        """
        read = None if _is_compiling() else _leaves.read(params, [])
        if read is not None:  # a plain TensorDict: moments built like it, no treespec
            leaves = read[0]
            device = _leaf_device(params._device, leaves)
            step = torch.zeros(params._batch_size, dtype=torch.float32, device=device)
            state = {"step": step}
            for name in self._moments:
                state[name] = _leaves.build(params, [torch.zeros_like(leaf) for leaf in leaves])
            return type(params)._new_unsafe(state, params._batch_size, None, params._names)
        leaves, spec = _flatten(params)
        api = f"tdfunc.optim.{self._name}(...).init"
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(
                    f"{api}: every leaf of params must be a tensor; the leaf at "
                    f"{_paths(params)(index)} is a {type(leaf).__name__}."
                )
        if is_tensor_collection(params):
            batch_size = params.batch_size
            device = _leaf_device(params.device, leaves)
        else:
            batch_size = torch.Size([])
            device = _leaf_device(None, leaves)
        step = torch.zeros(batch_size, dtype=torch.float32, device=device)
        moments = {
            name: pytree.tree_unflatten([torch.zeros_like(leaf) for leaf in leaves], spec)
            for name in self._moments
        }
        if is_tensor_collection(params):
            return _state_like(params, {"step": step, **moments})
        return {"step": step, **moments}

    def update(
        self, grads: Any, state: Any, params: Any = None, *, members: Any = None
    ) -> tuple[Any, Any]:
        """The updates for ``grads`` and the new state; ``params`` is needed for weight decay.

        ``members`` (a bool mask shaped like ``state["step"]``, or member indices)
        steps only those members of stacked parameters, as a loop that steps only
        their optimizers: the others get zero updates and keep their state.

        Example:
            >>> from tdfunc import TensorDict
            >>> from tdfunc.optim import sgd
            >>> params = TensorDict({"w": torch.ones(2)})
            >>> opt = sgd(lr=0.5)
            >>> state = opt.init(params)
            >>> updates, state = opt.update(TensorDict({"w": torch.ones(2)}), state, params)
            >>> apply_updates(params, updates)["w"]
            tensor([0.5000, 0.5000])
        """
        return self._update(grads, state, params, members, ())

    def _update(self, grads: Any, state: Any, params: Any, members: Any, followers: tuple) -> tuple:
        """``update``, with the stages of ``followers`` folded into this one's.

        ``followers`` are the transformations that :class:`~tdfunc.optim.Chain` runs
        with this one (the folding rule of :mod:`tdfunc.optim._compose`).
        """
        api = f"tdfunc.optim.{self._name}(...).update"
        if not _is_compiling():
            done = self._update_tensordicts(api, grads, state, params, members, followers)
            if done is not None:
                return done
        grad_leaves, grad_spec = _flatten(grads)
        count = len(grad_leaves)
        step, moments = self._read_state(api, state, count, grad_spec)
        if params is None:
            if self._needs_params(followers):
                raise ValueError(
                    f"{api}: weight decay needs the parameters: call "
                    f"opt.update(grads, state, params)."
                )
            param_leaves = grad_leaves
        else:
            param_leaves, param_spec = _flatten(params)
            if param_spec != grad_spec:
                raise ValueError(
                    f"{api}: grads and params must have the same structure; got grads "
                    f"{grad_spec} and params {param_spec}."
                )
        if params is not None:
            _same_shapes(api, "params", param_leaves, "grads", grad_leaves, grads)
        for name, moment in zip(self._moments, moments):
            _same_shapes(api, f"state[{name!r}]", moment, "grads", grad_leaves, grads)
        updates, step, new_moments = self._compute(
            api, grads, grad_leaves, param_leaves, step, moments, members, followers
        )
        new_state = {"step": step}
        for name, moment in zip(self._moments, new_moments):
            new_state[name] = pytree.tree_unflatten(moment, grad_spec)
        if is_tensor_collection(state):
            new_state = _state_like(state, new_state)
        return pytree.tree_unflatten(updates, grad_spec), new_state

    def _update_tensordicts(
        self, api: str, grads: Any, state: Any, params: Any, members: Any, followers: tuple
    ) -> Any:
        """``update`` for plain TensorDicts of one structure, or ``None`` (the generic path).

        Every tree is read once, in the gradients' key order, and the results are
        built like the gradients, as the generic path builds them.
        """
        kind = _leaves.tensordict_type()
        if type(state) is not kind:
            return None
        entries = state._data
        step = entries.get("step")
        if len(entries) != 1 + len(self._moments) or not isinstance(step, torch.Tensor):
            return None
        others = [entries.get(name) for name in self._moments]
        if params is not None:
            others.append(params)
        elif self._needs_params(followers):
            return None
        read = _leaves.read(grads, others)
        # the new state nests the moments, shaped like the gradients, under its batch size
        batch_size = state._batch_size
        if read is None or grads._batch_size[: len(batch_size)] != batch_size:
            return None
        grad_leaves, other_leaves = read
        param_leaves = grad_leaves if params is None else other_leaves.pop()
        updates, step, new_moments = self._compute(
            api, grads, grad_leaves, param_leaves, step, other_leaves, members, followers
        )
        new_state = {"step": step}
        for name, moment in zip(self._moments, new_moments):
            new_state[name] = _leaves.build(grads, moment)
        new_state = kind._new_unsafe(new_state, batch_size, None, state._names)
        return _leaves.build(grads, updates), new_state

    def _compute(self, api, grads, grad_leaves, param_leaves, step, moments, members, followers):
        """The stages on flat lists: update leaves, the new step count, the new moments."""
        hypers, tensor_hypers = self._resolve(api, grad_leaves, grads, param_leaves)
        segments = self._segments
        if followers:
            for follower in followers:
                own, own_tensors = follower._resolve(
                    f"tdfunc.optim.{follower._name}(...).update", grad_leaves, grads, param_leaves
                )
                hypers.update(own)
                tensor_hypers += own_tensors
            segments = _compose.plan(self._stages + tuple(f._stages[0] for f in followers))
        if self._check is not None:
            self._check(api, hypers)
        backend = _backend(grad_leaves, param_leaves, [step], *moments, tensor_hypers)
        step = step + 1
        like = grad_leaves
        complex_leaves = _complex.any_complex(like)
        if complex_leaves:
            hypers = _complex.per_leaf_hypers(hypers, like)
            param_leaves, grad_leaves = _complex.as_real(param_leaves), _complex.as_real(like)
            moments = [_complex.as_real(moment) for moment in moments]
        updates, new_moments = _compose.run(
            segments, backend, param_leaves, grad_leaves, moments, step.to(dtype=torch.float64),
            hypers,
        )  # fmt: skip
        if complex_leaves:
            updates = _complex.as_complex(updates, like)
            new_moments = [_complex.as_complex(moment, like) for moment in new_moments]
            moments = [_complex.as_complex(moment, like) for moment in moments]
        if members is not None:
            mask = _member_mask(api, members, step)
            # every member computed (no count of 0 divides), the unselected ones discarded
            step = torch.where(mask, step, step - 1)
            updates = [_where(mask, u, torch.zeros_like(u)) for u in updates]
            new_moments = [
                [_where(mask, new, old) for new, old in zip(news, olds)]
                for news, olds in zip(new_moments, moments)
            ]
        return updates, step, new_moments

    def _read_state(self, api: str, state: Any, count: int, grad_spec: Any) -> tuple:
        """The step count and the moments' flat leaves, checked against the gradients.

        Each moment is read by its key (a saved and reloaded state may order the
        top-level keys differently) and must have the gradients' structure, so
        that its leaves line up with theirs.
        """
        names = ("step", *self._moments)
        keys = list(state.keys()) if hasattr(state, "keys") else None
        if keys is None or sorted(keys) != sorted(names):
            found = sorted(keys) if keys is not None else type(state).__name__
            raise ValueError(
                f"{api}: the state must hold {list(names)}, got {found}. Make it with "
                f"opt.init(params) of this optimizer."
            )
        step = state["step"]
        if not isinstance(step, torch.Tensor):
            raise ValueError(f"{api}: state['step'] must be one tensor.")
        moments = []
        for name in self._moments:
            leaves, spec = _flatten(state[name])
            if len(leaves) != count:
                raise ValueError(
                    f"{api}: state[{name!r}] has {len(leaves)} leaves but grads has {count}; "
                    f"make the state with opt.init(params) for these parameters."
                )
            if spec != grad_spec:
                raise ValueError(
                    f"{api}: state[{name!r}] and grads must have the same structure; got "
                    f"{spec} and grads {grad_spec}. Make the state with opt.init(params) for "
                    f"these parameters."
                )
            moments.append(leaves)
        return step, moments

    def _needs_params(self, followers: tuple = ()) -> bool:
        return any(
            not H.is_zero(t.hyperparameters.get("weight_decay", 0.0)) for t in (self, *followers)
        )

    def _advanced(self, state: Any, members: Any) -> Any:
        """``state`` one step on (``members``' counts only): a folded stage's own state."""
        api = f"tdfunc.optim.{self._name}(...).update"
        step, _ = self._read_state(api, state, 0, None)
        new_step = step + 1
        if members is not None:
            new_step = torch.where(_member_mask(api, members, step), new_step, step)
        if is_tensor_collection(state):
            return _state_like(state, {"step": new_step})
        return {"step": new_step}

    def _resolve(
        self, api: str, leaves: list, grads: Any, params: list | None = None
    ) -> tuple[dict, list]:
        """The hyperparameters for this step, and their tensors (checked against the leaves).

        Numbers need no check; tensors and pytrees are read and checked on every
        step (``hyperparameters`` may have been changed, a pytree may hold other tensors).
        """
        resolved = dict(self.hyperparameters)
        tensors = []
        paths = None
        shared_checked = False
        for name, value in resolved.items():
            if value is None:
                continue
            if isinstance(value, (int, float)):
                # ``hyperparameters`` is a door too: numbers are range-checked on every step
                resolved[name] = H.check(api, name, value)
                continue
            if not isinstance(value, torch.Tensor):
                value = resolved[name] = H.Leaves(_matched_by_path(api, name, value, grads))
                tensors += [v for v in value.values if isinstance(v, torch.Tensor)]
            else:
                tensors.append(value)
            if paths is None:
                paths = _paths(grads)
            H.check_leading(api, name, value, leaves, paths)
            if not shared_checked and isinstance(value, torch.Tensor) and value.dim():
                shared_checked = True  # one pass over the leaves, for the first such value
                # the parameters are what an Ensemble marks (gradients are fresh tensors)
                H.check_not_shared(api, name, value, leaves if params is None else params, paths)
            if isinstance(value, H.Leaves):
                resolved[name] = H.full_rank(value, leaves)
        return resolved, tensors


def _state_like(like: Any, entries: dict) -> Any:
    """A state TensorDict with ``like``'s batch size and dim names.

    The names are carried, not inferred from the entries: a state of a step count
    alone has no nested entry to infer them from (the direct path keeps them too).
    """
    names = getattr(like, "_names", None)
    return TensorDict(entries, batch_size=like.batch_size, names=list(names) if names else None)


def _member_mask(api: str, members: Any, step: torch.Tensor) -> torch.Tensor:
    """``members`` as a bool mask shaped like the step count (one count per member)."""
    if step.dim() != 1:
        raise ValueError(
            f"{api}: members= needs a state of stacked parameters (one step count per member, "
            f"from opt.init of a TensorDict with batch size [N]); the step count has shape "
            f"{list(step.shape)}."
        )
    if isinstance(members, torch.Tensor) and members.dtype == torch.bool:
        if members.shape != step.shape:
            raise ValueError(
                f"{api}: a member mask must have shape {list(step.shape)}, got "
                f"{list(members.shape)}."
            )
        return members.to(step.device)
    rows = member_rows(api, members, step.shape[0])
    mask = torch.zeros(step.shape, dtype=torch.bool, device=step.device)
    mask[rows.to(step.device)] = True
    return mask


def _where(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.where(H.lead(mask, new.dim()), new, old)


def _matched_by_path(api: str, name: str, tree: Any, grads: Any) -> list:
    """The leaves of the hyperparameter ``tree`` in the order of ``grads``' leaves.

    Matched by key path, as the leaves of a dict are matched to the keys of another
    dict: two trees with the same keys in another order flatten in another order, and
    matching by position would give one parameter another's value.
    """
    values = dict(pytree.tree_flatten_with_path(tree)[0])
    wanted = [path for path, _ in pytree.tree_flatten_with_path(grads)[0]]
    missing = [path for path in wanted if path not in values]
    extra = [path for path in values if path not in set(wanted)]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"no value for the parameters {_path_names(missing)}")
        if extra:
            parts.append(f"values for {_path_names(extra)}, which name no parameter")
        raise ValueError(
            f"{api}: the {name} pytree is matched to the parameters by key path; it has "
            f"{' and '.join(parts)}. Give it exactly the parameters' keys."
        )
    return [values[path] for path in wanted]


def _path_names(paths: list) -> str:
    shown = ", ".join(repr(pytree.keystr(path)) for path in paths[:3])
    return shown + (f" (and {len(paths) - 3} more)" if len(paths) > 3 else "")


def _brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={list(value.shape)})"
    if isinstance(value, (float, int, bool)) or value is None:
        return repr(value)
    return type(value).__name__
