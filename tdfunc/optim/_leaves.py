"""The leaves of TensorDicts read and rebuilt directly, for the per-step path.

``update`` and ``apply_updates`` run once per training step on pytrees of one
structure: the gradients, the parameters and the optimizer's moments. For plain
TensorDicts (tensors and nested TensorDicts, nothing else) the leaves are read
by walking the entries in key order, which is the order in which the pytree
registration flattens them, and the results are built with the container's
trusted constructor: no treespec is made or compared, and every pytree is read
once.

:func:`read` accepts only what the generic path would accept and compute the
same way: the same class at every level, the same keys in the same order, the
same leaf shapes. Anything else (a TensorClass, non-tensor entries, dicts,
another key order, other shapes) gives ``None``, and the caller takes the
generic pytree path, which also raises the errors.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from .._assembly import TensorDict

_Tensor = torch.Tensor


def tensordict_type() -> type:
    """``tdfunc.TensorDict``, the only container whose leaves are read here."""
    return TensorDict


def read(template: Any, others: list) -> tuple[list, list[list]] | None:
    """The leaves of ``template`` and of each of ``others``, in key order.

    ``None`` unless every tree is a plain TensorDict with ``template``'s keys,
    in its order, at every level, and leaves of ``template``'s shapes.
    """
    kind = tensordict_type()
    if type(template) is not kind:
        return None
    leaves: list = []
    keys: list = []
    if not _collect(kind, template, leaves, keys):
        return None
    other_leaves = []
    for other in others:
        if type(other) is not kind:
            return None
        found: list = []
        found_keys: list = []
        if not _collect(kind, other, found, found_keys) or found_keys != keys:
            return None
        other_leaves.append(found)
    shapes = list(map(_shape, leaves))
    for found in other_leaves:
        if list(map(_shape, found)) != shapes:
            return None
    return leaves, other_leaves


_shape = operator.attrgetter("shape")
# bracket a nested level in the key sequence, so that the sequence names the structure
_OPEN, _CLOSE = object(), object()


def _collect(kind: type, node: Any, leaves: list, keys: list) -> bool:
    """Append ``node``'s leaves and keys; False at anything but tensors and TensorDicts."""
    for key, value in node._data.items():
        keys.append(key)
        if isinstance(value, _Tensor):
            leaves.append(value)
        elif type(value) is kind:
            keys.append(_OPEN)
            if not _collect(kind, value, leaves, keys):
                return False
            keys.append(_CLOSE)
        else:
            return False
    return True


def build(template: Any, leaves: list) -> Any:
    """A TensorDict of ``template``'s structure holding ``leaves`` (shaped like its own).

    ``template`` is a tree :func:`read` accepted; the batch sizes, device and
    names of every level are ``template``'s, as unflattening would infer them.
    """
    return _build(type(template), template, iter(leaves))


def _build(kind: type, node: Any, leaves: Any) -> Any:
    data = {}
    for key, value in node._data.items():
        data[key] = _build(kind, value, leaves) if type(value) is kind else next(leaves)
    return node._like(data)
