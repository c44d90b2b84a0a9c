"""tdfunc: TensorDict and TensorClass, native pytree containers for torch.func.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3])
    >>> td[0]["a"].shape
    torch.Size([4])
"""

# last: the optimizers use the public API above
# DataLoader collation of containers, registered once at import
from . import _collate as _collate
from . import optim as optim
from ._core.base import TensorDictBase as TensorDictBase
from ._core.container import TensorDict as TensorDict
from ._core.container import is_tensor_collection as is_tensor_collection
from ._core.keys.nested import NestedKey as NestedKey
from ._core.keys.nested import unravel_key as unravel_key
from ._core.nontensor import NonTensorData as NonTensorData
from ._core.nontensor import NonTensorStack as NonTensorStack
from ._core.nontensor import is_non_tensor as is_non_tensor
from ._core.options import get_printoptions as get_printoptions
from ._core.options import set_capture_non_tensor_stack as set_capture_non_tensor_stack
from ._core.options import set_list_to_stack as set_list_to_stack
from ._core.options import set_printoptions as set_printoptions
from ._core.shape.combine import cat as cat
from ._core.shape.combine import merge_tensordicts as merge_tensordicts
from ._core.shape.combine import pad as pad
from ._core.shape.combine import pad_sequence as pad_sequence
from ._core.shape.combine import stack as stack
from ._distributed import DistributedWork as DistributedWork
from ._distributed.sharded import gather_members as gather_members
from ._distributed.sharded import shard_ensemble as shard_ensemble
from ._distributed.sharded import shard_range as shard_range
from ._ensemble import register_batched as register_batched
from ._ensemble.ensemble import Ensemble as Ensemble
from ._modules.functional_call import functional_call as functional_call
from ._modules.swap_handle import ModuleSwap as ModuleSwap
from ._persist import MemoryMappedTensor as MemoryMappedTensor
from ._pytree.dims import dims_like as dims_like
from ._tensorclass.tensorclass import TensorClass as TensorClass
from ._tensorclass.tensorclass import is_tensorclass as is_tensorclass
from ._tensorclass.tensorclass import tensorclass as tensorclass
from ._version import __version__ as __version__
