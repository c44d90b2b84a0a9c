"""Complex leaves stepped as ``torch.optim`` steps them: as pairs of real numbers.

``torch.optim``'s Adam, AdamW and RMSprop view every complex parameter, gradient
and state entry as real (``torch.view_as_real``, a trailing dim of 2) before the
update, so that the second moment of ``a + bi`` holds ``a**2`` and ``b**2``: a
plain ``g * g`` of the complex number would mix both parts (and be complex).
The rules run on those real views; the results are viewed back as complex.
SGD's update is linear, so the views change nothing there, and it takes them too.
"""

from __future__ import annotations

import torch

from . import _hyper as H

_is_complex = torch.is_complex


def any_complex(leaves: list) -> bool:
    return any(map(_is_complex, leaves))


def as_real(leaves: list | None) -> list | None:
    """Each complex leaf as its real view (shared storage: in-place updates reach it)."""
    if leaves is None:
        return None
    return [torch.view_as_real(x) if _is_complex(x) else x for x in leaves]


def as_complex(results: list | None, like: list) -> list | None:
    """``results`` (real views of ``like``'s complex leaves) viewed back as complex."""
    if results is None:
        return None
    return [
        torch.view_as_complex(_pairs_contiguous(r)) if _is_complex(x) else r
        for r, x in zip(results, like)
    ]


def _pairs_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    # view_as_complex needs the (real, imaginary) pairs next to each other
    if tensor.stride(-1) != 1 or tensor.storage_offset() % 2:
        return tensor.contiguous()
    return tensor


def per_leaf_hypers(hypers: dict, like: list) -> dict:
    """Per-leaf hyperparameter values given a trailing dim where their leaf became real.

    A per-leaf value broadcasts against its leaf from the right; the real view of a
    complex leaf has one more trailing dim (the pair), against which it must not align.
    """
    out = dict(hypers)
    for name, value in hypers.items():
        if isinstance(value, H.Leaves):
            out[name] = H.Leaves(
                [
                    v.unsqueeze(-1) if isinstance(v, torch.Tensor) and _is_complex(x) else v
                    for v, x in zip(value.values, like)
                ]
            )
    return out
