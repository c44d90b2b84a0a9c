"""Identity and error rules of shape ops (``_core/shape``), checked against plain tensors."""

import pytest
import torch

from tdfunc import TensorDict


def _td():
    return TensorDict(
        {"a": torch.randn(4, 5, 6, 2), "n": TensorDict({"c": torch.randn(4, 5, 6)}, [4, 5, 6])},
        [4, 5, 6],
    )


def test_movedim_to_the_same_place_is_the_container():
    td = _td()
    assert td.movedim(1, 1) is td
    assert td.movedim((0, 2), (0, 2)) is td
    moved = td.movedim((0, 1), (2, 0))
    assert torch.equal(moved["a"], torch.movedim(td["a"], (0, 1), (2, 0)))


def test_pad_inplace_keeps_nested_containers():
    td = _td()
    nested, a = td["n"], td["a"]
    out = td.pad([0, 1, 2, 0], value=3.0, inplace=True)
    assert out is td and td["n"] is nested
    assert nested.batch_size == torch.Size([5, 7, 6])
    expected = torch.nn.functional.pad(a, [0, 0, 0, 0, 2, 0, 0, 1], value=3.0)
    assert torch.equal(td["a"], expected)


def test_gather_inplace_needs_index_of_batch_rank():
    td = TensorDict({"a": torch.zeros(3, 4)}, [3, 4])
    with pytest.raises(NotImplementedError, match=r"index\.ndim"):
        td.gather(0, torch.tensor([0, 1]), inplace=True)
    with pytest.raises(ValueError, match="as many dims"):
        td.gather(0, torch.tensor([0, 1]))


def test_chunk_and_split_of_a_jagged_tensor_along_its_outer_dim():
    seqs = [torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6, 7]), torch.tensor([8])]
    jagged = torch.nested.as_nested_tensor(seqs, layout=torch.jagged)
    td = TensorDict({"ids": jagged}, [3])
    chunks = td.chunk(2)
    assert [c.batch_size[0] for c in chunks] == [len(c) for c in torch.arange(3).chunk(2)]
    pieces = [list(c["ids"].unbind(0)) for c in chunks]
    flat = [t for piece in pieces for t in piece]
    assert all(torch.equal(x, y) for x, y in zip(flat, seqs, strict=True))
    assert all(c["ids"].layout == torch.jagged for c in chunks)
