"""``capture_step``: a training step captured once as a CUDA graph and replayed.

At small sizes a training step on a GPU is bound by the host: every kernel is a
Python call and a launch, and the GPU waits. A CUDA graph records the kernels of
one step once and replays them with one launch. What replay needs is fixed
memory: the step's inputs are copied into *static buffers* before each replay,
the carried state (parameters, optimizer state) is updated in place, and the
outputs are read from the buffers the capture left them in.

The same code runs on every device: the step runs on the static buffers, writes
its new carry into the carry's tensors and its outputs into fresh tensors. On a
CUDA device that body is recorded once (after warm-up steps on a side stream,
whose effects are undone) and replayed; elsewhere it runs as it is on every
call. So the CPU gives the numbers that eager code gives, and every check (inputs
as captured, nothing replaced or changed since the capture) runs on both.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from .._assembly import MemoryMappedTensor
from .reach import reachable
from .watch import Bindings, Untouched, watchers

_API = "capture_step"


class CapturedStep:
    """A training step captured once (a CUDA graph on a CUDA device) and replayed per call.

    Made by :func:`capture_step`. Calling it with new inputs runs one step: the
    inputs are copied into the step's static buffers, the carry (parameters and
    optimizer state) is updated in place, and the outputs are returned as new
    tensors. :attr:`carry` holds the current carry.
    """

    def __init__(
        self,
        step_fn: Callable,
        carry: Any,
        inputs: tuple,
        watch: tuple,
        warmup: int,
    ) -> None:
        if not callable(step_fn):
            raise TypeError(f"{_API}: step_fn must be callable, got {type(step_fn).__name__}.")
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ValueError(f"{_API}: warmup must be a positive int, got {warmup!r}.")
        self._fn = step_fn
        self._carry = carry
        self._carry_leaves, self._carry_spec = pytree.tree_flatten(carry)
        self._check_carry()
        # the step reads a container of its own: one the caller changes (a tensor put in
        # place of a carried one) would have the step read a tensor it never writes
        self._carry = pytree.tree_unflatten(self._carry_leaves, self._carry_spec)
        self._device = self._carry_leaves[0].device
        self._carry_paths = [
            pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(carry)[0]
        ]
        self._reorder = None
        self._pointers = tuple(leaf.data_ptr() for leaf in self._carry_leaves)
        input_leaves, self._input_spec = pytree.tree_flatten(inputs)
        self._input_kinds = tuple(_kind(_API, "input", path, leaf) for path, leaf in
                                  _with_paths(inputs, input_leaves))  # fmt: skip
        if self._device.type == "cuda":
            for path, leaf in _with_paths(inputs, input_leaves):
                if leaf.device != self._device:
                    raise ValueError(
                        f"{_API}: the input at {path or 'the top'} is on {leaf.device}, the carry "
                        f"on {self._device}; a step recorded on a CUDA device cannot copy from "
                        f"another device inside the recording. Move the inputs first (a pinned "
                        f"CPU batch: x.to(device, non_blocking=True))."
                    )
        # the step reads these buffers; each call copies its inputs into them
        self._input_leaves = [leaf.detach().clone() for leaf in input_leaves]
        self._inputs = pytree.tree_unflatten(self._input_leaves, self._input_spec)
        bindings: list = []
        watched = [*reachable(step_fn, bindings), *_named(watch)]
        self._bindings = Bindings(bindings)
        # autocast picks the kernels a recording keeps: a replay ignores the caller's context
        self._autocast = _autocast_state(self._device.type)
        # an output that is one of these buffers (or a view of one) is copied: the next
        # call overwrites the buffers
        self._carry_storages = {_storage(leaf) for leaf in self._carry_leaves}
        self._static = self._carry_storages | {_storage(leaf) for leaf in self._input_leaves}
        self._output_spec = None
        self._graph = None
        self._watched: list = []
        untouched = Untouched(watchers(watched), self._carry_leaves)
        self._warm_up(warmup)
        untouched.check(_API)
        self._watched = watchers(watched)
        recorder = _recorder(self._device)
        if recorder is not None:
            self._outputs, self._graph = recorder(self._body)

    # ------------------------------------------------------------------ public
    @property
    def carry(self) -> Any:
        """The carried state: a new container, structured like the one given to
        :func:`capture_step`, holding the tensors every call updates in place (the next
        call overwrites them: clone to keep a snapshot). Putting another tensor into it
        changes nothing: copy values into its tensors (``tensor.copy_(new)``) instead."""
        return pytree.tree_unflatten(self._carry_leaves, self._carry_spec)

    @property
    def captured(self) -> bool:
        """Whether the step runs as a recorded CUDA graph (``False``: it runs as it is)."""
        return self._graph is not None

    def __call__(self, *inputs: Any) -> Any:
        self._check_watched()
        leaves, spec = pytree.tree_flatten(inputs)
        if spec != self._input_spec:
            raise ValueError(
                f"{_API}: the step was captured for other inputs: "
                f"{_difference(self._inputs, 'the example inputs', inputs, 'this call')}. "
                f"Call it with inputs structured like the example inputs."
            )
        kinds = self._input_kinds
        for index, leaf in enumerate(leaves):
            if _kind_fast(leaf) != kinds[index]:
                path = pytree.keystr(pytree.tree_flatten_with_path(inputs)[0][index][0])
                _refuse_input(path, leaf, kinds[index])
        with torch.no_grad():  # a buffer must not join the graph of an input that records
            for leaf, buffer in zip(leaves, self._input_leaves):
                buffer.copy_(leaf)
        if self._graph is not None:
            self._graph.replay()
            return pytree.tree_map(torch.clone, self._outputs)
        return self._body()

    # ------------------------------------------------------------------ the step
    def _body(self) -> Any:
        """One step on the static buffers: the new carry written in place, the outputs new."""
        with torch.no_grad():
            result = self._fn(self._carry, *self._inputs)
            new_carry, outputs = self._split(result)
            new_leaves, spec = pytree.tree_flatten(new_carry)
            if spec != self._carry_spec:
                new_leaves = self._by_path(new_carry, new_leaves, spec)
            out_leaves, out_spec = pytree.tree_flatten(outputs)
            if self._output_spec is not None and out_spec != self._output_spec:
                # a recording returns what it returned when it was made, whatever Python says
                raise ValueError(
                    f"{_API}: step_fn returned outputs of another structure than on its first "
                    f"step; a recorded step replays one structure. Keep the outputs' structure "
                    f"fixed (no Python control flow that changes what is returned)."
                )
            # outputs first: one of them may be a carry tensor the copies below overwrite
            out_leaves = [
                _output(index, leaf, outputs, self._static) for index, leaf in enumerate(out_leaves)
            ]
            fresh = self._detached(new_leaves)  # every check before the first write
            for buffer, new in zip(self._carry_leaves, fresh):
                if new is not buffer:
                    buffer.copy_(new)
        self._output_spec = out_spec
        return pytree.tree_unflatten(out_leaves, out_spec)

    def _by_path(self, new_carry: Any, new_leaves: list, spec: Any) -> list:
        """The new carry's leaves in the carry's order, matched by key path.

        A state read back from a checkpoint may hold its keys in another order than the
        one the optimizer builds; matching by position would write one tensor into
        another's place.
        """
        if self._reorder is not None and self._reorder[0] == spec:
            return [new_leaves[index] for index in self._reorder[1]]
        paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(new_carry)[0]]
        position = {path: index for index, path in enumerate(paths)}
        wanted = self._carry_paths
        missing = [path for path in wanted if path not in position]
        extra = [path for path in paths if path not in set(wanted)]
        if missing or extra or len(paths) != len(wanted):
            parts = []
            if missing:
                parts.append(f"no new value for {_names(missing)}")
            if extra:
                parts.append(f"values for {_names(extra)}, which the carry does not hold")
            raise ValueError(
                f"{_API}: step_fn must return (new_carry, outputs) with new_carry holding the "
                f"carry's key paths (matched by path); it has {' and '.join(parts) or 'repeats'}."
            )
        order = [position[path] for path in wanted]
        self._reorder = (spec, order)
        return [new_leaves[index] for index in order]

    def _detached(self, new_leaves: list) -> list:
        """The new carry, checked against the carry and safe to copy in any order."""
        buffers = self._carry_leaves
        storages = self._carry_storages
        fresh = []
        for index, (new, buffer) in enumerate(zip(new_leaves, buffers)):
            if not isinstance(new, torch.Tensor):
                raise TypeError(
                    f"{_API}: the new carry leaf at {self._carry_path(index)} is a "
                    f"{type(new).__name__}; step_fn must return tensors shaped like the carry."
                )
            if (
                new.shape != buffer.shape
                or new.dtype != buffer.dtype
                or new.device != buffer.device
            ):
                raise ValueError(
                    f"{_API}: the new carry leaf at {self._carry_path(index)} has shape "
                    f"{list(new.shape)}, {new.dtype} on {new.device}; the carry leaf has shape "
                    f"{list(buffer.shape)}, {buffer.dtype} on {buffer.device}. A step must keep "
                    f"its carry's shapes, dtypes and devices."
                )
            if new is not buffer and _storage(new) in storages:
                # it reads a carry tensor that an earlier copy may overwrite first
                new = new.clone()
            fresh.append(new)
        return fresh

    def _split(self, result: Any) -> tuple[Any, Any]:
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError(
                f"{_API}: step_fn(carry, *inputs) must return a pair (new_carry, outputs); "
                f"it returned {type(result).__name__}"
                f"{f' of length {len(result)}' if isinstance(result, tuple) else ''}."
            )
        return result

    # ------------------------------------------------------------------ capture
    def _warm_up(self, steps: int) -> None:
        """Run ``steps`` steps (compiling, tuning, filling caches) and undo their effects.

        The carry and the random number generators are restored, so that the first
        call is the first step, as in eager code.
        """
        saved = [leaf.detach().clone() for leaf in self._carry_leaves]
        cuda = self._device.type == "cuda"
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(self._device) if cuda else None
        stream = None
        if cuda:
            stream = torch.cuda.Stream(self._device)
            stream.wait_stream(torch.cuda.current_stream(self._device))
        try:
            with torch.cuda.stream(stream) if cuda else _nothing():
                for _ in range(steps):
                    outputs = self._body()
        finally:  # also when a step fails: a refused capture leaves the carry as it was
            if cuda:
                torch.cuda.current_stream(self._device).wait_stream(stream)
            with torch.no_grad():
                for leaf, value in zip(self._carry_leaves, saved):
                    leaf.copy_(value)
            torch.set_rng_state(rng)
            if cuda:
                torch.cuda.set_rng_state(cuda_rng, self._device)
        self._outputs = outputs

    # ------------------------------------------------------------------ checks
    def _check_carry(self) -> None:
        leaves = self._carry_leaves
        if not leaves:
            raise ValueError(f"{_API}: the carry holds no tensor; pass (params, opt_state).")
        storages: dict = {}
        device = None
        for index, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                raise TypeError(
                    f"{_API}: every leaf of the carry must be a tensor; the leaf at "
                    f"{self._carry_path(index)} is a {type(leaf).__name__}."
                )
            if device is None:
                device = leaf.device
            elif leaf.device != device:
                raise ValueError(
                    f"{_API}: the carry must be on one device; {self._carry_path(index)} is on "
                    f"{leaf.device}, the first leaf on {device}."
                )
            if isinstance(leaf, MemoryMappedTensor):
                raise ValueError(
                    f"{_API}: the carry leaf at {self._carry_path(index)} is a memory-mapped "
                    f"file (a loaded checkpoint): every step would write into that file. Carry "
                    f"a copy: TensorDict.load_memmap(path).clone(), or .to(device)."
                )
            if any(stride == 0 and size > 1 for size, stride in zip(leaf.shape, leaf.stride())):
                raise ValueError(
                    f"{_API}: the carry leaf at {self._carry_path(index)} is an expanded view "
                    f"(several elements share memory), so it cannot be updated in place; a "
                    f"tensor an Ensemble keeps shared appears so in ensemble.params. Carry "
                    f"stacked tensors only."
                )
            if leaf.numel():
                storages.setdefault(_storage(leaf), []).append((*_span(leaf), index))
        for spans in storages.values():  # leaves may share a storage (consolidated), not bytes
            spans.sort()
            for (_, end, first), (start, _, second) in itertools.pairwise(spans):
                if start < end:
                    raise ValueError(
                        f"{_API}: the carry leaves at {self._carry_path(first)} and "
                        f"{self._carry_path(second)} share memory; each carried tensor must have "
                        f"its own, or the in-place updates would overwrite each other."
                    )

    def _check_watched(self) -> None:
        for index, (leaf, pointer) in enumerate(zip(self._carry_leaves, self._pointers)):
            if leaf.data_ptr() != pointer:
                raise RuntimeError(
                    f"{_API}: the carry tensor at {self._carry_path(index)} was moved to other "
                    f"memory after the step was captured (.data, set_ or resize_); the captured "
                    f"step would keep reading the old memory. Capture the step again."
                )
        for watcher in self._watched:
            watcher.check(_API)
        self._bindings.check(_API)
        autocast = _autocast_state(self._device.type)
        if autocast != self._autocast:
            raise RuntimeError(
                f"{_API}: autocast on {self._device.type} was {_shown_autocast(self._autocast)} "
                f"when the step was captured and is {_shown_autocast(autocast)} now; the "
                f"captured step keeps the kernels and dtypes of the old setting. Call it in the "
                f"autocast context it was captured in, or capture one step per setting."
            )

    def _carry_path(self, index: int) -> str:
        entries, _ = pytree.tree_flatten_with_path(self._carry)
        return repr(pytree.keystr(entries[index][0]))


def capture_step(
    step_fn: Callable, carry: Any, *example_inputs: Any, watch: Any = (), warmup: int = 3
) -> CapturedStep:
    """Capture a training step once and replay it: a CUDA graph on a CUDA device.

    ``step_fn(carry, *inputs) -> (new_carry, outputs)`` is one functional
    training step: ``carry`` is a pytree of tensors carried from step to step
    (``(params, opt_state)``), ``inputs`` the batch. It must compute gradients
    functionally (``torch.func.grad``/``grad_and_value``: the step runs under
    ``torch.no_grad()``) and have no host synchronisation (``.item()``,
    printing a tensor) and no data-dependent Python control flow.

    On a CUDA device the step is run ``warmup`` times on a side stream (its
    effects on the carry and the random generators undone), recorded once as a
    CUDA graph, and each call replays it; elsewhere each call runs it. Either way
    the carry's own tensors are updated in place (carry ``ensemble.params`` and
    the ensemble trains) and the call returns new output tensors. Everything the step
    updates must be in the carry: a step that writes another tensor in place (a
    buffer, a ``torch.optim`` optimizer's state) is refused after the warm-up, which
    is undone on the carry only.

    A call refuses inputs of another structure, shape, dtype or device than the
    example inputs, and refuses to run once something the capture baked in has
    changed: a module's parameter or buffer replaced or moved (``.to()``,
    ``load_state_dict(assign=True)``), its train/eval mode, an optimizer's
    hyperparameter, the autocast setting, or a value the step reads through a global,
    a closure or an attribute it names, rebound (``LR = 0.01``, ``config.scale = 2.0``).
    Modules and optimizers that ``step_fn`` reads through its closures and globals are
    watched; pass others in ``watch``.

    Args:
        step_fn: ``(carry, *inputs) -> (new_carry, outputs)``; may be a
            ``torch.compile``-d function.
        carry: pytree of tensors on one device, updated in place by every call.
        *example_inputs: inputs shaped like the real ones (their values are only
            used by the warm-up steps, whose effects are undone).
        watch: more modules or optimizers whose change makes the capture stale.
        warmup: steps run before recording (on the CPU, checks only).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from torch.func import grad_and_value
        >>> from tdfunc import Ensemble, capture_step, optim
        >>> ensemble = Ensemble(nn.Linear(3, 1), num_members=4)
        >>> opt = optim.sgd(lr=0.1)
        >>> def train_step(carry, x, y):
        ...     params, state = carry
        ...     def loss(p):
        ...         return ((ensemble.functional_call(p, x) - y) ** 2).mean(dim=(1, 2)).sum()
        ...     grads, value = grad_and_value(loss)(params)
        ...     updates, state = opt.update(grads, state, params)
        ...     return (optim.apply_updates(params, updates), state), value
        >>> params = ensemble.params
        >>> step = capture_step(train_step, (params, opt.init(params)), torch.randn(8, 3),
        ...                     torch.randn(8, 1))
        >>> step(torch.randn(8, 3), torch.randn(8, 1)).shape
        torch.Size([])
        >>> step.carry[0]["weight"] is ensemble.stacked.weight  # trained in place
        True
    """
    return CapturedStep(step_fn, carry, example_inputs, _as_tuple(watch), warmup)


def _autocast_state(device_type: str) -> tuple:
    if not torch.is_autocast_enabled(device_type):
        return (False, None)
    return (True, torch.get_autocast_dtype(device_type))


def _shown_autocast(state: tuple) -> str:
    return f"on ({state[1]})" if state[0] else "off"


# ---------------------------------------------------------------------- recording
def _record_cuda_graph(body: Callable[[], Any]) -> tuple[Any, Any]:
    """``body`` recorded as a CUDA graph: its outputs (static: each replay rewrites them)
    and the graph. Recording runs no kernel: the carry is untouched until the first
    replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = body()
    return outputs, graph


def _recorder(device: torch.device) -> Callable | None:
    """How steps on ``device`` are recorded; ``None``: they run as they are."""
    return _record_cuda_graph if device.type == "cuda" else None


# ---------------------------------------------------------------------- helpers
class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def _as_tuple(watch: Any) -> tuple:
    if isinstance(watch, (list, tuple)):
        return tuple(watch)
    return (watch,)


def _named(objects: tuple) -> list[tuple[str, Any]]:
    named = [(f"watch[{index}]", value) for index, value in enumerate(objects)]
    for name, value in named:
        if not watchers([(name, value)]):
            raise TypeError(
                f"{_API}: {name} is a {type(value).__name__}; watch takes modules (nn.Module) "
                f"and optimizers (tdfunc.optim transformations, torch.optim optimizers)."
            )
    return named


def _with_paths(tree: Any, leaves: list) -> list[tuple[str, Any]]:
    entries, _ = pytree.tree_flatten_with_path(tree)
    return [(pytree.keystr(path), leaf) for (path, _), leaf in zip(entries, leaves)]


def _difference(expected: Any, expected_name: str, got: Any, got_name: str) -> str:
    """Where two pytrees part, by key path (a treespec printed whole is a wall of text)."""
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(expected)[0]]
    others = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(got)[0]]
    for index, (path, other) in enumerate(zip(paths, others)):
        if path != other:
            return (
                f"leaf {index} is {path or 'the top'} in {expected_name} but {other} in {got_name}"
            )
    if len(paths) != len(others):
        return f"{expected_name} has {len(paths)} leaves, {got_name} {len(others)}"
    return f"{expected_name} and {got_name} hold the same key paths in containers of other kinds"


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:3])
    return shown + (f" (and {len(paths) - 3} more)" if len(paths) > 3 else "")


def _kind(api: str, what: str, path: str, leaf: Any) -> tuple:
    if not isinstance(leaf, torch.Tensor):
        raise TypeError(
            f"{api}: every {what} must be a tensor (a Python value would be baked into the "
            f"captured step); the {what} at {path or 'the top'} is a {type(leaf).__name__}. "
            f"Close over constants in step_fn, or pass them as tensors."
        )
    return _kind_fast(leaf)


def _kind_fast(leaf: Any) -> tuple:
    if not isinstance(leaf, torch.Tensor):
        return (type(leaf),)
    return (leaf.shape, leaf.dtype, leaf.device)


def _refuse_input(path: str, leaf: Any, expected: tuple) -> None:
    if not isinstance(leaf, torch.Tensor):
        got = type(leaf).__name__
    else:
        got = f"shape {list(leaf.shape)}, {leaf.dtype} on {leaf.device}"
    shape, dtype, device = expected
    raise ValueError(
        f"{_API}: the input at {path or 'the top'} has {got}; the step was captured for "
        f"shape {list(shape)}, {dtype} on {device}. A captured step replays on fixed "
        f"buffers: capture one step per input shape (pad or drop a last short batch)."
    )


def _output(index: int, leaf: Any, outputs: Any, static: set) -> torch.Tensor:
    if not isinstance(leaf, torch.Tensor):
        path = pytree.keystr(pytree.tree_flatten_with_path(outputs)[0][index][0])
        raise TypeError(
            f"{_API}: every output of step_fn must be a tensor (a Python value would be the "
            f"captured step's forever); the output at {path or 'the top'} is a "
            f"{type(leaf).__name__}."
        )
    leaf = leaf.detach()
    return leaf.clone() if _storage(leaf) in static else leaf


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor can reach: ``[start, end)``."""
    size = tensor.element_size()
    start = tensor.storage_offset() * size
    last = sum((extent - 1) * stride for extent, stride in zip(tensor.shape, tensor.stride()))
    return start, start + (last + 1) * size


def _storage(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.untyped_storage().data_ptr())
