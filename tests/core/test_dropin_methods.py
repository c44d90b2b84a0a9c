"""tensordict's keyword forms and convenience methods, against plain tensors and dicts."""

from __future__ import annotations

import pytest
import torch

import tdfunc
from tdfunc import TensorClass, TensorDict, set_list_to_stack, set_printoptions
from tdfunc.utils import get_printoptions, strtobool


def _td():
    return TensorDict(
        {"a": torch.arange(24.0).view(2, 3, 4), "n": {"b": torch.arange(6.0).view(2, 3)}}, [2, 3]
    )


def test_apply_default_stands_in_for_missing_keys():
    td = _td()
    other = TensorDict({"a": torch.ones(2, 3, 4)}, [2, 3])
    out = td.apply(lambda x, y: x if y is None else x + y, other, default=None)
    assert torch.equal(out["a"], td["a"] + 1)
    assert torch.equal(out["n", "b"], td["n", "b"])
    with pytest.raises(KeyError):
        td.apply(lambda x, y: x, other)


def test_apply_default_inplace():
    td = _td()
    ref = {"a": td["a"].clone(), "b": td["n", "b"].clone()}
    other = TensorDict({"n": {"b": torch.ones(2, 3)}}, [2, 3])
    td.apply(lambda x, y: x if y is None else x + y, other, default=None, inplace=True)
    assert torch.equal(td["a"], ref["a"])
    assert torch.equal(td["n", "b"], ref["b"] + 1)


def test_apply_out_writes_into_the_given_container():
    td = _td()
    out = td.clone().zero_()
    a_storage = out["a"]
    result = td.apply(lambda x: x * 2, out=out)
    assert result is out
    assert torch.equal(out["a"], td["a"] * 2)
    assert torch.equal(out["n", "b"], td["n", "b"] * 2)
    assert a_storage.data_ptr() == out["a"].data_ptr() or torch.equal(out["a"], td["a"] * 2)


def test_apply_filter_empty_true_gives_none_and_call_on_nested():
    td = _td()
    assert td.apply(lambda x: None, filter_empty=True) is None
    assert td.apply(lambda x: None) is not None
    seen = []
    td.apply(lambda x: seen.append(type(x).__name__) or x, call_on_nested=True)
    assert sorted(seen) == ["Tensor", "TensorDict"]


def test_apply_propagate_lock_and_device():
    td = _td().lock_()
    assert td.apply(lambda x: x + 1, propagate_lock=True).is_locked
    assert not td.apply(lambda x: x + 1).is_locked
    assert td.apply(lambda x: x, device="cpu").device == torch.device("cpu")


def test_named_apply_inplace():
    td = _td()
    ref_a, ref_b = td["a"].clone(), td["n", "b"].clone()
    out = td.named_apply(lambda k, x: x + 1 if "a" in k else x, inplace=True)
    assert out is td
    assert torch.equal(td["a"], ref_a + 1)
    assert torch.equal(td["n", "b"], ref_b)


def test_unflatten_keyword_like_torch():
    td = TensorDict({"a": torch.arange(12.0).view(6, 2)}, [6])
    out = td.unflatten(0, unflattened_size=(2, 3))
    assert torch.equal(out["a"], td["a"].unflatten(0, (2, 3)))
    with pytest.raises(TypeError, match="not both"):
        td.unflatten(0, (2, 3), unflattened_size=(2, 3))


@pytest.mark.parametrize(
    "name, args, ref",
    [
        (
            "pad",
            ([1, 0],),
            lambda t: torch.nn.functional.pad(t.movedim(0, -1), [1, 0]).movedim(-1, 0),
        ),
        ("roll", (1, 0), lambda t: t.roll(1, 0)),
        ("repeat", (2,), lambda t: t.repeat(2, *([1] * (t.dim() - 1)))),
        ("repeat_interleave", (2, 0), lambda t: t.repeat_interleave(2, 0)),
        ("gather", (0, torch.tensor([2, 0])), lambda t: t[torch.tensor([2, 0])]),
    ],
)
def test_inplace_keyword_of_shape_methods(name, args, ref):
    td = TensorDict({"a": torch.arange(6.0).view(3, 2), "b": torch.arange(3.0)}, [3])
    plain = {k: v.clone() for k, v in td.items()}
    out = getattr(td, name)(*args, inplace=True)
    assert out is td
    for key, value in plain.items():
        assert torch.equal(td[key], ref(value)), key
    assert td.batch_size == td["b"].shape


def test_update_keys_to_update_and_copy_at_fast():
    td = _td()
    new = {"a": torch.zeros(2, 3, 4), "n": {"b": torch.zeros(2, 3)}}
    ref_b = td["n", "b"].clone()
    td.update_(new, keys_to_update=["a"])
    assert torch.equal(td["a"], torch.zeros(2, 3, 4))
    assert torch.equal(td["n", "b"], ref_b)
    row = TensorDict({"a": torch.ones(4), "n": {"b": torch.ones(())}}, [])
    td.copy_at_(row, (1, 2), fast=True)
    assert torch.equal(td["a"][1, 2], torch.ones(4))


def test_tolist_matches_a_python_loop():
    td = _td()
    got = td.tolist(convert_tensors=True)
    want = [
        [{"a": td["a"][i, j].tolist(), "n": {"b": td["n", "b"][i, j].item()}} for j in range(3)]
        for i in range(2)
    ]
    assert got == want
    nodes = td.tolist(convert_nodes=False)
    assert isinstance(nodes[1][2], TensorDict) and torch.equal(nodes[1][2]["a"], td["a"][1, 2])
    with pytest.raises(TypeError, match="convert_tensors"):
        td.tolist(convert_nodes=False, convert_tensors=True)
    nested = TensorDict({"b": TensorDict({"c": torch.arange(4).view(2, 2)}, [2, 2])}, [2])
    first = nested.tolist(tolist_first=True)
    assert first[0]["b"] == [{"c": torch.tensor(0)}, {"c": torch.tensor(1)}]


def test_popitem_bytes_cat_stack_tensors():
    td = TensorDict(
        {"x": torch.zeros(3), "y": torch.ones(3), "z": torch.ones(2, dtype=torch.int64)}
    )
    assert td.bytes() == 3 * 4 + 3 * 4 + 2 * 8
    td["w"] = td["x"]
    assert td.bytes(count_duplicates=False) == 3 * 4 + 3 * 4 + 2 * 8
    key, value = td.popitem()
    assert key == "w" and torch.equal(value, torch.zeros(3))
    td.cat_tensors("x", "y", out_key="xy")
    assert torch.equal(td["xy"], torch.cat([torch.zeros(3), torch.ones(3)]))
    assert "x" not in td and "y" not in td
    td.stack_tensors("xy", "xy", out_key="s", keep_entries=True)
    assert torch.equal(td["s"], torch.stack([td["xy"], td["xy"]]))
    with pytest.raises(KeyError):
        TensorDict().popitem()


@pytest.mark.parametrize("dim", [None, 0, 1, (0, 1)])
def test_quantile_matches_torch(dim):
    g = torch.Generator().manual_seed(0)
    td = TensorDict({"a": torch.randn(3, 4, 5, generator=g)}, [3, 4])
    got = td.quantile(0.3, dim=dim)["a"]
    t = td["a"]
    if dim is None:
        want = torch.quantile(t.reshape(-1), 0.3)
    elif isinstance(dim, int):
        want = torch.quantile(t, 0.3, dim)
    else:
        want = torch.quantile(t.flatten(0, 1), 0.3, 0)
    torch.testing.assert_close(got, want)
    assert torch.allclose(td.quantile(0.5, dim="feature")["a"], torch.quantile(t, 0.5, -1))


def test_print_options_are_scoped():
    td = TensorDict({"a": torch.zeros(2)}, [2])
    before = get_printoptions()
    with set_printoptions(show_dtype=False, show_device=False):
        text = repr(td)
        assert "dtype" not in text and "device=None" not in text
    assert get_printoptions() == before
    assert "dtype=torch.float32" in repr(td)
    with pytest.raises(TypeError, match="unknown option"):
        set_printoptions(colour=True)
    td["p"] = torch.nn.Parameter(torch.zeros(2))
    assert "p: Parameter(" in repr(td)


def test_list_to_stack_switch_and_strtobool():
    with set_list_to_stack(False):
        td = TensorDict({"a": ["x", "y"]}, [2])
    assert td[0]["a"] == ["x", "y"]
    td = TensorDict({"a": ["x", "y"]}, [2])
    assert td[0]["a"] == "x"
    assert strtobool("ON") and not strtobool("off")
    with pytest.raises(ValueError):
        strtobool("maybe")


def test_functional_module_path():
    from tdfunc.functional import pad, pad_sequence

    td = TensorDict({"a": torch.ones(2)}, [2])
    assert torch.equal(pad(td, [1, 1])["a"], torch.nn.functional.pad(torch.ones(2), [1, 1]))
    assert pad_sequence is tdfunc.pad_sequence


def test_consolidate_file_round_trip_and_return_early(tmp_path):
    td = TensorDict(
        {
            "a": torch.arange(4.0),
            "b": {"c": torch.ones(4, 2, dtype=torch.float16)},
            "s": "text",
            "st": ["x", "y", "z", "w"],
        },
        [4],
    )
    path = tmp_path / "sub" / "td.bin"
    consolidated = td.consolidate(filename=path, metadata=True)
    assert consolidated.device == torch.device("cpu")
    loaded = TensorDict.from_consolidated(path)
    assert torch.equal(loaded["a"], td["a"]) and torch.equal(loaded["b", "c"], td["b", "c"])
    assert loaded["s"] == "text" and loaded["st"] == ["x", "y", "z", "w"]
    loaded["a"][0] = 7.0  # the file is shared: a new mapping sees the write
    assert TensorDict.from_consolidated(path)["a"][0].item() == 7.0
    future = td.consolidate(num_threads=2, return_early=True)
    assert (future.result() == td).all() and future.result().is_consolidated()
    with pytest.raises(NotImplementedError, match="non_blocking"):
        td.consolidate(num_threads=2, return_early=True, non_blocking=True)
    (tmp_path / "junk.bin").write_bytes(b"not a consolidated file")
    with pytest.raises(ValueError, match="not written by consolidate"):
        TensorDict.from_consolidated(tmp_path / "junk.bin")


def test_consolidate_detaches_a_single_leaf():
    base = torch.arange(6.0, requires_grad=True)
    td = TensorDict({"v": base.view(2, 3).t()}, [])
    out = td.consolidate()["v"]
    assert torch.equal(out, base.detach().view(2, 3).t()) and not out.requires_grad


def test_refine_names_with_ellipsis():
    td = TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3, 4])
    assert td.refine_names(..., "c").names == [None, None, "c"]
    assert td.refine_names("a", ...).names == ["a", None, "c"]
    with pytest.raises(RuntimeError, match="cannot rename"):
        td.refine_names("z", ...)


def test_state_dict_metadata_readable_per_level():
    from tdfunc import TensorClass

    class Leaf(TensorClass):
        x: torch.Tensor
        z: str

    class Root(TensorClass):
        x: torch.Tensor
        z: str
        y: Leaf

    tc = Root(x=torch.ones(3), z="top", y=Leaf(x=torch.zeros(3), z="low"))
    sd = tc.state_dict()
    assert set(sd) == {"x", "y.x"}
    assert "Root" in sd._metadata[""]["_type"] and "Leaf" in sd._metadata["y"]["_type"]
    assert sd._metadata[""]["_non_tensor"] == {"z": "top"}
    assert sd._metadata["y"]["_non_tensor"] == {"z": "low"}
    other = tc.clone()
    other.x.zero_()
    other.load_state_dict(sd)
    assert torch.equal(other.x, tc.x) and other.y.z == "low"


def test_feature_reduction_keeps_each_level_batch():
    inner = TensorDict({"c": torch.arange(120.0).view(2, 3, 4, 5)}, [2, 3, 4])
    td = TensorDict({"a": torch.arange(24.0).view(2, 3, 4), "b": inner}, [2, 3])
    out = td.sum(dim="feature")
    assert torch.equal(out["a"], td["a"].sum(-1))
    assert torch.equal(out["b", "c"], inner["c"].sum(-1))
    assert out["b"].batch_size == torch.Size([2, 3, 4])


@pytest.mark.parametrize("name", ["int", "long", "bool"])
def test_integer_and_bool_casts_like_tensor(name):
    td = TensorDict({"a": torch.tensor([0.0, 1.5]), "n": {"b": torch.tensor([2.0, 0.0])}}, [2])
    out = getattr(td, name)()
    assert torch.equal(out["a"], getattr(td["a"], name)())
    assert torch.equal(out["n", "b"], getattr(td["n", "b"], name)())


def test_bytes_counts_gradients():
    weight = torch.ones(3, requires_grad=True)
    (weight * 2).sum().backward()
    td = TensorDict({"w": weight, "x": torch.zeros(2, dtype=torch.int64)})
    assert td.bytes() == 3 * 4 + 3 * 4 + 2 * 8  # elements, the gradient, elements


def test_repeat_interleave_without_dim_flattens_like_torch():
    td = TensorDict({"a": torch.arange(6.0).view(2, 3), "s": [["x"] * 3] * 2}, [2, 3])
    out = td.repeat_interleave(2)
    assert torch.equal(out["a"], td["a"].repeat_interleave(2))
    assert out["s"] == ["x"] * 12


def test_from_list_stacks_dicts_like_torch_stack_of_their_tensors():
    rows = [{"a": torch.full((3, 2), float(i)), "n": {"b": torch.arange(3) + i}} for i in range(4)]
    for kwargs, batch in [
        ({"auto_batch_size": True}, [4, 3]),
        ({"batch_size": [4, 3]}, [4, 3]),
        ({"batch_dims": 1}, [4]),
        ({}, [4]),
    ]:
        td = TensorDict.from_list(rows, **kwargs)
        assert td.batch_size == torch.Size(batch), kwargs
        # the reference: torch.stack of each key's plain tensors
        assert torch.equal(td["a"], torch.stack([r["a"] for r in rows]))
        assert torch.equal(td["n", "b"], torch.stack([r["n"]["b"] for r in rows]))
    named = TensorDict.from_list(rows, batch_size=[4, 3], names=["row", "col"])
    assert named.names == ["row", "col"]
    assert TensorDict.from_list(named.unbind(0)).batch_size == (4, 3)  # containers as they are
    listed = [[element["a"].tolist() for element in row] for row in named.tolist()]
    assert listed == [[x.tolist() for x in r["a"]] for r in rows]  # tolist undoes from_list
    with pytest.raises(ValueError, match="must start with the length of the list"):
        TensorDict.from_list(rows, batch_size=[3])
    with pytest.raises(NotImplementedError, match="lazy stacks are not part of tdfunc"):
        TensorDict.from_list(rows, lazy=True)
    with pytest.raises(TypeError, match="expected dicts or containers"):
        TensorDict.from_list([1, 2])


@pytest.mark.parametrize(
    "dim, keepdim",
    [(0, False), (1, False), ((0, 1), False), (0, True), ((0, 1), True), ("feature", False)],
)
def test_several_quantiles_lead_the_batch_size(dim, keepdim):
    g = torch.Generator().manual_seed(0)
    inner = TensorDict({"c": torch.randn(3, 4, 2, 6, generator=g)}, [3, 4, 2])
    td = TensorDict({"a": torch.randn(3, 4, 5, generator=g), "b": inner}, [3, 4], names=["x", "y"])
    q = torch.tensor([0.1, 0.5, 0.9])
    got = td.quantile(q, dim=dim, keepdim=keepdim)

    def want(t: torch.Tensor, ndim: int) -> torch.Tensor:
        if dim == "feature":
            return torch.quantile(t.flatten(ndim), q, -1)
        dims = (dim,) if isinstance(dim, int) else dim
        moved = t.movedim(dims, tuple(range(-len(dims), 0))).flatten(-len(dims))
        out = torch.quantile(moved, q, -1)
        for d in sorted(dims) if keepdim else ():
            out = out.unsqueeze(d + 1)
        return out

    torch.testing.assert_close(got["a"], want(td["a"], 2))
    torch.testing.assert_close(got["b", "c"], want(inner["c"], 3))
    assert got["a"].shape[: got.batch_dims] == got.batch_size
    assert got["b"].batch_size == got["b", "c"].shape[: got["b"].batch_dims]
    assert got.batch_size[0] == 3 and got.names[0] is None
    assert td.quantile(q)["a"].shape == (3,) and td.quantile(q).batch_size == ()


def test_sorted_keys_are_the_sorted_keys_of_the_level_and_follow_changes():
    plain = {"b": torch.zeros(2), "a": torch.zeros(2), "c": {"z": torch.zeros(2)}}
    td = TensorDict(plain, [2])
    assert td.sorted_keys == sorted(plain) == ["a", "b", "c"]
    td.lock_()
    assert td.sorted_keys == ["a", "b", "c"]
    td.unlock_()
    td["aa"] = torch.zeros(2)  # nothing cached: a key added after a read is there
    assert td.sorted_keys == ["a", "aa", "b", "c"]

    class Pair(TensorClass):
        y: torch.Tensor
        x: torch.Tensor

    assert Pair(y=torch.zeros(()), x=torch.ones(())).sorted_keys == ["x", "y"]


def test_a_refused_join_of_entries_keeps_them():
    # the entries were deleted before the result was written: a result that did not fit
    # the batch lost both
    a, b = torch.zeros(2, 3), torch.ones(2, 3)
    td = TensorDict(a=a, b=b, batch_size=[2, 3])
    with pytest.raises(ValueError, match="does not start with the batch size"):
        td.stack_tensors("a", "b", out_key="s")
    assert sorted(td.keys()) == ["a", "b"] and td["a"] is a and td["b"] is b
    with pytest.raises(RuntimeError):
        td.clone().lock_().cat_tensors("a", "b", out_key="c", dim=1)
    # the result may replace one of the entries it joins
    flat = TensorDict(a=torch.zeros(2), b=torch.ones(2), batch_size=[2])
    flat.stack_tensors("a", "b", out_key="b", dim=1)
    assert list(flat.keys()) == ["b"] and flat["b"].tolist() == [[0.0, 1.0], [0.0, 1.0]]
    with pytest.raises(KeyError, match=r"stack_tensors: no entry at 'missing'; the entries"):
        td.stack_tensors("a", "missing", out_key="s")
