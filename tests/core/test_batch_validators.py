"""``_check_batch_size`` / ``_check_device``: whole-container validators.

The reference is computed on the plain dict the corpus container is built from:
a container is consistent exactly when every plain leaf's shape starts with the
batch size.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict
from tests.corpus import CORPUS, plain_leaves, raw_sample, sample


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_consistent_container_passes(name):
    td = CORPUS[name]()
    td._check_batch_size()
    td._check_device()


def test_a_consistent_tensorclass_passes():
    s = sample()
    s._check_batch_size()
    s._check_device()


@pytest.mark.parametrize("name", ["flat_1d", "nested_2d", "non_tensor"])
def test_a_leaf_resized_in_place_is_found(name):
    td = CORPUS[name]()
    batch = list(td.batch_size)
    leaf = next(
        v for v in td.values(include_nested=True, leaves_only=True) if isinstance(v, torch.Tensor)
    )
    leaf.resize_(*([batch[0] + 1] + list(leaf.shape[1:])))  # the shape changes behind td's back
    assert list(leaf.shape[: len(batch)]) != batch
    with pytest.raises(ValueError, match=r"_check_batch_size: the value at key .* does not start"):
        td._check_batch_size()


def test_the_error_names_the_nested_key():
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2)}}, [3])
    td.get(("n", "b")).resize_(2, 2)
    with pytest.raises(ValueError, match=r"key \('n', 'b'\) has shape \[2, 2\]"):
        td._check_batch_size()


def test_a_nested_level_whose_leaf_breaks_its_own_batch_size_is_found():
    td = TensorDict({"n": TensorDict({"b": torch.zeros(3, 4)}, [3, 4])}, [3])
    td._check_batch_size()
    td.get(("n", "b")).resize_(3, 5)  # still starts with the parent's [3], not with [3, 4]
    with pytest.raises(ValueError, match=r"batch size \[3, 4\]"):
        td._check_batch_size()


@pytest.mark.parametrize("key", [("obs",), ("extra", "value")])
def test_a_tensorclass_with_a_resized_field_is_found(key):
    s = sample()
    shape = plain_leaves(raw_sample()[0])[key].shape
    s.get(key if len(key) > 1 else key[0]).resize_(shape[0], shape[1] + 1, *shape[2:])
    with pytest.raises(ValueError, match="_check_batch_size: the value at key"):
        s._check_batch_size()


def test_check_device_finds_a_tensor_on_another_device():
    td = TensorDict({"a": torch.zeros(3)}, [3], device="cpu")
    td._data["a"] = torch.zeros(3, device="meta")  # only possible behind the API's back
    with pytest.raises(RuntimeError, match="_check_device: the tensor at key 'a' is on meta"):
        td._check_device()


def test_both_classes_have_the_validators():
    for cls in (TensorDict, TensorClass):
        assert callable(cls._check_batch_size) and callable(cls._check_device)
