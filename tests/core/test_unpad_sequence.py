"""``unpad_sequence``: the samples that ``pad_sequence`` padded come back whole (the
reference is the list of samples itself), as tensordict 0.15.3 gives them (run in its own
process), and its errors name the function and the problem."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pytest
import tensordict_peer
import torch

from tdfunc import TensorDict, pad_sequence, tensorclass, unpad_sequence

PROBE = r"""
import torch
from LIB import TensorDict, pad_sequence, unpad_sequence
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
def samples(out):
    out = out.tensordicts if hasattr(out, "tensordicts") else out
    return [(list(s.batch_size), sorted((str(k), v.tolist()) for k, v in s.items(True, True) if isinstance(v, torch.Tensor))) for s in out]
g = torch.Generator().manual_seed(0)
for side in ("left", "right"):
    for batch in (True, False):
        tds = [TensorDict(a=torch.randint(0, 9, (n,), generator=g), b=torch.randn(n, 2, generator=g).round(decimals=2), n=TensorDict(c=torch.arange(n), batch_size=[n] if batch else []), batch_size=[n] if batch else []) for n in (3, 1, 4)]
        padded = pad_sequence(tds, return_mask=True, padding_side=side)
        print(side, batch, samples(unpad_sequence(padded)))
        mask = padded["masks", "a"]
        print(samples(unpad_sequence(padded.exclude("masks"), mask)), samples(unpad_sequence(padded.exclude("masks"), padded["masks"])))
tds = [TensorDict(a=torch.arange(2 * n).view(2, n)) for n in (2, 3)]
print(samples(unpad_sequence(pad_sequence(tds, pad_dim=1).exclude("masks"), torch.tensor([[True, True, False], [True, True, True]]), pad_dim=1)))
tds = [TensorDict(a=torch.arange(n), batch_size=[n]) for n in (2, 4)]
p = pad_sequence(tds, return_mask=True)
print(samples(unpad_sequence(p.exclude("masks"), torch.tensor([[False, True, True, False], [False, False, False, False]]))))
print(samples(unpad_sequence(p[:0])))
print(run(lambda: unpad_sequence(TensorDict(a=torch.ones(3)))), run(lambda: unpad_sequence(p.exclude("masks"))))
print(run(lambda: unpad_sequence(p.exclude("masks"), torch.ones(2, 3, dtype=torch.bool))), run(lambda: unpad_sequence(p.exclude("masks"), torch.tensor([[True, False, True, False], [True] * 4]))))
print(run(lambda: unpad_sequence(TensorDict(a=torch.ones(2, 3), b=torch.ones(2, 3), batch_size=[2]), TensorDict(a=torch.ones(2, 3, dtype=torch.bool), batch_size=[2]))))
"""


@pytest.mark.slow  # a tensordict process
def test_unpad_sequence_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _assert_same(got, expected):
    assert type(got) is type(expected)
    assert got.batch_size == expected.batch_size
    left = dict(got.items(True, True))
    right = dict(expected.items(True, True))
    assert left.keys() == right.keys()
    for key, value in right.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(left[key], value), key
        else:
            assert left[key] == value, key


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("batch_ndim", [0, 1, 2])
def test_pad_then_unpad_gives_the_samples_back(side, batch_ndim):
    g = torch.Generator().manual_seed(batch_ndim)
    lengths = [3, 1, 0, 5]
    tds = []
    for n in lengths:
        size = [n, 2][:batch_ndim]
        tds.append(
            TensorDict(
                a=torch.randn(n, 2, 3, generator=g),
                b=torch.randint(0, 5, (n, 2), generator=g),
                n=TensorDict(c=torch.randn(n, 2, generator=g), batch_size=size),
                batch_size=size,
            )
        )
    padded = pad_sequence(tds, return_mask=True, padding_side=side)
    out = unpad_sequence(padded)
    assert isinstance(out, list) and len(out) == len(tds)
    for got, expected in zip(out, tds, strict=True):
        _assert_same(got, expected)
        assert "masks" not in got
    # the samples' tensors are views of the padded batch
    assert out[0]["a"].untyped_storage().data_ptr() == padded["a"].untyped_storage().data_ptr()


def test_a_dim_of_the_leaves_other_than_the_first():
    tds = [TensorDict(a=torch.randn(4, n, 2), b=torch.randn(4, n)) for n in (2, 5, 3)]
    padded = pad_sequence(tds, pad_dim=1, return_mask=True, padding_value=-1.0)
    for pad_dim in (1, -1):
        # -1 counts from each sample's last dim: b's dim 1, but a's dim 2
        if pad_dim == -1:
            with pytest.raises(ValueError, match=r"mask of the key 'a' must have shape"):
                unpad_sequence(padded, pad_dim=pad_dim)
            continue
        for got, expected in zip(unpad_sequence(padded, pad_dim=pad_dim), tds, strict=True):
            _assert_same(got, expected)


def test_non_tensor_values_lose_the_pad_slots_along_a_batch_dim():
    tds = [TensorDict(a=torch.arange(n), s=f"s{n}", batch_size=[n]) for n in (2, 3)]
    out = unpad_sequence(pad_sequence(tds, return_mask=True))
    assert [sample.get("s").tolist() for sample in out] == [["s2"] * 2, ["s3"] * 3]
    tds = [TensorDict(a=torch.arange(n), s=f"s{n}") for n in (2, 3)]
    out = unpad_sequence(pad_sequence(tds, return_mask=True))
    assert [sample["s"] for sample in out] == ["s2", "s3"]


@tensorclass
class _Clip:
    frames: torch.Tensor
    label: torch.Tensor


def test_a_tensorclass_and_a_shared_mask():
    mask = torch.tensor([[True, True, False, False], [True] * 4])
    clips = [_Clip(frames=torch.randn(n, 3), label=torch.arange(n), batch_size=[]) for n in (2, 4)]
    out = unpad_sequence(pad_sequence(clips), mask)
    assert all(type(sample) is _Clip for sample in out)
    assert torch.equal(out[0].frames, clips[0].frames) and torch.equal(out[1].label, clips[1].label)


def test_hostile_inputs():
    tds = [TensorDict(a=torch.arange(n), batch_size=[n]) for n in (2, 4)]
    padded = pad_sequence(tds, return_mask=True)
    assert unpad_sequence(padded[:0]) == []
    padded.lock_()
    assert [s["a"].tolist() for s in unpad_sequence(padded)] == [[0, 1], [0, 1, 2, 3]]
    named = padded.clone().unlock_().refine_names("row", "time")
    assert [s.batch_size for s in unpad_sequence(named)] == [torch.Size([2]), torch.Size([4])]
    # an all-False row is a sample of length 0
    mask = torch.tensor([[False] * 4, [True] * 4])
    assert unpad_sequence(padded.exclude("masks"), mask)[0].batch_size == torch.Size([0])


def test_errors_name_the_function_and_the_problem():
    tds = [TensorDict(a=torch.arange(n), b=torch.ones(n), batch_size=[n]) for n in (2, 4)]
    padded = pad_sequence(tds, return_mask=True)
    bare = padded.exclude("masks")
    api = "tdfunc.unpad_sequence: "
    with pytest.raises(TypeError, match=api + "expected the TensorDict or TensorClass"):
        unpad_sequence(torch.ones(2, 3))
    with pytest.raises(ValueError, match=api + "the samples lie along the first batch dim"):
        unpad_sequence(TensorDict(a=torch.ones(3)))
    with pytest.raises(ValueError, match=api + "padded has no 'masks' entry"):
        unpad_sequence(bare)
    with pytest.raises(ValueError, match=api + "padded has a Tensor as its 'masks' entry"):
        unpad_sequence(bare.clone().set("masks", torch.ones(2, 4, dtype=torch.bool)))
    with pytest.raises(TypeError, match=api + "a tensor mask must be boolean, got torch.float32"):
        unpad_sequence(bare, torch.ones(2, 4))
    with pytest.raises(TypeError, match=api + "mask must be None, a TensorDict of masks"):
        unpad_sequence(bare, [[True, False]])
    with pytest.raises(KeyError, match=api + "the mask has no entry for the key 'b'"):
        unpad_sequence(bare, padded["masks"].exclude("b"))
    with pytest.raises(ValueError, match=r"must have shape \[len\(padded\), max_len\] = \[2, 4\]"):
        unpad_sequence(bare, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="not contiguous in some row"):
        unpad_sequence(bare, torch.tensor([[True, False, True, False], [True] * 4]))
    with pytest.raises(TypeError, match="pad_dim must be an int"):
        unpad_sequence(padded, pad_dim=1.0)
    with pytest.raises(ValueError, match="pad_dim=3 is out of range for the entry 'a'"):
        unpad_sequence(padded, pad_dim=3)
    masks = padded["masks"].clone()
    masks["b"] = torch.tensor([[True, True, True, False], [True] * 4])
    with pytest.raises(ValueError, match="other lengths along the padded batch dim"):
        unpad_sequence(bare, masks)
