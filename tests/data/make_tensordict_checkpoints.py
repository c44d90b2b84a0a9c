"""Write the tensordict 0.15.3 checkpoints in tests/data/tensordict_0_15_3/ (run by hand).

Run it with an interpreter where tensordict 0.15.3 is installed, in its own process
(importing tensordict replaces functions of torch's vmap, so tdfunc's tests never do):

    python tests/data/make_tensordict_checkpoints.py tests/data/tensordict_0_15_3

The values are simple functions of their shapes so that the tests can recompute
them with plain torch (see tests/persist/test_tensordict_format.py).
"""

import json
import os
import shutil
import sys

import tensordict
import torch
from tensordict import NonTensorStack, TensorDict, tensorclass

assert tensordict.__version__ == "0.15.3", tensordict.__version__
out = sys.argv[1]


@tensorclass
class Pair:
    x: torch.Tensor
    label: str


def write(name, td):
    path = os.path.join(out, name)
    shutil.rmtree(path, ignore_errors=True)
    td.memmap(path)


write(
    "plain",
    TensorDict(
        {
            "a": torch.arange(6, dtype=torch.float32).view(2, 3),
            "b": {"c": torch.arange(2, dtype=torch.int64), "flag": torch.tensor([True, False])},
            "note": "written by tensordict",
        },
        [2],
    ),
)
write("named", TensorDict({"a": torch.arange(6.0).view(2, 3)}, [2, 3], names=["rows", "cols"]))
write(
    "stack",
    TensorDict({"s": NonTensorStack("x", "y"), "h": torch.arange(2, dtype=torch.float16)}, [2]),
)
pair = Pair(x=torch.ones(2, 2), label="lab", batch_size=[2])
write("tensorclass", TensorDict({"pair": pair}, [2]))
write(
    "keys",
    TensorDict(
        {
            "next obs": torch.arange(2, dtype=torch.float32),
            "a:b": torch.arange(4, dtype=torch.int32).view(2, 2),
            "100%": torch.tensor([True, False]),
            "p%q": {"x y": torch.arange(2, dtype=torch.float64)},
            "lab el": "written by tensordict",
            "format": torch.zeros(2, dtype=torch.uint8),
            "é": torch.ones(2, dtype=torch.float16),
        },
        [2],
    ),
)
with open(os.path.join(out, "versions.json"), "w") as f:
    json.dump({"tensordict": tensordict.__version__, "torch": torch.__version__}, f)
