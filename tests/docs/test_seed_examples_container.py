"""The TensorDict examples of tensordict's README, with only the import changed.

Where the documentation prints something, the test asserts what it shows; the repr uses
the newer form of the newer TensorClass page
(``Tensor(shape=..., device=..., dtype=..., is_shared=...)``).
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict


# ---------------------------------------------------------------- General
def test_general_batch_size_and_keys():
    data = TensorDict(
        {
            "key 1": torch.ones(3, 4, 5),
            "key 2": torch.zeros(3, 4, 5, dtype=torch.bool),
        },
        batch_size=[3, 4],
    )
    assert data.batch_size == torch.Size([3, 4])
    assert data["key 2"].dtype == torch.bool


def _device_example(device: str):
    data = TensorDict(
        {
            "key 1": torch.ones(3, 4, 5),
            "key 2": torch.zeros(3, 4, 5, dtype=torch.bool),
        },
        batch_size=[3, 4],
        device=device,
    )
    data["key 3"] = torch.randn(3, 4, device="cpu")
    assert data["key 3"].device == torch.device(device)
    return data


def test_general_device_moves_written_values_meta():
    # the documentation uses "cuda:0"; the meta device exercises the same path on any machine
    _device_example("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_general_device_moves_written_values_cuda():
    _device_example("cuda:0")


def test_general_nested_values_and_unravelled_keys():
    data = TensorDict(
        {"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
        batch_size=[3, 4],
    )
    data["nested", "key"] = torch.zeros(3, 4)  # the batch-size must match
    data["nested", ("supernested", ("key",))] = torch.zeros(3, 4)
    assert (data["nested", "supernested", "key"] == 0).all()
    assert (("nested",), "supernested", (("key",),)) in data.keys(include_nested=True)
    with pytest.raises(ValueError, match="batch size \\[3, 4\\]"):
        data["nested", "bad"] = torch.zeros(4, 3)


def test_general_non_tensor_data():
    data = TensorDict({"a-tensor": torch.randn(1, 2)}, batch_size=[1, 2])
    data["non-tensor"] = "a string!"
    assert data["non-tensor"] == "a string!"


# ---------------------------------------------------------------- Tensor-like features
def _seed_data():
    return TensorDict(
        {"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
        batch_size=[3, 4],
    )


def test_tensor_like_indexing():
    data = _seed_data()
    sub_tensordict = data[..., :2]
    assert sub_tensordict.shape == torch.Size([3, 2])
    assert sub_tensordict["key 1"].shape == torch.Size([3, 2, 5])


def test_tensor_like_stack_and_cat():
    tensordicts = [_seed_data() for _ in range(2)]
    stack_tensordict = torch.stack(tensordicts, 1)
    assert stack_tensordict.shape == torch.Size([3, 2, 4])
    assert stack_tensordict["key 1"].shape == torch.Size([3, 2, 4, 5])
    cat_tensordict = torch.cat(tensordicts, 0)
    assert cat_tensordict.shape == torch.Size([6, 4])
    assert cat_tensordict["key 1"].shape == torch.Size([6, 4, 5])


def test_tensor_like_view_reshape_unsqueeze():
    data = _seed_data()
    # the documentation prints the resulting batch sizes
    assert data.view(-1).shape == torch.Size([12])
    assert data.reshape(-1).shape == torch.Size([12])
    assert data.unsqueeze(-1).shape == torch.Size([3, 4, 1])


def test_tensor_like_to_share_clone_update_split_unbind_expand():
    data = _seed_data()
    assert data.to("meta")["key 1"].device.type == "meta"
    clone = data.clone()
    assert clone["key 1"] is not data["key 1"]
    clone.update_({"key 1": torch.full((3, 4, 5), 2.0)})
    assert (data["key 1"] == 1).all() and (clone["key 1"] == 2).all()
    assert [p.shape for p in data.split(2, 0)] == [torch.Size([2, 4]), torch.Size([1, 4])]
    assert len(data.unbind(1)) == 4
    assert data.expand(2, 3, 4).shape == torch.Size([2, 3, 4])
    assert data.clone().share_memory_().is_shared()


def test_apply_uniform():
    data = TensorDict({"key 1": torch.ones(3, 4, 5), "key 3": torch.zeros(3, 4)}, [3, 4])
    tensordict_uniform = data.apply(lambda tensor: tensor.uniform_())
    assert ((tensordict_uniform["key 1"] >= 0) & (tensordict_uniform["key 1"] < 1)).all()


def test_apply_filter():
    data = TensorDict(
        {"a": torch.tensor(1.0, dtype=torch.float), "b": torch.tensor(1, dtype=torch.int64)}, []
    )
    data_float = data.apply(lambda x: x if x.dtype == torch.float else None)
    assert "b" not in data_float
    assert "a" in data_float


# ---------------------------------------------------------------- Lazy preallocation
def foo():
    data = TensorDict({}, batch_size=[])
    data["a"] = torch.randn(3)
    data["b"] = TensorDict({"c": torch.zeros(2)}, batch_size=[])
    return data


LAZY_REPR = "\n".join(
    [
        "TensorDict(",
        "    fields={",
        "        a: Tensor(shape=torch.Size([10, 3]), device=cpu, dtype=torch.float32, "
        "is_shared=False),",
        "        b: TensorDict(",
        "            fields={",
        "                c: Tensor(shape=torch.Size([10, 2]), device=cpu, dtype=torch.float32, "
        "is_shared=False)},",
        "            batch_size=torch.Size([10]),",
        "            device=None,",
        "            is_shared=False)},",
        "    batch_size=torch.Size([10]),",
        "    device=None,",
        "    is_shared=False)",
    ]
)


def test_lazy_preallocation_stack_way():
    N = 10
    data = torch.stack([foo() for _ in range(N)])
    assert repr(data) == LAZY_REPR


@pytest.mark.parametrize("shuffled", [False, True])
def test_lazy_preallocation(shuffled):
    N = 10
    torch.manual_seed(0)
    items = [foo() for _ in range(N)]
    data = TensorDict({}, batch_size=[N])
    order = torch.randperm(N).tolist() if shuffled else range(N)
    for i in order:
        data[i] = items[i]
    assert repr(data) == LAZY_REPR
    assert torch.equal(data["a"], torch.stack([item["a"] for item in items]))


# ---------------------------------------------------------------- Nesting
def test_nesting_and_flatten_keys():
    data = TensorDict(
        {
            "key 1": torch.ones(3, 4, 5),
            "key 2": TensorDict({"sub-key": torch.randn(3, 4, 5, 6)}, batch_size=[3, 4, 5]),
        },
        batch_size=[3, 4],
    )
    tensordict_flatten = data.flatten_keys(separator=".")
    assert set(tensordict_flatten.keys()) == {"key 1", "key 2.sub-key"}
    sub_value = data["key 2", "sub-key"]
    assert sub_value.shape == torch.Size([3, 4, 5, 6])
    assert tensordict_flatten["key 2.sub-key"] is sub_value


def test_nesting_requires_a_compatible_batch_size():
    with pytest.raises(ValueError):
        TensorDict(
            {"key 2": TensorDict({"sub-key": torch.randn(4, 5)}, batch_size=[4])},
            batch_size=[3],
        )


# ---------------------------------------------------------------- Comparisons (README)
def test_params_equal_to_unflattened_state_dicts():
    layer1 = torch.nn.Linear(3, 4)
    layer2 = torch.nn.Linear(4, 4)
    weights1 = TensorDict(layer1.state_dict(), []).unflatten_keys(".")
    weights2 = TensorDict(layer2.state_dict(), []).unflatten_keys(".")
    params = TensorDict(
        {"0": {"weight": layer1.weight, "bias": layer1.bias}, "1": dict(layer2.named_parameters())},
        [],
    )
    assert (params == TensorDict({"0": weights1, "1": weights2}, [])).all()
    stacked = torch.stack([params, params], 0)
    assert stacked.batch_size == torch.Size([2])
    assert stacked["0", "weight"].shape == torch.Size([2, 4, 3])


def test_print_format_from_seed_003():
    td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(())}})
    assert repr(td) == (
        "TensorDict(\n"
        "    fields={\n"
        "        a: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.float32, "
        "is_shared=False),\n"
        "        b: TensorDict(\n"
        "            fields={\n"
        "                c: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.float32, "
        "is_shared=False)},\n"
        "            batch_size=torch.Size([]),\n"
        "            device=None,\n"
        "            is_shared=False)},\n"
        "    batch_size=torch.Size([]),\n"
        "    device=None,\n"
        "    is_shared=False)"
    )
