"""``torch.autograd.grad`` over containers: the leaves of every container in, containers out."""

from __future__ import annotations

from typing import Any

import torch

from .leafwise import is_collection, map_leaves, tensor_leaves

_Tensor = torch.Tensor


def _flat(items: Any) -> tuple[list, list]:
    """The tensors of ``items`` (a tensor, a container or a sequence of them) and per-item
    spans (``(container or None, count)``)."""
    if isinstance(items, _Tensor) or is_collection(items):
        items = (items,)
    tensors: list = []
    spans: list = []
    for item in items:
        if is_collection(item):
            leaves = tensor_leaves(item._to_tensordict_view())
            spans.append((item, len(leaves)))
            tensors.extend(leaves)
        else:
            spans.append((None, 1))
            tensors.append(item)
    return tensors, spans


def autograd_grad(outputs: Any, inputs: Any, grad_outputs: Any = None, **kwargs: Any) -> Any:
    """``torch.autograd.grad`` where outputs, inputs and grad_outputs may be containers.

    The gradient with respect to a container input is a container of the same class and
    structure. When ``inputs`` is one container, that container of gradients is returned
    (as tensordict does); otherwise a tuple with one entry per input, like torch. torch
    hands a lone input over as a one-tuple, so ``inputs=(td,)`` also gives the container.

    Example:
        >>> x = TensorDict({"w": torch.ones(2, requires_grad=True)}, [2])
        >>> g = torch.autograd.grad((x * x).sum(reduce=True), x)
        >>> g["w"].tolist()
        [2.0, 2.0]
    """
    out_tensors, _ = _flat(outputs)
    in_tensors, spans = _flat(inputs)
    grad_tensors = None
    if grad_outputs is not None:
        grad_tensors, _ = _flat(grad_outputs)
    grads = torch.autograd.grad(out_tensors, in_tensors, grad_tensors, **kwargs)
    results: list = []
    position = 0
    for container, count in spans:
        chunk = grads[position : position + count]
        position += count
        if container is None:
            results.append(chunk[0])
        else:
            values = iter(chunk)
            results.append(map_leaves(container, lambda t, it=values: next(it), None, True, None))
    if len(spans) == 1 and spans[0][0] is not None:
        return results[0]
    return tuple(results)
