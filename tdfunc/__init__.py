"""tdfunc: TensorDict and TensorClass, native pytree containers for torch.func.

The public classes are composed in ``tdfunc/_assembly.py``; ``Ensemble`` and
``tdfunc.optim`` are built on top of them.

Example:
    >>> import torch
    >>> from tdfunc import TensorDict
    >>> td = TensorDict({"a": torch.zeros(3, 4)}, batch_size=[3])
    >>> td[0]["a"].shape
    torch.Size([4])
"""

from ._assembly import DistributedWork as DistributedWork
from ._assembly import MemoryMappedTensor as MemoryMappedTensor
from ._assembly import ModuleSwap as ModuleSwap
from ._assembly import NestedKey as NestedKey
from ._assembly import NonTensorData as NonTensorData
from ._assembly import NonTensorStack as NonTensorStack
from ._assembly import PackLayout as PackLayout
from ._assembly import TensorAttrs as TensorAttrs
from ._assembly import TensorClass as TensorClass
from ._assembly import TensorCollection as TensorCollection
from ._assembly import TensorDict as TensorDict
from ._assembly import TensorDictBase as TensorDictBase
from ._assembly import cat as cat
from ._assembly import collate as collate
from ._assembly import dims_like as dims_like
from ._assembly import from_any as from_any
from ._assembly import from_arrow as from_arrow
from ._assembly import from_consolidated as from_consolidated
from ._assembly import from_csv as from_csv
from ._assembly import from_dataclass as from_dataclass
from ._assembly import from_dict as from_dict
from ._assembly import from_json as from_json
from ._assembly import from_module as from_module
from ._assembly import from_modules as from_modules
from ._assembly import from_namedtuple as from_namedtuple
from ._assembly import from_pandas as from_pandas
from ._assembly import from_parquet as from_parquet
from ._assembly import from_pytree as from_pytree
from ._assembly import from_struct_array as from_struct_array
from ._assembly import from_tuple as from_tuple
from ._assembly import functional_call as functional_call
from ._assembly import gather_members as gather_members
from ._assembly import get_printoptions as get_printoptions
from ._assembly import group_by as group_by
from ._assembly import is_non_tensor as is_non_tensor
from ._assembly import is_tensor_collection as is_tensor_collection
from ._assembly import is_tensorclass as is_tensorclass
from ._assembly import make_tensordict as make_tensordict
from ._assembly import memmap as memmap
from ._assembly import merge_tensordicts as merge_tensordicts
from ._assembly import pad as pad
from ._assembly import pad_sequence as pad_sequence
from ._assembly import parse_tensor_dict_string as parse_tensor_dict_string
from ._assembly import set_capture_non_tensor_stack as set_capture_non_tensor_stack
from ._assembly import set_list_to_stack as set_list_to_stack
from ._assembly import set_printoptions as set_printoptions
from ._assembly import shard_ensemble as shard_ensemble
from ._assembly import shard_range as shard_range
from ._assembly import stack as stack
from ._assembly import tensorclass as tensorclass
from ._assembly import to_arrow as to_arrow
from ._assembly import unpad_sequence as unpad_sequence
from ._assembly import unravel_key as unravel_key

# tensordict's small helpers, at its top level too
from .utils import assert_close as assert_close  # isort: skip
from .utils import capture_non_tensor_stack as capture_non_tensor_stack  # isort: skip
from .utils import default_is_leaf as default_is_leaf  # isort: skip
from .utils import is_bool as is_bool  # isort: skip
from .utils import is_floating as is_floating  # isort: skip
from .utils import is_inexact as is_inexact  # isort: skip
from .utils import is_integer as is_integer  # isort: skip
from .utils import is_leaf_nontensor as is_leaf_nontensor  # isort: skip
from .utils import list_to_stack as list_to_stack  # isort: skip
from .utils import unravel_key_list as unravel_key_list  # isort: skip
from .utils import unravel_key_to_tuple as unravel_key_to_tuple  # isort: skip

# the top floor, built on the public API above
# DataLoader collation of containers, registered once at import
from . import _collate as _collate  # isort: skip
from . import optim as optim  # isort: skip
from ._ensemble import register_batched as register_batched  # isort: skip
from ._ensemble.ensemble import Ensemble as Ensemble  # isort: skip
from ._ensemble.explain import EnsembleFallbackWarning as EnsembleFallbackWarning  # isort: skip
from ._capture import CapturedStep as CapturedStep  # isort: skip
from ._capture import capture_step as capture_step  # isort: skip

from ._version import __version__ as __version__  # isort: skip
