"""Functions over containers, importable as ``tdfunc.functional`` (``tensordict.functional``).

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> from tdfunc.functional import pad
    >>> pad(TensorDict({"a": torch.ones(2)}, [2]), [0, 1])["a"].tolist()
    [1.0, 1.0, 0.0]
"""

from ._assembly import make_tensordict as make_tensordict
from ._core.helpers.by_value import group_by as group_by
from ._core.helpers.collating import collate as collate
from ._core.helpers.padding import pad as pad
from ._core.helpers.padding import pad_sequence as pad_sequence
from ._core.helpers.unpadding import unpad_sequence as unpad_sequence
from ._core.shape.combine import cat as cat
from ._core.shape.combine import merge_tensordicts as merge_tensordicts
from ._core.shape.combine import stack as stack

__all__ = [
    "cat",
    "collate",
    "group_by",
    "make_tensordict",
    "merge_tensordicts",
    "pad",
    "pad_sequence",
    "stack",
    "unpad_sequence",
]
