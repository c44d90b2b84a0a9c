"""``pad`` (method and function), ``pad_sequence`` and ``merge_tensordicts``, against
``torch.nn.functional.pad``, ``torch.nn.utils.rnn.pad_sequence``, Python lists and dicts.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdfunc
from tdfunc import NonTensorData, NonTensorStack, TensorClass, TensorDict


class Sample(TensorClass):
    a: torch.Tensor
    b: torch.Tensor


class Tagged(TensorClass):
    a: torch.Tensor
    tag: str


def pad_list(values: list, pairs: list) -> list:
    """Nested lists padded with None (negative sizes crop), the reference for non-tensors."""
    (left, right), rest = pairs[0], pairs[1:]
    if rest:
        values = [pad_list(v, rest) for v in values]
    width = len(values[0]) if rest and values else None
    filler = (lambda: [None] * width) if rest else (lambda: None)
    values = values[max(-left, 0) : len(values) - max(-right, 0)]
    return (
        [filler() for _ in range(max(left, 0))] + values + [filler() for _ in range(max(right, 0))]
    )


def torch_pad(t: torch.Tensor, pad_size: list, value: float = 0.0) -> torch.Tensor:
    """The batch-dim pad of one leaf with torch.nn.functional.pad."""
    pairs = [pad_size[i : i + 2] for i in range(0, len(pad_size), 2)]
    flat = [0, 0] * (t.dim() - len(pairs))
    for pair in reversed(pairs):
        flat += pair
    return F.pad(t, flat, value=value)


# ---------------------------------------------------------------- pad
@pytest.mark.parametrize("pad_size", [[0, 1, 0, 2], [1, 0, 2, 1], [-1, 2, 0, -2], [2, 0]])
def test_pad_inplace_equals_functional_and_torch(pad_size):
    g = torch.Generator().manual_seed(0)
    plain = {"a": torch.randn(3, 4, generator=g), "b": torch.randn(3, 4, 5, generator=g)}
    nested = torch.randn(3, 4, 2, generator=g)

    def build():
        return TensorDict({**plain, "n": TensorDict({"c": nested}, [3, 4])}, [3, 4])

    ref = tdfunc.pad(build(), pad_size, value=7.0)
    td = build()
    inner = td["n"]
    out = tdfunc.pad(td, pad_size, 7.0, True)
    assert out is td and td["n"] is inner
    for key, value in {**plain, ("n", "c"): nested}.items():
        expected = torch_pad(value, pad_size, 7.0)
        assert torch.equal(out[key], expected) and torch.equal(ref[key], expected)
    assert out.batch_size == ref.batch_size == expected.shape[:2]
    assert inner.batch_size == out.batch_size


def test_pad_inplace_tensorclass_keeps_identity():
    a, b = torch.randn(3, 4), torch.randn(3, 4, 2)
    sample = Sample(a=a, b=b, batch_size=[3, 4])
    inner = sample._tensordict
    out = sample.pad([0, 1, 0, 2], value=1.0, inplace=True)
    assert out is sample and sample._tensordict is inner
    assert torch.equal(sample.a, torch_pad(a, [0, 1, 0, 2], 1.0))
    assert torch.equal(sample.b, torch_pad(b, [0, 1, 0, 2], 1.0))
    assert sample.batch_size == torch.Size([4, 6])
    assert isinstance(tdfunc.pad(sample, [1, 0]), Sample)


@pytest.mark.parametrize("safe", [True, False])
def test_pad_negative_output_size_is_refused_before_any_change(safe):
    a = torch.ones(3, 4)
    td = TensorDict({"a": a, "s": NonTensorStack("x", "y", "z")}, [3])
    with pytest.raises(RuntimeError, match="negative output size"):
        tdfunc.pad(td, [-4, 0], inplace=True, safe=safe)
    assert td["a"] is a and td.batch_size == torch.Size([3])
    assert td["s"] == ["x", "y", "z"]


@pytest.mark.parametrize("pad_size", [[0, 2], [1, 1], [-1, 1], [2, -3]])
def test_pad_non_tensor_stack_entry(pad_size):
    values = ["a", "b", "c"]
    td = TensorDict({"x": torch.arange(3), "s": NonTensorStack(*values)}, [3])
    out = tdfunc.pad(td, pad_size)
    assert isinstance(out.get("s"), NonTensorStack)
    assert out["s"] == pad_list(values, [pad_size])
    assert torch.equal(out["x"], F.pad(torch.arange(3), pad_size))
    assert out.get("s").batch_size == out.batch_size


@pytest.mark.parametrize("pad_size", [[0, 1, 1, 0], [1, 1, -1, 2]])
def test_pad_non_tensor_two_dims(pad_size):
    values = [[f"{i}{j}" for j in range(2)] for i in range(3)]
    td = TensorDict({"s": NonTensorStack.from_list(values), "x": torch.ones(3, 2)}, [3, 2])
    pairs = [pad_size[:2], pad_size[2:]]
    out = td.pad(pad_size)
    assert out["s"] == pad_list(values, pairs)
    assert out.batch_size == torch_pad(torch.ones(3, 2), pad_size).shape


def test_pad_non_tensor_data_gains_none_slots_and_crop_keeps_one_value():
    td = TensorDict({"m": NonTensorData("m", batch_size=[3]), "x": torch.ones(3)}, [3])
    assert td.pad([0, 2]).get("m").tolist() == pad_list(["m"] * 3, [[0, 2]])
    cropped = td.pad([-1, 0]).get("m")
    assert type(cropped) is NonTensorData and cropped.batch_size == torch.Size([2])
    assert cropped.data == "m"


def test_pad_nested_non_tensor_with_extra_batch_dims():
    values = [["p", "q"], ["r", "s"]]
    inner = TensorDict({"s": NonTensorStack.from_list(values)}, [2, 2])
    td = TensorDict({"n": inner, "x": torch.zeros(2)}, [2])
    out = td.pad([1, 0])
    assert out["n"].batch_size == torch.Size([3, 2])
    assert out["n", "s"] == pad_list(values, [[1, 0], [0, 0]])


def test_pad_inplace_keeps_non_tensor_stack_identity():
    td = TensorDict({"x": torch.arange(3.0), "s": NonTensorStack("a", "b", "c")}, [3])
    stack = td.get("s")
    out = tdfunc.pad(td, [0, 2], inplace=True)
    assert out is td and td.get("s") is stack
    assert stack.tolist() == ["a", "b", "c", None, None]
    assert stack.batch_size == td.batch_size
    assert torch.equal(td["x"], F.pad(torch.arange(3.0), [0, 2]))


def test_pad_top_level_non_tensor_leaves():
    stack = NonTensorStack("a", "b")
    padded = tdfunc.pad(stack, [1, 1])
    assert isinstance(padded, NonTensorStack) and padded.tolist() == [None, "a", "b", None]
    assert stack.tolist() == ["a", "b"]  # the input is unchanged
    assert stack.pad([0, 1]).tolist() == ["a", "b", None]
    assert tdfunc.pad(stack, [0, 1], inplace=True) is stack
    assert stack.tolist() == ["a", "b", None] and stack.batch_size == torch.Size([3])
    leaf = NonTensorData("a", batch_size=[2])
    with pytest.raises(RuntimeError, match="cannot preserve the identity"):
        tdfunc.pad(leaf, [0, 1], inplace=True)
    assert tdfunc.pad(leaf, [0, 1]).tolist() == ["a", "a", None]
    assert tdfunc.pad(leaf, [-1, 0], inplace=True) is leaf and leaf.batch_size == (1,)
    with pytest.raises(RuntimeError, match="negative output size"):
        stack.pad([-5, 0])


def test_pad_inplace_refuses_an_element_view_of_a_stack():
    parent = NonTensorStack.from_list([["a", "b"], ["c", "d"]])
    row = parent[0]
    with pytest.raises(RuntimeError, match="element of another stack"):
        row.pad([0, 1], inplace=True)
    assert parent.tolist() == [["a", "b"], ["c", "d"]]


def test_pad_rejects_a_tensor():
    with pytest.raises(TypeError, match=r"torch\.nn\.functional\.pad"):
        tdfunc.pad(torch.ones(2), [1, 1])


# ---------------------------------------------------------------- pad_sequence
def rnn_pad(tensors: list, dim: int, value: float) -> torch.Tensor:
    """torch's pad_sequence along ``dim`` of each tensor (it pads dim 0)."""
    moved = [t.movedim(dim, 0) for t in tensors]
    out = torch.nn.utils.rnn.pad_sequence(moved, batch_first=True, padding_value=value)
    return out.movedim(1, dim + 1)


@pytest.mark.parametrize("pad_dim", [0, -1])
@pytest.mark.parametrize("mask_key", [None, "masks", ("m", "valid")])
def test_pad_sequence_along_a_batch_dim(pad_dim, mask_key):
    lengths = (2, 4, 3)
    g = torch.Generator().manual_seed(1)
    a = [torch.randn(n, 8, generator=g) for n in lengths]
    c = [torch.randn(n, generator=g) for n in lengths]
    tds = [TensorDict({"a": x, "b": {"c": y}}, [n]) for x, y, n in zip(a, c, lengths)]
    return_mask = False if mask_key is None else (True if mask_key == "masks" else mask_key)
    out = tdfunc.pad_sequence(tds, pad_dim=0, padding_value=-1.0, return_mask=return_mask)
    assert out.batch_size == torch.Size([3, 4])
    assert torch.equal(out["a"], rnn_pad(a, 0, -1.0))
    assert torch.equal(out["b", "c"], rnn_pad(c, 0, -1.0))
    if mask_key is None:
        assert "masks" not in out
        return
    expected = torch.tensor([[j < n for j in range(4)] for n in lengths])
    assert torch.equal(out[mask_key, "a"], expected)  # over the batch dims only
    assert torch.equal(out[mask_key, "b", "c"], expected)
    assert torch.equal(out["a"][~out[mask_key, "a"]], torch.full((3, 8), -1.0))


def test_pad_sequence_along_a_feature_dim():
    g = torch.Generator().manual_seed(2)
    a = [torch.randn(6, n, 8, generator=g) for n in (3, 5)]
    c = [torch.randn(6, n, generator=g) for n in (3, 7)]
    tds = [TensorDict({"a": x, ("b", "c"): y}, [6]) for x, y in zip(a, c)]
    out = tdfunc.pad_sequence(tds, pad_dim=1, return_mask=True)
    assert out.batch_size == torch.Size([2, 6])
    assert torch.equal(out["a"], rnn_pad(a, 1, 0.0))
    assert torch.equal(out["b", "c"], rnn_pad(c, 1, 0.0))
    mask_a = out["masks", "a"]
    assert mask_a.shape == (2, 6, 5)  # batch dims, then the padded dim
    assert torch.equal(mask_a[0], torch.tensor([True] * 3 + [False] * 2).expand(6, 5))
    only_c = [td.select("b") for td in tds]
    negative = tdfunc.pad_sequence(only_c, pad_dim=-1)
    assert torch.equal(negative["b", "c"], rnn_pad(c, 1, 0.0))
    with pytest.raises(RuntimeError, match="differ elsewhere"):  # -1 is a's last dim
        tdfunc.pad_sequence(tds, pad_dim=-1)


def test_pad_sequence_non_tensor_entries_are_stacked():
    tds = [
        TensorDict({"a": torch.tensor([1, 1]), "b": "asd"}),
        TensorDict({"a": torch.tensor([2]), "b": "efg"}),
    ]
    out = tdfunc.pad_sequence(tds)
    assert torch.equal(out["a"], rnn_pad([td["a"] for td in tds], 0, 0.0).long())
    assert out["b"] == ["asd", "efg"]
    single = tdfunc.pad_sequence(tds[:1])
    assert isinstance(single.get("b"), NonTensorStack) and single["b"] == ["asd"]


def test_pad_sequence_non_tensor_stack_entries_are_padded_with_none():
    tds = [
        TensorDict({"x": torch.zeros(2), "s": NonTensorStack("a", "b")}, [2]),
        TensorDict({"x": torch.zeros(3), "s": NonTensorStack("c", "d", "e")}, [3]),
    ]
    out = tdfunc.pad_sequence(tds)
    assert out.batch_size == torch.Size([2, 3])
    assert out["s"] == [["a", "b", None], ["c", "d", "e"]]


def test_pad_sequence_tensorclass():
    items = [Tagged(a=torch.ones(n), tag=t, batch_size=[]) for n, t in ((2, "x"), (1, "y"))]
    out = tdfunc.pad_sequence(items)
    assert isinstance(out, Tagged)
    assert torch.equal(out.a, rnn_pad([i.a for i in items], 0, 0.0))
    assert out.tag == ["x", "y"]
    with pytest.raises(TypeError, match="to_tensordict"):
        tdfunc.pad_sequence(items, return_mask=True)


def test_pad_sequence_errors():
    with pytest.raises(KeyError, match="same keys"):
        tdfunc.pad_sequence([TensorDict(a=torch.ones(2)), TensorDict(b=torch.ones(2))])
    with pytest.raises(ValueError, match="0-dim"):
        tdfunc.pad_sequence([TensorDict(a=torch.tensor(1.0))] * 2)
    tds = [TensorDict({"a": torch.ones(n, 3)}, [n]) for n in (2, 3)]
    with pytest.raises(ValueError, match="batch dim 0"):
        tdfunc.pad_sequence(tds, pad_dim=1)
    with pytest.raises(KeyError, match="already an entry"):
        tdfunc.pad_sequence([TensorDict(masks=torch.ones(2))], return_mask=True)
    with pytest.raises(ValueError, match="non-empty"):
        tdfunc.pad_sequence([])


# ---------------------------------------------------------------- merge_tensordicts
def test_merge_callback_runs_only_on_entries_every_container_holds():
    sources = [
        {"a": {"b0": 0}, "c": {"d": {"e": 0}}, "common": 0},
        {"a": {"b1": 1}, "f": {"g": {"h": 1}}, "common": 1},
        {"a": {"b2": 2}, "f": {"g": {"h": 2}}, "common": 2},
    ]
    tds = [TensorDict(s) for s in sources]

    def stack(*values):
        return torch.stack(list(values))

    for callback in (stack, {"common": stack}, {("common",): stack}):
        out = tdfunc.merge_tensordicts(*tds, callback_exist=callback)
        assert torch.equal(out["common"], torch.arange(3))
        # ("f", "g", "h") is in two of the three: the first value wins
        expected = {("a", "b0"): 0, ("a", "b1"): 1, ("a", "b2"): 2, ("c", "d", "e"): 0}
        expected[("f", "g", "h")] = 1
        for key, value in expected.items():
            assert out[key].item() == value
        assert set(out.keys(True, True)) == set(expected) | {"common"}


def test_merge_nested_callback_by_key_and_validation():
    tds = [TensorDict({"n": {"x": torch.tensor([i, i])}}, [2]) for i in range(2)]
    out = tdfunc.merge_tensordicts(*tds, callback_exist={("n", "x"): lambda *v: sum(v)})
    assert out["n", "x"].tolist() == [1, 1]
    with pytest.raises(ValueError, match="merge_tensordicts"):  # a result off the batch
        tdfunc.merge_tensordicts(*tds, callback_exist=lambda *v: torch.zeros(3))


def test_merge_tensorclass_keeps_its_class():
    first = Sample(a=torch.zeros(2), b=torch.zeros(2), batch_size=[2])
    second = Sample(a=torch.ones(2), b=torch.ones(2), batch_size=[2])
    out = tdfunc.merge_tensordicts(first, second, callback_exist={"b": lambda x, y: x + y + 1})
    assert isinstance(out, Sample)
    assert out.a.tolist() == [0.0, 0.0] and out.b.tolist() == [2.0, 2.0]


def test_pad_result_never_shares_a_stack_with_its_input():
    td = TensorDict({"s": NonTensorStack("a", "b")}, [2])
    same = td.pad([0, 0])
    assert same.get("s") is not td.get("s") and same["s"] == ["a", "b"]
    same.pad([0, 1], inplace=True)
    assert td["s"] == ["a", "b"] and td.get("s").batch_size == td.batch_size


def test_pad_inplace_refuses_a_locked_container():
    td = TensorDict({"x": torch.zeros(2), "s": NonTensorStack("a", "b")}, [2]).lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.pad([0, 1], inplace=True)
    assert td["s"] == ["a", "b"] and td.batch_size == torch.Size([2])


def test_pad_sequence_padding_value_per_key_and_left_padding():
    # a reference written with torch.nn.functional.pad per sample, then torch.stack
    pad_sequence = tdfunc.pad_sequence
    lengths = (2, 3)
    samples = [
        TensorDict(ids=torch.arange(1, n + 1), n={"f": torch.ones(n, 3)}, s="a") for n in lengths
    ]
    out = pad_sequence(samples, padding_value={"ids": 7, ("n", "f"): 5.0})
    expected = torch.stack([F.pad(torch.arange(1, n + 1), [0, 3 - n], value=7) for n in lengths])
    assert torch.equal(out["ids"], expected)
    expected = torch.stack([F.pad(torch.ones(n, 3), [0, 0, 0, 3 - n], value=5.0) for n in lengths])
    assert torch.equal(out["n", "f"], expected)
    # a key that names no tensor entry is refused, not ignored
    with pytest.raises(KeyError, match=r"padding_value names keys .*\('zz',\)"):
        pad_sequence(samples, padding_value={"zz": 1})
    left = pad_sequence(samples, padding_side="left", return_mask=True, padding_value=9)
    expected = torch.stack([F.pad(torch.arange(1, n + 1), [3 - n, 0], value=9) for n in lengths])
    assert torch.equal(left["ids"], expected)
    assert left["masks", "ids"].tolist() == [[False, True, True], [True, True, True]]
    with pytest.raises(ValueError, match="padding_side must be 'left' or 'right'"):
        pad_sequence(samples, padding_side="middle")
    batched = [TensorDict(a=torch.arange(n), s=["x"] * n, batch_size=[n]) for n in lengths]
    left = pad_sequence(batched, padding_side="left")
    assert left["a"].tolist() == [[0, 0, 1], [0, 1, 2]]
    assert left["s"] == [[None, "x", "x"], ["x", "x", "x"]]  # non-tensor values padded first
