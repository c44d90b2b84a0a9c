"""Shape operations and torch functions (through ``__torch_function__``) on TensorDicts.

The hypothesis tests in test_properties.py cover the general case; these pin
down the documented spellings, names and the torch-function table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tdfunc import TensorDict


def _td():
    g = torch.Generator().manual_seed(1)
    return TensorDict(
        {
            "x": torch.randn(2, 3, 4, generator=g),
            "n": {"y": torch.randint(0, 5, (2, 3), generator=g)},
            "s": "text",
        },
        batch_size=[2, 3],
    )


def test_view_reshape_unsqueeze_like_the_seed():
    data = TensorDict(
        {"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
        batch_size=[3, 4],
    )
    assert data.view(-1).batch_size == torch.Size([12])
    assert data.reshape(-1).batch_size == torch.Size([12])
    assert data.unsqueeze(-1).batch_size == torch.Size([3, 4, 1])
    assert data.view(-1)["key 1"].shape == torch.Size([12, 5])
    assert data.unsqueeze(-1)["key 2"].shape == torch.Size([3, 4, 1, 5])


@pytest.mark.parametrize(
    ("method", "args", "expected_batch", "reference"),
    [
        ("reshape", (3, 2), [3, 2], lambda t: t.reshape(3, 2, *t.shape[2:])),
        ("reshape", ((6,),), [6], lambda t: t.reshape(6, *t.shape[2:])),
        ("view", (-1, 1), [6, 1], lambda t: t.view(6, 1, *t.shape[2:])),
        ("permute", (1, 0), [3, 2], lambda t: t.permute(1, 0, *range(2, t.dim()))),
        ("permute", ([1, 0],), [3, 2], lambda t: t.permute(1, 0, *range(2, t.dim()))),
        ("transpose", (0, -1), [3, 2], lambda t: t.transpose(0, 1)),
        ("unsqueeze", (1,), [2, 1, 3], lambda t: t.unsqueeze(1)),
        ("unsqueeze", (-1,), [2, 3, 1], lambda t: t.unsqueeze(2)),
        ("flatten", (), [6], lambda t: t.flatten(0, 1)),
        ("flatten", (0, 1), [6], lambda t: t.flatten(0, 1)),
        ("unflatten", (1, (3, 1)), [2, 3, 1], lambda t: t.unflatten(1, (3, 1))),
        ("expand", (5, 2, 3), [5, 2, 3], lambda t: t.expand(5, *t.shape)),
        ("expand", ((4, 2, 3),), [4, 2, 3], lambda t: t.expand(4, *t.shape)),
    ],
)
def test_shape_method(method, args, expected_batch, reference):
    td = _td()
    out = getattr(td, method)(*args)
    assert out.batch_size == torch.Size(expected_batch)
    assert torch.equal(out["x"], reference(td["x"]))
    assert torch.equal(out["n", "y"], reference(td["n", "y"]))
    assert out["n"].batch_size == torch.Size(expected_batch)
    if method in ("unsqueeze", "expand"):  # laid over new elements: one value each
        assert out["s"] == np.full(expected_batch, "text", dtype=object).tolist()
    else:  # rearranged: the one value, as tensordict keeps it
        assert out["s"] == "text"


def test_squeeze():
    td = TensorDict({"x": torch.zeros(1, 3, 1, 2)}, [1, 3, 1])
    assert td.squeeze().batch_size == torch.Size([3])
    assert td.squeeze().get("x").shape == torch.Size([3, 2])
    assert td.squeeze(0).batch_size == torch.Size([3, 1])
    assert td.squeeze(-1)["x"].shape == torch.Size([1, 3, 2])
    assert td.squeeze(1).batch_size == torch.Size([1, 3, 1])  # not size 1: unchanged
    same = td.squeeze(1)
    same["new"] = torch.zeros(1, 3, 1)
    assert "new" not in td


def test_expand_does_not_copy():
    td = TensorDict({"x": torch.zeros(1, 2)}, [1])
    out = td.expand(4)
    assert out["x"].shape == torch.Size([4, 2])
    assert out["x"].data_ptr() == td["x"].data_ptr()
    assert td.expand_as(torch.zeros(3, 1)).batch_size == torch.Size([3, 1])


def test_views_share_storage_and_reshape_of_non_contiguous():
    td = _td()
    td.view(-1)["x"].zero_()
    assert td["x"].sum() == 0
    transposed = td.transpose(0, 1)
    flat = transposed.reshape(-1)
    assert torch.equal(flat["x"], td["x"].transpose(0, 1).reshape(6, 4))
    with pytest.raises(RuntimeError):
        transposed.view(-1)


def test_unbind_split_chunk_methods():
    td = _td()
    pieces = td.unbind(1)
    assert len(pieces) == 3 and pieces[0].batch_size == torch.Size([2])
    assert torch.equal(pieces[2]["x"], td["x"][:, 2])
    parts = td.split([1, 2], dim=1)
    assert [p.batch_size for p in parts] == [torch.Size([2, 1]), torch.Size([2, 2])]
    assert torch.equal(parts[1]["n", "y"], td["n", "y"][:, 1:])
    chunks = td.chunk(2, dim=1)
    assert [p.batch_size[1] for p in chunks] == [2, 1]
    assert all(p["s"] == "text" for p in pieces + parts + chunks)


def test_torch_functions_dispatch():
    td = _td()
    assert [p.batch_size for p in torch.unbind(td, 0)] == [torch.Size([3])] * 2
    assert len(torch.split(td, 1, 0)) == 2
    assert len(torch.chunk(td, 3, 1)) == 3
    assert torch.reshape(td, (6,)).batch_size == torch.Size([6])
    assert torch.permute(td, (1, 0)).batch_size == torch.Size([3, 2])
    assert torch.transpose(td, 0, 1).batch_size == torch.Size([3, 2])
    assert torch.unsqueeze(td, 0).batch_size == torch.Size([1, 2, 3])
    assert torch.squeeze(td.unsqueeze(0), 0).batch_size == torch.Size([2, 3])
    assert torch.flatten(td).batch_size == torch.Size([6])
    clone = torch.clone(td)
    assert torch.equal(clone["x"], td["x"]) and clone["x"] is not td["x"]
    assert (torch.zeros_like(td)["x"] == 0).all()
    assert (torch.ones_like(td)["n", "y"] == 1).all()
    assert (torch.full_like(td, 2.0)["x"] == 2).all()
    assert torch.empty_like(td)["x"].shape == td["x"].shape
    floats = td.select("x")
    assert torch.rand_like(floats)["x"].shape == td["x"].shape
    assert torch.randn_like(floats)["x"].shape == td["x"].shape


def test_unsupported_torch_function_raises():
    with pytest.raises(TypeError):
        torch.kron(_td(), _td())  # not in the __torch_function__ table


def test_stack_and_cat_like_the_seed():
    tensordicts = [
        TensorDict(
            {"key 1": torch.ones(3, 4, 5), "key 2": torch.zeros(3, 4, 5, dtype=torch.bool)},
            batch_size=[3, 4],
        )
        for _ in range(2)
    ]
    stack_tensordict = torch.stack(tensordicts, 1)
    assert stack_tensordict.shape == torch.Size([3, 2, 4])
    assert stack_tensordict["key 1"].shape == torch.Size([3, 2, 4, 5])
    cat_tensordict = torch.cat(tensordicts, 0)
    assert cat_tensordict.shape == torch.Size([6, 4])
    assert cat_tensordict["key 1"].shape == torch.Size([6, 4, 5])


def test_stack_values_and_nested():
    tds = [_td() for _ in range(3)]
    for i, td in enumerate(tds):
        td["x"].fill_(float(i))
    out = torch.stack(tds, dim=-1)
    assert out.batch_size == torch.Size([2, 3, 3])
    assert torch.equal(out["x"], torch.stack([td["x"] for td in tds], 2))
    assert out["n"].batch_size == torch.Size([2, 3, 3])
    assert out["s"] == [[["text"] * 3] * 3] * 2  # a stack: one value per element
    assert out[1, 2, 0]["s"] == "text"
    assert torch.cat(tds, dim=1).batch_size == torch.Size([2, 9])
    assert torch.concat(tds, 0).batch_size == torch.Size([6, 3])
    assert torch.concatenate(tds, 0).batch_size == torch.Size([6, 3])


def test_stack_out_argument():
    tds = [_td(), _td()]
    out = torch.stack(tds).clone()
    out.zero_()
    x = out["x"]
    result = torch.stack(tds, 0, out=out)
    assert result is out and out["x"] is x
    assert torch.equal(x, torch.stack([tds[0]["x"], tds[1]["x"]]))


def test_names_follow_shape_ops():
    td = TensorDict({"x": torch.zeros(2, 3, 4)}, [2, 3], names=["a", "b"])
    assert td.permute(1, 0).names == ["b", "a"]
    assert td.transpose(0, 1).names == ["b", "a"]
    assert td.unsqueeze(1).names == ["a", None, "b"]
    assert td.unsqueeze(1).squeeze(1).names == ["a", "b"]
    assert td.unbind(0)[0].names == ["b"]
    assert td.split(1, 0)[0].names == ["a", "b"]
    assert td.expand(5, 2, 3).names == [None, "a", "b"]
    assert td.reshape(6).names == [None]
    assert torch.stack([td, td], 1).names == ["a", None, "b"]
    assert torch.cat([td, td], 0).names == ["a", "b"]
    assert td.clone().names == ["a", "b"]
    assert (td + 1).names == ["a", "b"]


# ---------------------------------------------------------------- torch's error types
def _torch_error(fn) -> type:
    try:
        fn()
    except Exception as error:  # the type torch raises for the same call on a tensor
        return type(error)
    raise AssertionError("torch did not raise")


@pytest.mark.parametrize("op", ["fliplr", "rot90"])
def test_two_dim_ops_on_one_batch_dim_raise_like_torch(op):
    expected = _torch_error(lambda: getattr(torch, op)(torch.zeros(3)))
    with pytest.raises(expected, match="requires at least 2"):
        getattr(TensorDict({"a": torch.zeros(3)}, [3]), op)()


def test_movedim_repeated_dims_raise_like_torch():
    td = TensorDict({"a": torch.zeros(2, 3, 4)}, [2, 3, 4])
    plain = torch.zeros(2, 3, 4)
    for source, destination, where in (((0, 0), (1, 2), "source"), ((0, 1), (2, 2), "destination")):
        expected = _torch_error(lambda s=source, d=destination: plain.movedim(s, d))
        with pytest.raises(expected, match=f"repeated dim in {where}"):
            td.movedim(source, destination)
    with pytest.raises(ValueError, match="same number of elements"):
        td.movedim((0,), (1, 2))


def test_gather_out_and_inplace_are_exclusive():
    td = TensorDict({"a": torch.zeros(3, 4)}, [3, 4])
    with pytest.raises(ValueError, match="mutually exclusive"):
        td.gather(0, torch.zeros(3, 4, dtype=torch.long), out=td.clone(), inplace=True)


def _plain_tree(batch: tuple) -> dict:
    generator = torch.Generator().manual_seed(len(batch))
    return {
        "a": torch.randn(*batch, 3, generator=generator),
        "b": {"c": torch.randn(*batch, 2, 2, generator=generator), "d": torch.randn(*batch)},
    }


@pytest.mark.parametrize("batch", [(4,), (2, 3), (2, 1, 3)])
def test_unbind_every_dim_equals_the_tensors_unbind(batch):
    tree = _plain_tree(batch)
    td = TensorDict(tree, batch)
    for dim in [*range(len(batch)), *range(-len(batch), 0)]:
        pieces = td.unbind(dim)
        assert len(pieces) == batch[dim]
        at = dim % len(batch)  # a leaf's own dims follow: its dim counts from the front
        expected_size = torch.Size(batch[:at] + batch[at + 1 :])
        for i, piece in enumerate(pieces):
            assert piece.batch_size == expected_size
            assert piece["b"].batch_size == expected_size
            assert piece["a"]._base is not None  # a view, as torch.unbind gives
            assert torch.equal(piece["a"], tree["a"].unbind(at)[i])
            assert torch.equal(piece["b", "c"], tree["b"]["c"].unbind(at)[i])
            assert torch.equal(piece["b", "d"], tree["b"]["d"].unbind(at)[i])


def test_unbind_refuses_bad_dims_with_the_api_named():
    td = TensorDict({"a": torch.zeros(2, 3)}, [2])
    with pytest.raises(IndexError, match="unbind"):
        td.unbind(1)
    with pytest.raises(IndexError, match="unbind"):
        td.unbind(-2)
    with pytest.raises(TypeError, match="unbind"):
        td.unbind("x")
    assert [p["a"].shape for p in td.unbind(False)] == [torch.Size([3])] * 2
    assert [p.batch_size for p in TensorDict({}, [2, 3]).unbind(1)] == [torch.Size([2])] * 3


def test_stack_refuses_different_key_counts_and_sizes():
    one = TensorDict({"a": torch.zeros(2)}, [2])
    two = TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2])
    with pytest.raises(KeyError, match="different keys"):
        torch.stack([one, two])
    with pytest.raises(ValueError, match="same batch size"):
        torch.stack([one, TensorDict({"a": torch.zeros(3)}, [3])])
    stacked = torch.stack([one, one.clone()], 1)
    assert stacked.batch_size == torch.Size([2, 2])
    assert torch.equal(stacked["a"], torch.stack([one["a"], one["a"]], 1))
