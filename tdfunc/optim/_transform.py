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
from torch._C import _functorch

from .._assembly import TensorDict, is_tensor_collection
from . import _complex, _kernels, _leaves, _rules
from . import _hyper as H
from ._groups import member_rows

_is_compiling = torch.compiler.is_compiling


def _flatten(tree: Any) -> tuple[list, Any]:
    return pytree.tree_flatten(tree)


def _transformed() -> bool:
    """True under ``torch.compile`` or a ``torch.func`` transform (vmap, grad, ...)."""
    return _is_compiling() or _functorch.maybe_current_level() is not None


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

    Built by :func:`adam`, :func:`adamw`, :func:`sgd` and :func:`rmsprop`. Nothing
    passed in is modified; ``update`` returns the parameter *updates* (add them
    with :func:`apply_updates`) and the new state. Works under ``torch.func``
    transforms (``grad`` through the update, ``vmap`` over tasks) and
    ``torch.compile``.
    """

    def __init__(self, name: str, moments: tuple[str, ...], hypers: dict, rule: Callable) -> None:
        self._name = name
        self._moments = moments
        self.hyperparameters = hypers
        self._rule = rule

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={_brief(v)}" for k, v in self.hyperparameters.items())
        return f"tdfunc.optim.{self._name}({shown})"

    def init(self, params: Any) -> Any:
        """The initial state for ``params``: step 0 and zero moments shaped like the leaves.

        Example:
            >>> from tdfunc import TensorDict
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
            return TensorDict({"step": step, **moments}, batch_size=batch_size)
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
            >>> params = TensorDict({"w": torch.ones(2)})
            >>> opt = sgd(lr=0.5)
            >>> state = opt.init(params)
            >>> updates, state = opt.update(TensorDict({"w": torch.ones(2)}), state, params)
            >>> apply_updates(params, updates)["w"]
            tensor([0.5000, 0.5000])
        """
        api = f"tdfunc.optim.{self._name}(...).update"
        if not _is_compiling():
            done = self._update_tensordicts(api, grads, state, params, members)
            if done is not None:
                return done
        grad_leaves, grad_spec = _flatten(grads)
        count = len(grad_leaves)
        step, moments = self._read_state(api, state, count, grad_spec)
        if params is None:
            if self._needs_params():
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
            api, grads, grad_leaves, param_leaves, step, moments, members
        )
        new_state = {"step": step}
        for name, moment in zip(self._moments, new_moments):
            new_state[name] = pytree.tree_unflatten(moment, grad_spec)
        if is_tensor_collection(state):
            new_state = TensorDict(new_state, batch_size=state.batch_size)
        return pytree.tree_unflatten(updates, grad_spec), new_state

    def _update_tensordicts(
        self, api: str, grads: Any, state: Any, params: Any, members: Any = None
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
        elif self._needs_params():
            return None
        read = _leaves.read(grads, others)
        # the new state nests the moments, shaped like the gradients, under its batch size
        batch_size = state._batch_size
        if read is None or grads._batch_size[: len(batch_size)] != batch_size:
            return None
        grad_leaves, other_leaves = read
        param_leaves = grad_leaves if params is None else other_leaves.pop()
        updates, step, new_moments = self._compute(
            api, grads, grad_leaves, param_leaves, step, other_leaves, members
        )
        new_state = {"step": step}
        for name, moment in zip(self._moments, new_moments):
            new_state[name] = _leaves.build(grads, moment)
        new_state = kind._new_unsafe(new_state, batch_size, None, state._names)
        return _leaves.build(grads, updates), new_state

    def _compute(self, api, grads, grad_leaves, param_leaves, step, moments, members=None):
        """The rule on flat lists: update leaves, the new step count, the new moments."""
        hypers, tensor_hypers = self._resolve(api, grad_leaves, grads)
        backend = _backend(grad_leaves, param_leaves, [step], *moments, tensor_hypers)
        step = step + 1
        like = grad_leaves
        complex_leaves = _complex.any_complex(like)
        if complex_leaves:
            hypers = _complex.per_leaf_hypers(hypers, like)
            param_leaves, grad_leaves = _complex.as_real(param_leaves), _complex.as_real(like)
            moments = [_complex.as_real(moment) for moment in moments]
        updates, new_moments = self._rule(
            backend, param_leaves, grad_leaves, moments, step.to(dtype=torch.float64), hypers
        )
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

    def _needs_params(self) -> bool:
        decay = self.hyperparameters.get("weight_decay", 0.0)
        return not H.is_zero(decay)

    def _resolve(self, api: str, leaves: list, grads: Any) -> tuple[dict, list]:
        """The hyperparameters for this step, and their tensors (checked against the leaves).

        Numbers need no check; tensors and pytrees are read and checked on every
        step (``hyperparameters`` may have been changed, a pytree may hold other tensors).
        """
        resolved = dict(self.hyperparameters)
        tensors = []
        paths = None
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
            if isinstance(value, H.Leaves):
                resolved[name] = H.full_rank(value, leaves)
        return resolved, tensors


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


def _hyper(api: str, name: str, value: Any, kind: str | None = None, tree: bool = False) -> Any:
    """Check a hyperparameter by the ranges the stateful optimizers use (``_hyper.RANGES``).

    Ints become floats; a pytree is allowed where ``tree``.
    """
    if tree and not isinstance(value, (int, float, torch.Tensor)):
        leaves, _ = _flatten(value)
        if len(leaves) == 1 and leaves[0] is value:  # not a container
            raise TypeError(
                f"{api}: {name} must be a float, a tensor, or a pytree of tensors shaped like "
                f"the parameters; got {type(value).__name__}."
            )
        if not leaves:
            raise ValueError(f"{api}: {name} is an empty pytree.")
        for leaf in leaves:
            H.check(api, f"every leaf of {name}", leaf, kind or name)
        return value
    return H.check(api, name, value, kind)


def _momentum_fixed(api: str, with_momentum: bool, momentum: Any) -> None:
    """The state holds a momentum buffer only if momentum was on when the optimizer was made."""
    if not with_momentum and not H.is_zero(momentum):
        raise ValueError(
            f"{api}: hyperparameters['momentum'] was set to {_brief(momentum)}, but the "
            f"optimizer was made with momentum=0 and its state has no momentum buffer; make "
            f"a new optimizer with the momentum (and a new state with its init)."
        )


# ------------------------------------------------------------------ optimizers
def adam(
    lr: Any = 1e-3,
    betas: tuple = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: Any = 0.0,
    *,
    eps_root: float = 0.0,
) -> GradientTransformation:
    """Adam, as ``torch.optim.Adam`` computes it (L2 weight decay added to the gradient).

    Every hyperparameter may be a float, or a tensor whose shape is a prefix of
    every parameter's shape: ``lr=torch.tensor([...])`` with one value per
    member of parameters stacked along dim 0. ``lr`` may also be a pytree shaped
    like the parameters (per-parameter learning rates). ``eps_root`` is added
    to the bias-corrected second moment under the square root (as in optax): set
    it (e.g. ``1e-16``) when differentiating through steps where a gradient entry
    can be exactly zero, where ``sqrt`` has no derivative.

    Example:
        >>> from tdfunc import TensorDict
        >>> params = TensorDict({"w": torch.ones(3, 2)}, batch_size=[3])
        >>> opt = adam(lr=torch.tensor([0.1, 0.01, 0.0]))
        >>> state = opt.init(params)
        >>> updates, state = opt.update(params.apply(torch.ones_like), state, params)
        >>> apply_updates(params, updates)["w"][:, 0]
        tensor([0.9000, 0.9900, 1.0000])
    """
    return _adam("adam", lr, betas, eps, weight_decay, eps_root, decoupled=False)


def adamw(
    lr: Any = 1e-3,
    betas: tuple = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: Any = 1e-2,
    *,
    eps_root: float = 0.0,
) -> GradientTransformation:
    """AdamW: Adam with decoupled weight decay, as ``torch.optim.AdamW``.

    Hyperparameters as in :func:`adam`.

    Example:
        >>> from tdfunc import TensorDict
        >>> params = TensorDict({"w": torch.ones(2)})
        >>> opt = adamw(lr=0.1, weight_decay=0.5)
        >>> updates, _ = opt.update(params.apply(torch.zeros_like), opt.init(params), params)
        >>> apply_updates(params, updates)["w"]
        tensor([0.9500, 0.9500])
    """
    return _adam("adamw", lr, betas, eps, weight_decay, eps_root, decoupled=True)


def _adam(name, lr, betas, eps, weight_decay, eps_root, decoupled) -> GradientTransformation:
    api = f"tdfunc.optim.{name}"
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"{api}: betas must be a pair (beta1, beta2), got {betas!r}.")
    hypers = {
        "lr": _hyper(api, "lr", lr, tree=True),
        "beta1": _hyper(api, "betas[0]", betas[0], "beta1"),
        "beta2": _hyper(api, "betas[1]", betas[1], "beta2"),
        "eps": _hyper(api, "eps", eps),
        "weight_decay": _hyper(api, "weight_decay", weight_decay),
        "eps_root": _hyper(api, "eps_root", eps_root),
    }

    def rule(K, params, grads, moments, step, h):
        updates, exp_avg, exp_avg_sq = _rules.adam(
            K,
            params,
            grads,
            moments[0],
            moments[1],
            step,
            lr=h["lr"],
            beta1=h["beta1"],
            beta2=h["beta2"],
            eps=h["eps"],
            weight_decay=h["weight_decay"],
            decoupled=decoupled,
            eps_root=h["eps_root"],
        )
        return updates, (exp_avg, exp_avg_sq)

    return GradientTransformation(name, ("exp_avg", "exp_avg_sq"), hypers, rule)


def sgd(
    lr: Any = 1e-3,
    momentum: Any = 0.0,
    nesterov: bool = False,
    weight_decay: Any = 0.0,
    dampening: float = 0.0,
) -> GradientTransformation:
    """SGD with optional (Nesterov) momentum and L2 weight decay, as ``torch.optim.SGD``.

    ``lr``, ``momentum`` and ``weight_decay`` may be per-member tensors (see
    :func:`adam`); ``lr`` may be a pytree shaped like the parameters (Meta-SGD).

    Example:
        >>> params = {"w": torch.ones(2)}
        >>> opt = sgd(lr={"w": torch.tensor([0.1, 0.5])})
        >>> updates, _ = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> apply_updates(params, updates)["w"]
        tensor([0.9000, 0.5000])
    """
    api = "tdfunc.optim.sgd"
    hypers = {
        "lr": _hyper(api, "lr", lr, tree=True),
        "momentum": _hyper(api, "momentum", momentum),
        "weight_decay": _hyper(api, "weight_decay", weight_decay),
        "dampening": _hyper(api, "dampening", dampening),
    }
    if isinstance(hypers["dampening"], torch.Tensor):
        raise TypeError(f"{api}: dampening must be a float, got a tensor.")
    if nesterov and (H.is_zero(hypers["momentum"]) or not H.is_zero(hypers["dampening"])):
        raise ValueError(f"{api}: nesterov=True needs momentum > 0 and dampening == 0.")
    with_momentum = not H.is_zero(hypers["momentum"])

    def rule(K, params, grads, moments, step, h):
        _momentum_fixed(api, with_momentum, h["momentum"])
        updates, buffer = _rules.sgd(
            K,
            params,
            grads,
            moments[0] if with_momentum else None,
            step,
            lr=h["lr"],
            momentum=h["momentum"],
            dampening=h["dampening"],
            nesterov=nesterov,
            weight_decay=h["weight_decay"],
        )
        return updates, ((buffer,) if with_momentum else ())

    return GradientTransformation(
        "sgd", ("momentum_buffer",) if with_momentum else (), hypers, rule
    )


def rmsprop(
    lr: Any = 1e-2,
    alpha: Any = 0.99,
    eps: float = 1e-8,
    weight_decay: Any = 0.0,
    momentum: Any = 0.0,
    centered: bool = False,
) -> GradientTransformation:
    """RMSprop, as ``torch.optim.RMSprop``; hyperparameters as in :func:`adam`.

    Example:
        >>> params = {"w": torch.ones(2)}
        >>> opt = rmsprop(lr=0.01)
        >>> updates, state = opt.update({"w": torch.ones(2)}, opt.init(params), params)
        >>> sorted(state)
        ['square_avg', 'step']
    """
    api = "tdfunc.optim.rmsprop"
    hypers = {
        "lr": _hyper(api, "lr", lr, tree=True),
        "alpha": _hyper(api, "alpha", alpha),
        "eps": _hyper(api, "eps", eps),
        "weight_decay": _hyper(api, "weight_decay", weight_decay),
        "momentum": _hyper(api, "momentum", momentum),
    }
    with_momentum = not H.is_zero(hypers["momentum"])
    moments = (
        ("square_avg",)
        + (("grad_avg",) if centered else ())
        + (("momentum_buffer",) if with_momentum else ())
    )

    def rule(K, params, grads, state, step, h):
        _momentum_fixed(api, with_momentum, h["momentum"])
        grad_avg = state[1] if centered else None
        buffer = state[-1] if with_momentum else None
        updates, square_avg, grad_avg, buffer = _rules.rmsprop(
            K,
            params,
            grads,
            state[0],
            grad_avg,
            buffer,
            lr=h["lr"],
            alpha=h["alpha"],
            eps=h["eps"],
            weight_decay=h["weight_decay"],
            momentum=h["momentum"],
        )
        new = (
            (square_avg,) + ((grad_avg,) if centered else ()) + ((buffer,) if with_momentum else ())
        )
        return updates, new

    return GradientTransformation("rmsprop", moments, hypers, rule)
