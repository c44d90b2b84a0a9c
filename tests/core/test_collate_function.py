"""``collate`` as a ``DataLoader``'s ``collate_fn``: batches equal plain tensors padded and
stacked by hand, tensordict 0.15.3 gives the same (run in its own process), and its
errors name the function and the problem."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import collections
from functools import partial

import pytest
import tensordict_peer
import torch
from torch.utils.data import DataLoader

from tdfunc import TensorClass, TensorDict, collate, tensorclass

PROBE = r"""
import collections, torch
from functools import partial
from torch.utils.data import DataLoader
from LIB import TensorDict, collate
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
def d(x):
    if hasattr(x, "batch_size"):
        return (type(x).__name__, list(x.batch_size), sorted((str(k), [t.tolist() for t in v.unbind()] if v.is_nested else v.tolist()) for k, v in x.items(True, True) if isinstance(v, torch.Tensor)))
    if isinstance(x, torch.Tensor): return x.tolist()
    if isinstance(x, tuple): return (type(x).__name__, [d(i) for i in x])
    if isinstance(x, dict): return {k: d(v) for k, v in x.items()}
    return x
g = torch.Generator().manual_seed(0)
s = [TensorDict(ids=torch.randint(0, 9, (n,), generator=g), points=torch.randn(n + 1, 3, generator=g).round(decimals=2), n=TensorDict(t=torch.arange(n)), score=torch.tensor(float(n))) for n in (2, 3, 1, 4)]
for opts in ({}, dict(pad_keys={"ids": 7}, nested_keys=["points"], mask_key="mask"), dict(pad_keys={"ids": 7, "points": -1, ("n", "t"): 0}, mask_key=("m", "k")), dict(pad_keys={"ids": 7, "points": 0, ("n", "t"): 0}), dict(nested_keys=["ids", "points", ("n", "t")])):
    print(run(lambda: d(next(iter(DataLoader(s, batch_size=4, collate_fn=partial(collate, **opts)))))))
print(d(collate([(TensorDict(x=torch.ones(2)), i) for i in range(3)])), d(collate([{"a": TensorDict(x=torch.ones(2)), "b": torch.ones(1)} for i in range(3)])))
P = collections.namedtuple("P", "td label")
print(d(collate([P(TensorDict(x=torch.ones(2)), 1.0) for i in range(2)])), d(collate([])), d(collate(TensorDict(x=torch.ones(2), batch_size=[2]))))
print(d(collate([torch.ones(2), torch.zeros(2)])), d(collate([1, 2])), d(collate(["a", "b"])))
print(run(lambda: collate(s, mask_key="mask")), run(lambda: collate(s, pad_keys={"ids": 7}, nested_keys=["ids", "points"])), run(lambda: collate(s, pad_keys={"zz": 7, "points": 0, "ids": 0, ("n", "t"): 0})))
print(run(lambda: collate(s, pad_keys={"ids": 7, "points": 0, ("n", "t"): 0}, mask_key="score")), run(lambda: collate([TensorDict(a=torch.ones(2, 3), batch_size=[2])] * 2, pad_keys={"a": 0})))
"""


@pytest.mark.slow  # a tensordict process
def test_collate_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _samples(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        TensorDict(
            ids=torch.randint(1, 9, (n,), generator=g),
            points=torch.randn(n + 1, 3, generator=g),
            score=torch.tensor(float(n)),
        )
        for n in lengths
    ]


@pytest.mark.parametrize("lengths", [[2, 3, 1, 4], [1], [0, 2], [3, 3]])
def test_padding_and_nesting_equal_plain_tensors(lengths):
    samples = _samples(lengths)
    collate_fn = partial(collate, pad_keys={"ids": -1}, nested_keys=["points"], mask_key="mask")
    loader = DataLoader(samples, batch_size=len(samples), collate_fn=collate_fn)
    batch = next(iter(loader))
    longest = max(lengths)
    # the reference: each sample's tensor written into a filled tensor by hand
    ids = torch.full((len(samples), longest), -1, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    for i, sample in enumerate(samples):
        ids[i, : len(sample["ids"])] = sample["ids"]
        mask[i, : len(sample["ids"])] = True
    assert torch.equal(batch["ids"], ids) and torch.equal(batch["mask", "ids"], mask)
    assert batch["points"].is_nested and batch.batch_size == torch.Size([len(samples)])
    for got, sample in zip(batch["points"].unbind(), samples, strict=True):
        assert torch.equal(got, sample["points"])
    assert torch.equal(batch["score"], torch.stack([s["score"] for s in samples]))


def test_structures_around_the_containers():
    td = TensorDict(x=torch.ones(2))
    label_batch = collate([(td, i) for i in range(3)])
    assert isinstance(label_batch, tuple) and label_batch[1].tolist() == [0, 1, 2]
    assert label_batch[0].batch_size == torch.Size([3])
    pair = collections.namedtuple("pair", "td label")
    out = collate([pair(td, 1.0), pair(td, 2.0)])
    assert type(out) is pair and out.label.tolist() == [1.0, 2.0]
    out = collate([{"a": td, "b": torch.ones(1)}] * 3)
    assert out["a"]["x"].shape == (3, 2) and out["b"].shape == (3, 1)
    # the options reach the containers inside tuples and dicts
    samples = _samples([1, 3])
    out = collate([(s, 0) for s in samples], pad_keys={"ids": 0, "points": 0})
    assert out[0]["ids"].shape == (2, 3) and out[0]["points"].shape == (2, 4, 3)
    # a container read in one index (a batch sampler) and an empty list come back as they are
    whole = TensorDict(x=torch.ones(4), batch_size=[4])
    assert collate(whole) is whole and collate([]) == []
    assert collate(["a", "b"]) == ["a", "b"] and collate([1, 2]).tolist() == [1, 2]


@tensorclass
class _Text:
    ids: torch.Tensor
    mask: TensorDict = None


def test_a_tensorclass_keeps_its_class_and_holds_the_masks_in_a_field():
    samples = [_Text(ids=torch.arange(n)) for n in (1, 3)]
    batch = collate(samples, pad_keys={"ids": 9}, mask_key="mask")
    assert type(batch) is _Text and batch.ids.tolist() == [[0, 9, 9], [0, 1, 2]]
    assert batch.mask["ids"].tolist() == [[True, False, False], [True, True, True]]
    with pytest.raises(ValueError, match=r"mask_key='other' names no field of _Text"):
        collate(samples, pad_keys={"ids": 9}, mask_key="other")


def test_non_tensor_entries_and_nested_keys():
    samples = [TensorDict(n={"t": torch.arange(k)}, s=f"s{k}") for k in (2, 1)]
    batch = collate(samples, pad_keys={("n", "t"): 0}, mask_key=("m", "k"))
    assert batch["n", "t"].tolist() == [[0, 1], [0, 0]]
    assert batch["m", "k", "n", "t"].tolist() == [[True, True], [True, False]]
    assert batch.get("s").tolist() == ["s2", "s1"]


def test_errors_name_the_function_and_the_problem():
    samples = _samples([2, 3])
    with pytest.raises(
        RuntimeError, match=r"tdfunc.collate: .*name the entries whose length varies"
    ):
        collate(samples)
    with pytest.raises(ValueError, match=r"tdfunc.collate: mask_key='mask' needs pad_keys"):
        collate(samples, mask_key="mask")
    with pytest.raises(
        ValueError, match=r"the keys \['ids'\] are in both pad_keys and nested_keys"
    ):
        collate(samples, pad_keys={"ids": 0}, nested_keys=["ids", "points"])
    with pytest.raises(KeyError, match=r"the sample at position 0 has no entry 'zz'"):
        collate(samples, pad_keys={"zz": 0, "ids": 0, "points": 0})
    with pytest.raises(ValueError, match=r"mask_key='score' is an entry of the samples"):
        collate(samples, pad_keys={"ids": 0, "points": 0}, mask_key="score")
    with pytest.raises(
        ValueError, match=r"which is a batch dim of these samples \(batch size \[2\]\)"
    ):
        collate([TensorDict(a=torch.ones(2, 3), batch_size=[2])] * 2, pad_keys={"a": 0})
    with pytest.raises(ValueError, match=r"the entry 'score' is 0-d: it has no length to pad"):
        collate(samples, pad_keys={"ids": 0, "points": 0, "score": 0})
    with pytest.raises(TypeError, match=r"pad_keys must map each entry to its padding value"):
        collate(samples, pad_keys=["ids"])
    with pytest.raises(
        RuntimeError, match=r"the entry 'points' \(shapes \[\[3, 3\], \[4, 2\]\]\) cannot be padded"
    ):
        collate(
            [TensorDict(points=torch.ones(3, 3)), TensorDict(points=torch.ones(4, 2))],
            pad_keys={"points": 0},
        )


def test_frozen_tensorclass_samples_are_padded_into_a_frozen_batch():
    # the padded entries were written into the stacked batch: a frozen class refused them
    class Frozen(TensorClass["frozen"]):
        tokens: torch.Tensor
        label: torch.Tensor
        masks: TensorDict = None

    lengths = [2, 4, 3]
    samples = [Frozen(tokens=torch.arange(n), label=torch.tensor(n)) for n in lengths]
    batch = collate(samples, pad_keys={"tokens": -1}, mask_key="masks")
    expected = torch.nn.utils.rnn.pad_sequence(
        [torch.arange(n) for n in lengths], batch_first=True, padding_value=-1
    )
    assert type(batch) is Frozen and batch.batch_size == (3,)
    assert torch.equal(batch.tokens, expected) and batch.label.tolist() == lengths
    assert batch.masks["tokens"].tolist() == (expected != -1).tolist()
    with pytest.raises(AttributeError, match="frozen"):
        batch.label = torch.zeros(3)


def test_entries_inside_a_nested_frozen_tensorclass_are_padded():
    class Point(TensorClass["frozen"]):
        x: torch.Tensor

    lengths = [2, 3]
    samples = [TensorDict(p=Point(x=torch.arange(n)), y=torch.tensor(n)) for n in lengths]
    batch = collate(samples, pad_keys={("p", "x"): -1}, mask_key="m")
    assert type(batch["p"]) is Point and batch["p"].batch_size == (2,)
    assert batch["p"].x.tolist() == [[0, 1, -1], [0, 1, 2]] and batch["y"].tolist() == lengths
    assert batch["m", "p", "x"].tolist() == [[True, True, False], [True, True, True]]
    with pytest.raises(AttributeError, match="frozen"):
        batch["p"].x = torch.zeros(2, 3)
    ragged = collate(samples, nested_keys=[("p", "x")])["p"].x
    assert [row.tolist() for row in ragged.unbind()] == [[0, 1], [0, 1, 2]]
