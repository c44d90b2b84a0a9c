"""tdfunc: TensorDict and TensorClass, native pytree containers for torch.func.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3])
    >>> td[0]["a"].shape
    torch.Size([4])
"""

from ._base import TensorDictBase as TensorDictBase
from ._container import TensorDict as TensorDict
from ._container import is_tensor_collection as is_tensor_collection
from ._dims import dims_like as dims_like
from ._distributed import DistributedWork as DistributedWork
from ._ensemble import Ensemble as Ensemble
from ._keys import NestedKey as NestedKey
from ._keys import unravel_key as unravel_key
from ._memmap_tensor import MemoryMappedTensor as MemoryMappedTensor
from ._nontensor import NonTensorData as NonTensorData
from ._nontensor import NonTensorStack as NonTensorStack
from ._sharded import gather_members as gather_members
from ._sharded import shard_ensemble as shard_ensemble
from ._sharded import shard_range as shard_range
from ._tensorclass import TensorClass as TensorClass
from ._tensorclass import is_tensorclass as is_tensorclass
from ._tensorclass import tensorclass as tensorclass

__version__ = "0.1.0"
