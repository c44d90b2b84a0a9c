"""Are we traced, compiled or transformed? One place that asks torch, for all of tdfunc.

Three kinds of caller see a container, and several paths must know which one runs:

- **dynamo** (``torch.compile``, strict ``torch.export``) runs the Python code symbolically:
  it cannot run functorch's level queries, and a data-dependent branch there is a graph
  break. :data:`dynamo_compiling` is what dynamo folds to ``True``;
  :data:`compiling` is also true under the non-strict export and AOT tracers.
- **fake tensors** (``torch.export`` non-strict, AOT tracing): :func:`fake_tracing`.
- **functorch transforms** (``vmap``, ``grad``, ``jacrev``...): :func:`transformed`,
  with :data:`functorch_level`, :data:`interpreter_stack` and :data:`is_wrapped` for the
  paths that need the level or the wrapped tensors themselves.
- **CUDA graph recording** (``torch.cuda.graph``): :func:`cuda_capturing`.
- **fx** symbolic tracing (``torch.fx.symbolic_trace``): :data:`fx_tracing`; the TorchScript
  tracer (``torch.jit.trace``): :data:`jit_tracing`.

The names are torch's own functions (not wrappers): a call costs what torch's call
costs, and dynamo recognises them by identity. :func:`tracing` puts the questions
together for caches ("may anything be reused?"): every tracer and transform above,
``torch.jit.trace`` included, and any dispatch mode.

Example:
    >>> import torch
    >>> from tdfunc._core.helpers.tracing import tracing, transformed
    >>> tracing(), transformed()
    (False, False)
    >>> torch.func.vmap(lambda x: torch.tensor(transformed()))(torch.zeros(2)).tolist()
    [True, True]
"""

from __future__ import annotations

import torch
import torch.fx._symbolic_trace
from torch._C import _functorch

dynamo_compiling = torch.compiler.is_dynamo_compiling
compiling = torch.compiler.is_compiling
exporting = getattr(torch.compiler, "is_exporting", lambda: False)
fx_tracing = torch.fx._symbolic_trace.is_fx_tracing
jit_tracing = torch._C._get_tracing_state  # None outside torch.jit.trace

functorch_level = _functorch.maybe_current_level  # None outside every transform
interpreter_stack = _functorch.peek_interpreter_stack  # None outside every transform
is_wrapped = _functorch.is_functorch_wrapped_tensor  # a BatchedTensor, a GradTrackingTensor...
tensor_level = _functorch.maybe_get_level  # the level a tensor was wrapped at (-1: none)
batch_dim_of = _functorch.maybe_get_bdim  # -1 for a tensor that is not batched

# torch dispatch modes in effect, the fake and functional ones (infra modes) included
dispatch_modes = torch._C._len_torch_dispatch_stack
get_dispatch_mode = torch._C._get_dispatch_mode  # get_dispatch_mode(FAKE): the fake mode or None
FAKE = torch._C._TorchDispatchModeKey.FAKE


def transformed() -> bool:
    """Whether a functorch transform (``vmap``, ``grad``, ...) is running."""
    return interpreter_stack() is not None


def fake_mode() -> bool:
    """Whether a fake tensor mode is active (dynamo's own included)."""
    return get_dispatch_mode(FAKE) is not None


def fake_tracing() -> bool:
    """Whether fake tensors are being traced outside dynamo (``torch.export``, AOT tracing)."""
    return not dynamo_compiling() and get_dispatch_mode(FAKE) is not None


def cuda_capturing() -> bool:
    """Whether the current CUDA stream is being recorded into a CUDA graph.

    Reading a tensor's values back to Python is not allowed while recording.
    """
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def tracing(compiled: bool | None = None) -> bool:
    """Whether the current call is traced or transformed (then nothing may be cached).

    Traced means any tracer: dynamo, export, the AOT and fake-tensor tracers and
    ``torch.jit.trace``, which takes a tensor it did not see made for a constant.
    ``compiled``: ``compiling()``, when the caller has read it already.
    """
    if (compiling() if compiled is None else compiled) or exporting():
        return True
    if jit_tracing() is not None:
        return True
    # any dispatch mode: fake tensors (torch.export, AOT tracing), functionalization,
    # or a mode of the user's that must see every op (one call reads them all)
    if dispatch_modes():
        return True
    return interpreter_stack() is not None
