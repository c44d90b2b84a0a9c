"""Non-tensor leaves: Python objects carried along a batch.

``NonTensorData`` holds one Python value shared by every element of its batch.
``NonTensorStack`` holds one value per batch element (``.data`` is a nested list
with the shape of the batch); it appears when containers with different values
are stacked, when a value is written at an index, and, as in tensordict, when
``expand``, ``unsqueeze``, ``repeat`` or ``repeat_interleave`` lays a
``NonTensorData`` over a new batch: each element then references the same value
(no copies). Operations that only rearrange or select elements (``reshape``,
``view``, ``permute``, ``transpose``, ``flatten``, indexing, ``squeeze``,
``unbind``, ``split``, ``chunk``) keep one ``NonTensorData``. Reading either from a
``TensorDict`` returns the Python value (a nested list for a stack).

Both are treated as immutable by tdfunc: writes replace the leaf object.
"""

from .in_transform import StackInTransform
from .leaves import (
    NonTensorData,
    NonTensorStack,
    as_array,
    cat_non_tensor,
    from_array,
    padded,
    stack_non_tensor,
    write_at,
    written,
)
from .linked import LinkedList
from .ops import eq_mask, is_non_tensor, stack_of_list

__all__ = [
    "LinkedList",
    "NonTensorData",
    "NonTensorStack",
    "StackInTransform",
    "as_array",
    "cat_non_tensor",
    "eq_mask",
    "from_array",
    "is_non_tensor",
    "padded",
    "stack_non_tensor",
    "stack_of_list",
    "write_at",
    "written",
]
