"""``DataLoader`` over TensorDict datasets (workers=0), against the same loader over indices.

The reference for every loader is the same loader built over ``torch.arange(N)``
(same sampler, same generator seed): it gives the indices each batch must hold,
and the batch must equal the plain tensors and lists at those indices.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    RandomSampler,
    Subset,
    random_split,
)

from tdfunc import TensorClass, TensorDict

N = 10
X = torch.arange(N * 2.0).view(N, 2)
R = torch.arange(N) * 10.0
TAGS = [f"s{i}" for i in range(N)]


def dataset() -> TensorDict:
    return TensorDict({"x": X, "tag": list(TAGS), "next": {"r": R}}, [N])


def assert_batch(batch, indices: list[int]) -> None:
    assert isinstance(batch, TensorDict) and batch.batch_size == torch.Size([len(indices)])
    assert torch.equal(batch["x"], X[indices])
    assert torch.equal(batch["next", "r"], R[indices])
    assert list(batch["tag"]) == [TAGS[i] for i in indices]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


LOADERS = {
    "in order": lambda data: DataLoader(data, batch_size=4),
    "drop_last": lambda data: DataLoader(data, batch_size=4, drop_last=True),
    "shuffle": lambda data: DataLoader(data, batch_size=3, shuffle=True, generator=seeded(0)),
    "batch_sampler": lambda data: DataLoader(
        data, batch_sampler=BatchSampler(RandomSampler(data, generator=seeded(1)), 4, False)
    ),
    "sampler of batches": lambda data: DataLoader(
        data,
        sampler=BatchSampler(RandomSampler(data, generator=seeded(2)), 4, False),
        batch_size=None,
    ),
}


@pytest.mark.parametrize("memmapped", [False, True])
@pytest.mark.parametrize("kind", list(LOADERS))
def test_batches_hold_the_items_the_sampler_picks(kind, memmapped, tmp_path):
    data = dataset().memmap(tmp_path) if memmapped else dataset()
    reference = LOADERS[kind](torch.arange(N))
    batches = list(LOADERS[kind](data))
    expected = [[int(i) for i in (b if isinstance(b, list) else b.tolist())] for b in reference]
    assert len(batches) == len(expected)
    for batch, indices in zip(batches, expected):
        assert_batch(batch, indices)


def test_subsets_splits_and_concatenations():
    data = dataset()
    chosen = [1, 3, 5, 7]
    batches = list(DataLoader(Subset(data, chosen), batch_size=3))
    assert_batch(batches[0], [1, 3, 5])
    assert_batch(batches[1], [7])
    train, _ = random_split(data, [7, 3], generator=seeded(0))
    train_indices, _ = random_split(range(N), [7, 3], generator=seeded(0))
    (batch,) = list(DataLoader(train, batch_size=7))
    assert_batch(batch, list(train_indices))
    both = list(DataLoader(ConcatDataset([data, data[:3]]), batch_size=4))
    assert [b.batch_size[0] for b in both] == [4, 4, 4, 1]
    assert_batch(both[2], [8, 9, 0, 1])


def test_samples_in_tuples_and_dicts_and_single_items():
    data = dataset()

    class Pairs(Dataset):
        def __len__(self):
            return N

        def __getitem__(self, i):
            return data[i], torch.tensor(i), {"td": data[i]}

    items, index, nested = next(iter(DataLoader(Pairs(), batch_size=4)))
    assert_batch(items, [0, 1, 2, 3])
    assert_batch(nested["td"], [0, 1, 2, 3])
    assert torch.equal(index, torch.arange(4))
    singles = list(DataLoader(data, batch_size=None))
    assert len(singles) == N and singles[3].batch_size == torch.Size([])
    assert singles[3]["tag"] == "s3" and torch.equal(singles[3]["x"], X[3])


def test_tensorclass_dataset():
    class Item(TensorClass):
        x: torch.Tensor
        label: str

    items = Item(x=X, label=list(TAGS), batch_size=[N])
    loader = DataLoader(items, batch_size=4, shuffle=True, generator=seeded(4))
    reference = DataLoader(list(range(N)), batch_size=4, shuffle=True, generator=seeded(4))
    for batch, indices in zip(loader, reference):
        assert type(batch) is Item
        assert torch.equal(batch.x, X[indices]) and batch.label == [TAGS[i] for i in indices]
