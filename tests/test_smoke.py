import torch

import tdfunc
from tdfunc import TensorDict


def test_import_leaves_torch_functorch_untouched():
    import torch._functorch.vmap as functorch_vmap

    names = ["_process_batched_inputs", "_create_batched_inputs", "_unwrap_batched"]
    before = {n: getattr(functorch_vmap, n) for n in names}
    import importlib

    importlib.reload(tdfunc)
    after = {n: getattr(functorch_vmap, n) for n in names}
    assert before == after
    assert all(getattr(f, "__module__", "").startswith("torch") for f in after.values())


def test_readme_example():
    data = TensorDict({"key 1": torch.ones(3, 4, 5)}, batch_size=[3, 4])
    data["nested", "key"] = torch.zeros(3, 4)
    assert data[..., :2].shape == torch.Size([3, 2])
    assert torch.stack([data, data], 1)["key 1"].shape == torch.Size([3, 2, 4, 5])
