"""The byte layout of a TensorDict on the wire (see ``_distributed``).

A container's tensor leaves in key-path order, their structure digests (stable
across processes: ``hashlib``, not ``hash``), and packing into / unpacking from
uint8 buffers. A message holding several leaves has one run per (device,
dtype) group, in order of first appearance, each padded to 16 bytes so that
every run can be viewed as its dtype; a message holding one leaf is its bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

_MAGIC = 0x7464_6675_6E63  # "tdfunc"
_VERSION = 1
_HEADER_LEN = 8
_HEADER_BYTES = _HEADER_LEN * 8
_HEADER_FORMAT = f"={_HEADER_LEN}q"
_DIRECT_BYTES = 1 << 18  # in bigger payloads, a leaf this big travels alone, without copies
_DIGEST_MASK = (1 << 62) - 1  # keeps -digest representable in int64


class _Layout:
    """The tensor leaves of a container in key-path order, with their digests.

    Byte layout of a message holding several leaves: one run per (device, dtype)
    group, in order of first appearance, each padded to 16 bytes so that every
    run can be viewed as its dtype. A message holding one leaf is its bytes.
    """

    __slots__ = ("device", "digest", "key_digest", "kinds", "nbytes", "paths", "tensors", "total")

    def __init__(self, collection: Any, api: str, receive: bool = False) -> None:
        leaves: list = []
        if receive:
            _check_receivable(collection, (), api)
        _collect(collection._to_tensordict_view(), (), leaves, api, receive)
        leaves.sort(key=_first)
        self.paths = [path for path, _ in leaves]
        self.tensors = tensors = [tensor for _, tensor in leaves]
        self.nbytes = [t.nbytes for t in tensors]
        self.kinds = [(t.device, t.dtype) for t in tensors]  # read once: attribute reads cost
        self.device = self.kinds[0][0] if tensors else torch.device("cpu")
        self.total = self.message_bytes(range(len(tensors)))  # bounds every message
        keys = repr(self.paths)
        dtypes = ",".join([_dtype_name(kind[1]) for kind in self.kinds])
        shapes = repr([tuple(t.shape) for t in tensors])
        self.key_digest = _digest(keys)
        self.digest = _digest(f"{keys}\n{dtypes}\n{shapes}")

    def describe(self, limit: int = 6) -> str:
        parts = [
            f"{_path_str(path)}: {_dtype_name(t.dtype).replace('torch.', '')}{list(t.shape)}"
            for path, t in zip(self.paths[:limit], self.tensors[:limit])
        ]
        if len(self.paths) > limit:
            parts.append(f"... ({len(self.paths) - limit} more)")
        return f"{len(self.paths)} tensor leaves, {self.total} bytes ({', '.join(parts)})"

    def header(self, messages: int, inline: bool) -> torch.Tensor:
        values = (_MAGIC, _VERSION, self.digest, self.key_digest, self.total, len(self.paths))
        raw = struct.pack(_HEADER_FORMAT, *values, dist.get_rank(), (messages << 1) | inline)
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(self.device)

    def groups(self, indices) -> list[list[int]]:
        """``indices`` grouped by (device, dtype), in order of first appearance."""
        groups: dict = {}
        kinds = self.kinds
        for index in indices:
            groups.setdefault(kinds[index], []).append(index)
        return list(groups.values())

    def message_bytes(self, indices) -> int:
        indices = list(indices)
        if len(indices) == 1:
            return self.nbytes[indices[0]]
        return sum(_aligned(sum(self.nbytes[i] for i in group)) for group in self.groups(indices))

    # ---- byte buffers (point-to-point, broadcast)
    def segments(self, split: bool) -> list[list[int]]:
        """Leaf indices per message: small leaves packed together, big ones alone.

        Depends on the structure only, so sender and receiver agree. A big leaf
        travels without a copy when it is contiguous on both sides.
        """
        if not self.tensors:
            return []
        if not split:
            return [list(range(len(self.tensors)))]
        small = [i for i, size in enumerate(self.nbytes) if size < _DIRECT_BYTES]
        big = [[i] for i, size in enumerate(self.nbytes) if size >= _DIRECT_BYTES]
        return ([small] if small else []) + big

    def pack(self, indices: list[int], prefix: torch.Tensor | None = None) -> torch.Tensor:
        """One uint8 buffer holding the leaves at ``indices`` (after ``prefix``)."""
        if prefix is None and len(indices) == 1:  # a view when the leaf is contiguous
            return self.tensors[indices[0]].detach().reshape(-1).view(torch.uint8).to(self.device)
        pieces = [] if prefix is None else [prefix]
        with torch.no_grad():
            for group in self.groups(indices):
                run = _flatten([self.tensors[i] for i in group]).view(torch.uint8)
                pieces.append(run.to(self.device))
                pad = _aligned(run.numel()) - run.numel()
                if pad:  # zeros: never send uninitialised memory
                    pieces.append(torch.zeros(pad, dtype=torch.uint8, device=self.device))
        return torch.cat(pieces) if len(pieces) > 1 else pieces[0]

    def receive_buffer(self, indices: list[int]) -> tuple[torch.Tensor, bool]:
        """A buffer to receive ``indices`` into, and whether it must be unpacked afterwards."""
        if len(indices) == 1:
            tensor = self.tensors[indices[0]].detach()
            if tensor.is_contiguous() and tensor.device == self.device:
                return tensor.view(-1).view(torch.uint8), False
        size = self.message_bytes(indices)
        return torch.empty(size, dtype=torch.uint8, device=self.device), True

    def unpack(self, indices: list[int], buffer: torch.Tensor) -> None:
        if len(indices) == 1:
            target = self.tensors[indices[0]].detach()
            target.copy_(buffer[: target.nbytes].view(target.dtype).view(target.shape))
            return
        offset = 0
        with torch.no_grad():  # the targets may be leaves that require grad
            for group in self.groups(indices):
                targets = [self.tensors[i] for i in group]
                size = sum(self.nbytes[i] for i in group)
                run = buffer[offset : offset + size].view(targets[0].dtype)
                _copy_into(targets, run.to(targets[0].device))
                offset += _aligned(size)


def _check_receivable(container: Any, path: tuple, api: str) -> None:
    """A receive writes every leaf in place: a frozen TensorClass anywhere refuses."""
    if not getattr(type(container), "_tc_frozen", False):
        return
    name = type(container).__name__
    if not path:
        raise dataclasses.FrozenInstanceError(
            f"{name}.{api}: cannot receive into a frozen {name}: {api} writes the received "
            f"values into its tensors. Receive into a TensorDict (td = instance.to_tensordict(); "
            f"td.{api}(...)) and rebuild the instance with {name}.from_tensordict(td)."
        )
    raise RuntimeError(
        f"TensorDict.{api}: cannot write the received values into key {_path_str(path)}: it "
        f"holds a frozen {name}, which refuses every write. Replace it with a TensorDict "
        f"(td[key] = td[key].to_tensordict()) before receiving, or rebuild it afterwards."
    )


def _collect(td: Any, prefix: tuple, out: list, api: str, receive: bool = False) -> None:
    for key, value in td._data.items():
        if isinstance(value, torch.Tensor):
            if value.is_nested:  # strided layout too, but no flat bytes to send
                raise TypeError(
                    f"TensorDict.{api}: nested (ragged) tensors cannot be communicated; the "
                    f"value at key {_path_str(prefix + (key,))} is one. Hint: send a padded "
                    f"tensor (torch.nested.to_padded_tensor) and the lengths instead."
                )
            if value.layout != torch.strided:
                raise TypeError(
                    f"TensorDict.{api}: only dense (strided) tensors can be communicated; the "
                    f"value at key {_path_str(prefix + (key,))} has layout {value.layout}. "
                    f"Hint: convert it with .to_dense() first."
                )
            if receive and value.numel() > 1 and torch._debug_has_internal_overlap(value) == 1:
                raise RuntimeError(
                    f"TensorDict.{api}: cannot write the received values into key "
                    f"{_path_str(prefix + (key,))}: several of its elements share one memory "
                    f"location (an expanded tensor, stride {value.stride()}), so they cannot "
                    f"hold different values. Hint: give it its own memory first "
                    f"(td[key] = td[key].clone())."
                )
            out.append((prefix + (key,), value))
        elif getattr(type(value), "_is_tensor_collection", False):
            if receive:
                _check_receivable(value, prefix + (key,), api)
            _collect(value._to_tensordict_view(), prefix + (key,), out, api, receive)
        # non-tensor leaves are Python objects: not communicated


def _first(item: tuple) -> Any:
    return item[0]


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _aligned(nbytes: int) -> int:
    return (nbytes + 15) & ~15


def _flatten(tensors: list) -> torch.Tensor:
    """One flat tensor holding ``tensors`` (same dtype and device), in one C++ call."""
    if len(tensors) == 1:
        return tensors[0].reshape(-1)
    return _flatten_dense_tensors(tensors)


def _copy_into(targets: list, flat: torch.Tensor) -> None:
    """Copy consecutive runs of ``flat`` into ``targets`` (any strides, in place)."""
    if len(targets) == 1:
        targets[0].copy_(flat.view(targets[0].shape))
    else:
        torch._foreach_copy_(targets, _unflatten_dense_tensors(flat, targets))


def _digest(text: str) -> int:
    raw = hashlib.blake2b(text.encode(), digest_size=8).digest()  # stable across processes
    return int.from_bytes(raw, "little") & _DIGEST_MASK


def _path_str(path: tuple) -> str:
    return repr(path[0]) if len(path) == 1 else repr(path)
