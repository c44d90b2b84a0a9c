"""Ragged batch dims (``-1``) of nested-tensor entries and ``to_padded_tensor``
(``_core/shape/ragged.py``), checked against the nested tensors themselves."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorClass, TensorDict

# torch warns that strided nested tensors are a prototype
pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")

LENGTHS = (4, 6)


def _components(fill: float = 1.0) -> list[torch.Tensor]:
    return [torch.full((3, n, 5), fill) + torch.arange(n).view(1, n, 1) for n in LENGTHS]


def _nested(layout) -> torch.Tensor:
    if layout is torch.jagged:  # jagged: the ragged dim must follow the outer one
        return torch.nested.nested_tensor(
            [c.transpose(0, 1) for c in _components()], layout=torch.jagged
        )
    return torch.nested.nested_tensor(_components())


def test_a_ragged_dim_is_minus_one_in_the_batch_size():
    nt = _nested(torch.strided)
    td = TensorDict({"x": nt, "s": {"y": nt * 2}, "t": "text"}, batch_size=[2, 3, -1])
    assert td.batch_size == td.shape == torch.Size([2, 3, -1])
    assert td["s"].batch_size == torch.Size([2, 3, -1])
    assert "shape=torch.Size([2, 3, -1, 5])" in repr(td)
    # the leaves that keep their shape keep the ragged batch
    for out in (td.clone(), td + 1, td.apply(lambda t: t * 2), td.detach()):
        assert out.batch_size == torch.Size([2, 3, -1])
    doubled = td.apply(lambda t: t * 2)["x"].unbind(0)
    assert all(torch.equal(d, 2 * c) for d, c in zip(doubled, _components(), strict=True))


def test_a_dense_value_does_not_fit_a_ragged_dim():
    td = TensorDict({"x": _nested(torch.strided)}, batch_size=[2, 3, -1])
    with pytest.raises(ValueError, match=r"does not start with the batch size \[2, 3, -1\]"):
        td.set("d", torch.zeros(2, 3, 6))
    with pytest.raises(ValueError, match="does not start with the batch size"):
        TensorDict({"d": torch.zeros(2, 3, 6)}, batch_size=[2, 3, -1])
    with pytest.raises(ValueError, match="must not be negative"):
        TensorDict({}, batch_size=[2, -2])
    with pytest.raises(ValueError, match="must not be negative"):  # dim 0 counts components
        TensorDict({}, batch_size=[-1, 2])


def test_indexing_and_unbinding_the_outer_dim_give_dense_batches():
    td = TensorDict({"x": _nested(torch.strided), "s": {"y": _nested(torch.strided)}}, [2, 3, -1])
    for i, (n, component) in enumerate(zip(LENGTHS, _components(), strict=True)):
        assert td[i].batch_size == torch.Size([3, n])
        assert td[i]["s"].batch_size == torch.Size([3, n])
        assert torch.equal(td[i]["x"], component)
        piece = td.unbind(0)[i]
        assert piece.batch_size == torch.Size([3, n]) and torch.equal(piece["x"], component)
    assert [p.batch_size[-1] for p in td.split(1, 0)] == list(LENGTHS)


@pytest.mark.parametrize(
    "op",
    [
        lambda td: td.unbind(2),
        lambda td: td.split(2, 2),
        lambda td: td.chunk(2, -1),
        lambda td: td.numel(),
    ],
)
def test_an_op_along_a_ragged_dim_is_a_clear_error(op):
    td = TensorDict({"x": _nested(torch.strided)}, batch_size=[2, 3, -1])
    with pytest.raises(ValueError, match="ragged"):
        op(td)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_to_padded_tensor_matches_torch_nested_padding(layout):
    nt = _nested(layout)
    size = [2, 3, -1] if layout is torch.strided else [2, -1]
    td = TensorDict({"x": nt, "s": {"y": nt}, "t": "text"}, batch_size=size)
    out = td.to_padded_tensor(padding=-1.0, mask_key="mask")
    expected = torch.nested.to_padded_tensor(nt, -1.0)
    dense = [s if s != -1 else max(LENGTHS) for s in size]
    assert out.batch_size == torch.Size(dense) and out["s"].batch_size == torch.Size(dense)
    assert torch.equal(out["x"], expected) and torch.equal(out["s", "y"], expected)
    assert out["t"] == "text"
    # the mask marks the real elements: the components' lengths along the ragged dim
    real = torch.nested.to_padded_tensor(torch.ones_like(nt, dtype=torch.bool), False)
    assert torch.equal(out["mask"], real.flatten(len(size)).any(-1))
    assert (out["x"][out["mask"]] != -1).all() and (out["x"][~out["mask"]] == -1).all()
    assert torch.equal(out["mask"].sum(-1).flatten().unique(), torch.tensor(sorted(LENGTHS)))


def test_to_padded_tensor_without_a_ragged_batch_dim():
    nt = _nested(torch.strided)
    td = TensorDict({"x": nt, "d": torch.zeros(2)}, batch_size=[2])
    out = td.to_padded_tensor(padding=0.5)
    assert out.batch_size == torch.Size([2])
    assert torch.equal(out["x"], torch.nested.to_padded_tensor(nt, 0.5))
    assert out["d"] is td["d"]
    with pytest.raises(RuntimeError, match="mask_key should only be provided"):
        td.to_padded_tensor(mask_key="mask")


def test_to_padded_tensor_refuses_entries_that_disagree_on_the_lengths():
    one = torch.nested.nested_tensor([torch.ones(4), torch.ones(6)])
    other = torch.nested.nested_tensor([torch.ones(6), torch.ones(4)])
    td = TensorDict({"a": one, "b": other}, batch_size=[2, -1])
    with pytest.raises(ValueError, match="disagree on the lengths"):
        td.to_padded_tensor()


def test_a_tensorclass_with_a_ragged_batch_dim():
    class Seq(TensorClass):
        x: torch.Tensor

    nt = _nested(torch.strided)
    seq = Seq(x=nt, batch_size=[2, 3, -1])
    assert seq.batch_size == torch.Size([2, 3, -1])
    out = seq.to_padded_tensor()
    assert type(out) is Seq and out.batch_size == torch.Size([2, 3, 6])
    assert torch.equal(out.x, torch.nested.to_padded_tensor(nt, 0.0))
    assert seq[1].batch_size == torch.Size([3, 6])


def test_in_place_writes_check_the_components():
    td = TensorDict({"x": _nested(torch.strided)}, batch_size=[2, 3, -1])
    td.set_("x", _nested(torch.strided) * 3)
    expected = [3 * c for c in _components()]
    assert all(torch.equal(a, b) for a, b in zip(td["x"].unbind(), expected, strict=True))
    swapped = torch.nested.nested_tensor(_components()[::-1])
    with pytest.raises(RuntimeError, match=r"same component shapes\. Nothing was written"):
        td.set_("x", swapped)
    assert all(torch.equal(a, b) for a, b in zip(td["x"].unbind(), expected, strict=True))


def test_auto_batch_size_reads_a_ragged_dim():
    td = TensorDict({"x": _nested(torch.strided)}, batch_size=[2])
    assert td.auto_batch_size_().batch_size == torch.Size([2, 3, -1, 5])


@pytest.mark.parametrize("index", [(0, 1), (slice(None), slice(0, 2)), (Ellipsis, 0)])
def test_an_index_along_a_ragged_dim_is_a_clear_error(index):
    td = TensorDict({"n": _nested(torch.jagged)}, [2, -1])
    with pytest.raises(IndexError, match="ragged"):
        td[index]
    # indexing the dims before it first gives the dense component, as torch does
    first = _components()[0].transpose(0, 1)  # the jagged layout's first component
    torch.testing.assert_close(td[0][1]["n"], first[1])
