"""One reading of a ``device=`` argument for every container."""

from __future__ import annotations

from typing import Any

import torch


def as_device(device: Any) -> torch.device:
    """``torch.device(device)``, with the current index filled in for an indexed type.

    A tensor made with ``device="cuda"`` reports ``cuda:0`` (the current device);
    a container asked for ``"cuda"`` reports the same, so that
    ``td.device == td["x"].device`` holds, as it does in tensordict. Types whose
    tensors carry no index (``cpu``, ``meta``) and types without a ``current_device``
    are left as given.

    Example:
        >>> as_device("cpu")
        device(type='cpu')
    """
    device = torch.device(device)
    if device.index is not None or device.type in ("cpu", "meta"):
        return device
    module = getattr(torch, device.type, None)
    current = getattr(module, "current_device", None)
    available = getattr(module, "is_available", None)
    if current is None or available is None or not available():
        return device
    return torch.device(device.type, current())
