"""Round trips over the shared corpus: pickle, copy, clone, state_dict, keys, stack/unbind."""

from __future__ import annotations

import copy
import pickle
import re

import pytest
import torch
from corpus import BATCHED, CORPUS, RAW, assert_same_leaves, leaves_of, plain_leaves

from tdfunc import NonTensorData, TensorDict


def assert_same(
    left: TensorDict,
    right: TensorDict,
    share: bool | None = None,
    names: bool = True,
    ordered: bool = True,
) -> None:
    """Same class, batch sizes (nested too), names, keys (in order) and values."""
    assert type(left) is type(right)
    assert left.batch_size == right.batch_size
    if names:
        assert left.names == right.names
    if ordered:
        assert list(left.keys(True)) == list(right.keys(True))
    else:
        assert set(left.keys(True)) == set(right.keys(True))
    for key in left.keys(True):
        a, b = left._get_leaf(key), right._get_leaf(key)
        if isinstance(a, NonTensorData):  # one value or one per element: same values
            assert isinstance(b, NonTensorData), key
            assert a.tolist() == b.tolist() and a.batch_size == b.batch_size, key
            continue
        assert type(a) is type(b), key
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), key
            if share is not None:
                assert (a.data_ptr() == b.data_ptr()) == share or a.numel() == 0, key
        elif isinstance(a, NonTensorData):
            assert a == b and a.batch_size == b.batch_size, key
        else:
            assert a.batch_size == b.batch_size, key


@pytest.mark.parametrize("name", list(RAW))
def test_builder_holds_the_raw_leaves(name):
    source, batch_size = RAW[name]()
    td = CORPUS[name]()
    assert td.batch_size == torch.Size(batch_size)
    assert_same_leaves(td, plain_leaves(source))


@pytest.mark.parametrize("name", list(CORPUS))
def test_pickle(name):
    td = CORPUS[name]()
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        back = pickle.loads(pickle.dumps(td, protocol=protocol))
        assert_same(back, td, share=False)
    locked = pickle.loads(pickle.dumps(CORPUS[name]().lock_()))
    assert locked.is_locked


@pytest.mark.parametrize("name", list(CORPUS))
def test_copy_and_deepcopy(name):
    td = CORPUS[name]()
    shallow = copy.copy(td)
    assert_same(shallow, td, share=True)
    shallow["extra"] = torch.zeros(td.batch_size)
    assert "extra" not in td
    deep = copy.deepcopy(td)
    assert_same(deep, td, share=False)


@pytest.mark.parametrize("name", list(CORPUS))
def test_clone_and_to_tensordict(name):
    td = CORPUS[name]()
    assert_same(td.clone(), td, share=False)
    assert_same(td.clone(recurse=False), td, share=True)
    assert_same(td.to_tensordict(), td, share=False)
    assert_same(td.apply(lambda x: x), td, share=True)
    assert_same(td.detach(), td, share=True)


@pytest.mark.parametrize("name", list(CORPUS))
def test_state_dict_into_empty(name):
    td = CORPUS[name]()
    state = td.state_dict()
    tensor_keys = {k for k in state if k != "_metadata"}
    expected = {
        ".".join(path) for path, value in leaves_of(td).items() if isinstance(value, torch.Tensor)
    }
    assert tensor_keys == expected
    back = TensorDict().load_state_dict(state)
    assert_same(back, td, share=True)


@pytest.mark.parametrize("name", list(CORPUS))
def test_state_dict_in_place(name):
    td = CORPUS[name]()
    target = td.apply(torch.zeros_like)
    leaves = {k: target._get_leaf(k) for k in target.keys(True, True)}
    assert target.load_state_dict(td.state_dict()) is target
    assert_same(target, td, share=False)
    for key, value in leaves.items():
        assert target._get_leaf(key) is value or not isinstance(value, torch.Tensor)
    assigned = td.apply(torch.zeros_like).load_state_dict(td.state_dict(), assign=True)
    assert_same(assigned, td, share=True)


def test_state_dict_keys_with_dots_and_keep_vars():
    weight = torch.randn(2, requires_grad=True)
    td = TensorDict({"layer.0": {"weight": weight}}, [])
    state = td.state_dict()
    assert list(state) == ["layer.0.weight"] and "" in state._metadata
    assert not state["layer.0.weight"].requires_grad
    assert td.state_dict(keep_vars=True)["layer.0.weight"] is weight
    back = TensorDict().load_state_dict(state)
    assert ("layer.0", "weight") in back
    with pytest.raises(ValueError, match=re.escape("both map to the state-dict key 'a.b'")):
        TensorDict({"a.b": torch.zeros(()), "a": {"b": torch.zeros(())}}).state_dict()


def test_state_dict_prefix_and_strict():
    td = TensorDict({"a": torch.ones(2), "n": {"b": torch.ones(2)}}, [2])
    state = td.state_dict(prefix="model.")
    assert set(state) == {"model.a", "model.n.b"} and set(state._metadata) == {"model", "model.n"}
    target = td.apply(torch.zeros_like)
    with pytest.raises(RuntimeError, match=r"missing keys \['n.b'\], unexpected keys \[\]"):
        target.load_state_dict({"a": torch.ones(2)})
    assert target["a"].sum() == 0  # nothing loaded
    target.load_state_dict({"a": torch.ones(2), "zz": torch.ones(2)}, strict=False)
    assert target["a"].sum() == 2 and "zz" not in target and target["n", "b"].sum() == 0


def test_load_state_dict_from_module():
    module = torch.nn.Linear(3, 2)
    td = TensorDict(module.state_dict(), []).unflatten_keys(".")
    target = td.apply(torch.zeros_like)
    target.load_state_dict(module.state_dict())
    assert torch.equal(target["weight"], module.weight.detach())


@pytest.mark.parametrize("name", list(CORPUS))
def test_flatten_unflatten_keys(name):
    td = CORPUS[name]()
    flat = td.flatten_keys("/")
    assert all(isinstance(k, str) for k in flat.keys(include_nested=True))
    assert set(flat.keys()) == {"/".join(p) for p in leaves_of(td)}
    back = flat.unflatten_keys("/")
    assert leaves_of(back).keys() == leaves_of(td).keys()
    for path, value in leaves_of(td).items():
        assert back.get(path) is value or back.get(path) == value


@pytest.mark.parametrize("name", [n for n in BATCHED if n != "zero_batch"])
def test_unbind_then_stack(name):
    td = CORPUS[name]()
    back = torch.stack(td.unbind(0), 0)
    assert_same(back, td, share=False, names=False)  # unbind drops the name of dim 0
    assert back.names[1:] == td.names[1:]
    back = torch.cat(td.split(1, 0), 0)
    assert_same(back, td, share=False)


@pytest.mark.parametrize("name", list(CORPUS))
def test_pytree_round_trip(name):
    import torch.utils._pytree as pytree

    td = CORPUS[name]()
    leaves, spec = pytree.tree_flatten(td)
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    # unflatten puts non-tensor keys after the tensors (tdfunc/_pytree/node.py), hence ordered=False
    assert_same(pytree.tree_unflatten(leaves, spec), td, share=True, ordered=False)


@pytest.mark.parametrize("name", list(CORPUS))
def test_equal_to_its_clone(name):
    td = CORPUS[name]()
    if not list(td.keys(True, True)):
        assert (td == td.clone()).all()
        return
    assert (td == td.clone()).all()
    assert not (td != td.clone()).any()


@pytest.mark.parametrize("name", list(CORPUS))
def test_repr_lists_every_key(name):
    td = CORPUS[name]()
    text = repr(td)
    assert text.startswith("TensorDict(\n    fields={")
    assert f"batch_size={td.batch_size}" in text
    for key in td.keys(True):
        last = key if isinstance(key, str) else key[-1]
        assert f"{last}: " in text


# ---------------------------------------------------------------- nested TensorClass
def _with_tensorclass():
    from tdfunc import TensorClass

    class Pair(TensorClass):
        x: torch.Tensor
        label: str = "p"

    inner = Pair(x=torch.arange(6.0).reshape(3, 2), batch_size=[3])
    return TensorDict({"pair": inner, "y": torch.ones(3)}, [3]), Pair


def test_nested_tensorclass_keeps_its_class_through_operations():
    td, pair_cls = _with_tensorclass()
    x = td["pair", "x"]
    for out in [
        td.apply(lambda t: t * 2),
        td[1:],
        td[torch.tensor([2, 0])],
        td.clone(),
        td.reshape(3, 1),
        torch.stack([td, td]),
        td.unbind(0)[0],
        td.to(torch.float64),
    ]:
        assert type(out["pair"]) is pair_cls
        assert out["pair"].batch_size == out.batch_size
    assert torch.equal(td.apply(lambda t: t * 2)["pair", "x"], x * 2)
    assert torch.equal(td[torch.tensor([2, 0])]["pair", "x"], x[torch.tensor([2, 0])])


def test_nested_tensorclass_state_dict_round_trip():
    td, pair_cls = _with_tensorclass()
    back = TensorDict().load_state_dict(td.state_dict())
    assert type(back["pair"]) is pair_cls
    assert torch.equal(back["pair", "x"], td["pair", "x"])
    assert back["pair"].label == "p"


def test_lazy_preallocation_with_a_tensorclass_value():
    td, pair_cls = _with_tensorclass()
    data = TensorDict({}, [4])
    data[2] = td[1]
    assert type(data["pair"]) is pair_cls
    assert data["pair"].batch_size == torch.Size([4])
    assert torch.equal(data["pair", "x"][2], td["pair", "x"][1])
    assert data["pair", "x"][[0, 1, 3]].sum() == 0
