"""Module paths that pickles written by earlier layouts of the core name, kept importable.

A pickle names a class by its module and name. ``NonTensorData`` and
``NonTensorStack`` now name the public ``tdfunc``, but containers pickled (or
``torch.save``-d) before the non-tensor leaves moved to ``helpers/nontensor`` name
``tdfunc._core.nontensor.leaves``: :func:`register` makes such old paths import the
modules that hold the classes today, so those files still load. Only paths of
tdfunc's own modules are aliased, and only to modules of this package.

Example:
    >>> import pickle
    >>> import tdfunc
    >>> pickle.loads(b"ctdfunc._core.nontensor.leaves\\nNonTensorData\\n.") is tdfunc.NonTensorData
    True
"""

from __future__ import annotations

import sys

from . import nested_keys
from .nontensor import in_transform, leaves, linked
from .nontensor import ops as nontensor_ops

# old module path -> the module that holds its classes now
OLD_PATHS = {
    "tdfunc._core.nontensor.leaves": leaves,
    "tdfunc._core.nontensor.linked": linked,
    "tdfunc._core.nontensor.in_transform": in_transform,
    "tdfunc._core.nontensor.ops": nontensor_ops,
    "tdfunc._core.keys.nested": nested_keys,
}


def register() -> None:
    """Make every old path importable (idempotent; a path already imported is kept)."""
    for path, module in OLD_PATHS.items():
        sys.modules.setdefault(path, module)
