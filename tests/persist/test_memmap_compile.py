"""Memory-mapped leaves in compiled functions.

A ``MemoryMappedTensor`` is a ``torch.Tensor`` subclass. Its view methods (``t()``,
``view``, indexing) keep the file's identity in eager mode by reading storage
addresses, which dynamo cannot trace: in a compiled function they give plain views.
torch's AOT backends (``aot_eager``, ``inductor``) refuse a tensor subclass input on
their first call; ``as_tensor()`` (no copy) is the documented cure. Each compiled
result is compared with the same function run eagerly on plain tensors.
"""

from __future__ import annotations

import torch

from tdfunc import MemoryMappedTensor, TensorDict


def _layer(params, x):
    return torch.nn.functional.linear(x, params["w"], params["b"]) + x @ params["w"].t()[:, :3]


def _saved(tmp_path) -> tuple[TensorDict, TensorDict]:
    torch.manual_seed(0)
    plain = TensorDict({"w": torch.randn(3, 4), "b": torch.randn(3)}, [])
    plain.memmap(tmp_path / "params")
    return plain, TensorDict.load_memmap(tmp_path / "params")


def test_view_methods_of_a_mapped_leaf_trace_without_a_graph_break(tmp_path):
    plain, loaded = _saved(tmp_path)
    assert isinstance(loaded["w"], MemoryMappedTensor)
    x = torch.randn(2, 4)
    torch._dynamo.reset()
    compiled = torch.compile(_layer, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(loaded, x), _layer(plain, x))
    # eager views still keep the file
    assert isinstance(loaded["w"].t(), MemoryMappedTensor)
    assert isinstance(loaded["w"][0], MemoryMappedTensor)


def test_as_tensor_is_the_cure_for_aot_backends(tmp_path):
    plain, loaded = _saved(tmp_path)
    x = torch.randn(2, 4)
    torch._dynamo.reset()
    compiled = torch.compile(_layer, backend="aot_eager", fullgraph=True)
    unwrapped = loaded.as_tensor()
    assert type(unwrapped["w"]) is torch.Tensor
    assert unwrapped["w"].data_ptr() == loaded["w"].data_ptr()  # no copy: the mapping
    for _ in range(2):
        torch.testing.assert_close(compiled(unwrapped, x), _layer(plain, x))
    single = loaded["w"].as_subclass(torch.Tensor)
    torch._dynamo.reset()
    matmul = torch.compile(lambda w, x: x @ w.t(), backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(matmul(single, x), x @ plain["w"].t())
