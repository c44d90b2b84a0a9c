"""tensordict's small public helpers (``tdfunc.utils``, also at the top level): dtype
predicates, leaf rules, right-expansion and lenient key unravelling, checked against
torch's own dtype properties and plain tensor ops."""

from __future__ import annotations

import pytest
import torch

import tdfunc
from tdfunc import NonTensorData, NonTensorStack, TensorClass, TensorDict
from tdfunc.utils import (
    default_is_leaf,
    expand_as_right,
    expand_right,
    is_bool,
    is_floating,
    is_inexact,
    is_integer,
    is_leaf_nontensor,
    unravel_key_list,
    unravel_key_to_tuple,
)

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_predicates_read_the_last_argument(dtype):
    t = torch.zeros(2, dtype=dtype)
    expected = {
        is_bool: dtype == torch.bool,
        is_floating: dtype.is_floating_point,
        is_integer: not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool),
        is_inexact: dtype.is_floating_point or dtype.is_complex,
    }
    for predicate, answer in expected.items():
        assert predicate(t) is answer
        assert predicate("key", t) is answer  # as a (key, value) filter


def test_the_helpers_are_at_the_top_level_too():
    for name in ("is_bool", "is_floating", "is_integer", "is_inexact", "default_is_leaf",
                 "is_leaf_nontensor", "unravel_key_list", "unravel_key_to_tuple",
                 "list_to_stack", "capture_non_tensor_stack"):  # fmt: skip
        assert getattr(tdfunc, name) is getattr(tdfunc.utils, name)


def test_leaf_rules():
    class Point(TensorClass):
        x: torch.Tensor

    assert default_is_leaf(torch.Tensor) and is_leaf_nontensor(torch.Tensor)
    for container in (TensorDict, Point):
        assert not default_is_leaf(container) and not is_leaf_nontensor(container)
    for leaf in (NonTensorData, NonTensorStack):
        assert not default_is_leaf(leaf) and is_leaf_nontensor(leaf)
    td = TensorDict(a={}, b="a string!", c=torch.zeros(()))
    assert list(td.keys(leaves_only=True, is_leaf=default_is_leaf)) == ["c"]
    assert list(td.keys(leaves_only=True, is_leaf=is_leaf_nontensor)) == ["b", "c"]
    seen = []
    td.apply(lambda x: seen.append(type(x).__name__), is_leaf=is_leaf_nontensor)
    assert sorted(seen) == ["NonTensorData", "Tensor"]


def test_expand_right_adds_dims_on_the_right():
    x = torch.arange(3)
    out = expand_right(x, (3, 2, 4))
    assert torch.equal(out, x[:, None, None].expand(3, 2, 4))
    assert out.data_ptr() == x.data_ptr()  # a view
    assert torch.equal(expand_as_right(x, torch.zeros(3, 2)), x[:, None].expand(3, 2))
    td = TensorDict(a=torch.zeros(3, 2, 5), batch_size=[3, 2])
    assert expand_as_right(x, td).shape == torch.Size([3, 2])  # a container: its batch size
    with pytest.raises(RuntimeError, match=r"expand_as_right: .*\(4,\).*\(3, 2\)"):
        expand_as_right(torch.arange(4), torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="expand_as_right"):
        expand_as_right(torch.zeros(3, 2), torch.zeros(3))


def test_unravel_key_to_tuple_is_lenient():
    assert unravel_key_to_tuple("a") == ("a",)
    assert unravel_key_to_tuple(("a", ("b", ("c",)))) == ("a", "b", "c")
    for invalid in (("a", 1), 1, (), None, ("a", ())):
        assert unravel_key_to_tuple(invalid) == ()


def test_unravel_key_list():
    assert unravel_key_list(["a", ("b",), ("c", ("d",))]) == ["a", "b", ("c", "d")]
    assert unravel_key_list(()) == []
    with pytest.raises(TypeError, match="unravel_key_list: expected a list or a tuple"):
        unravel_key_list("a")
    with pytest.raises(TypeError, match="unravel_key_list"):
        unravel_key_list(["a", ("b", 1)])


def test_tensor_collection_is_for_isinstance_checks():
    from tdfunc import TensorCollection

    class Point(TensorClass):
        x: torch.Tensor

    for value in (TensorDict(), Point(x=torch.zeros(3), batch_size=[3]), NonTensorData(1)):
        assert isinstance(value, TensorCollection)
    for value in (torch.zeros(3), {}, 1, None):
        assert not isinstance(value, TensorCollection)
    assert issubclass(TensorDict, TensorCollection) and issubclass(Point, TensorCollection)
    assert not issubclass(torch.Tensor, TensorCollection)
    with pytest.raises(TypeError, match="isinstance checks"):
        TensorCollection()


def test_memmap_function_writes_a_locked_memory_mapped_copy(tmp_path):
    td = TensorDict({"a": torch.arange(3.0), "b": {"c": torch.ones(3)}}, [3])
    saved = tdfunc.memmap(td, tmp_path / "saved")
    assert type(saved["a"]).__name__ == "MemoryMappedTensor" and saved.is_locked
    assert torch.equal(TensorDict.load_memmap(tmp_path / "saved")["b", "c"], td["b", "c"])
    assert not td.is_locked  # the source is unchanged
    with pytest.raises(TypeError, match="memmap: expected a TensorDict or a TensorClass"):
        tdfunc.memmap(torch.zeros(3))


def test_make_tensordict():
    from tdfunc.functional import make_tensordict

    assert make_tensordict is tdfunc.make_tensordict
    td = make_tensordict(a=torch.zeros(3, 4), b=torch.zeros(3))
    assert td.batch_size == torch.Size([]) and set(td.keys()) == {"a", "b"}
    td = make_tensordict({"a": torch.zeros(3), "b": {"c": torch.zeros(3, 4)}}, auto_batch_size=True)
    assert td.batch_size == torch.Size([3]) and td["b"].batch_size == torch.Size([3, 4])
    # input_dict wins on a shared key
    td = make_tensordict({"a": torch.ones(2)}, a=torch.zeros(2), batch_size=[2])
    assert td["a"].tolist() == [1.0, 1.0] and td.batch_size == torch.Size([2])
