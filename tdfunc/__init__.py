"""tdfunc: TensorDict and TensorClass, native pytree containers for torch.func.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3])
    >>> td[0]["a"].shape
    torch.Size([4])
"""

from ._container import TensorDict as TensorDict
from ._container import is_tensor_collection as is_tensor_collection
from ._keys import NestedKey as NestedKey
from ._keys import unravel_key as unravel_key
from ._nontensor import NonTensorData as NonTensorData
from ._nontensor import NonTensorStack as NonTensorStack

__version__ = "0.1.0"
