"""The data-loading flow of tensordict's tutorials, end to end, with tdfunc.

Preallocate a memory-mapped TensorDict with ``memmap_like``, fill it row by row
from a (synthetic) dataset whose images carry a leading channel dim of 1, read it
through a ``DataLoader`` (default collate and ``__getitems__``, 0 and 2 workers)
and train a tiny model. Every batch is compared with the rows of the source data.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from tdfunc import MemoryMappedTensor, TensorClass, TensorDict

# a worker that hangs fails the test instead of blocking the suite
_WAIT = 60.0


class Synthetic(Dataset):
    """FashionMNIST-shaped samples: (image [1, 8, 8], label), computed from the index."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 1, 8, 8, generator=g)
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], self.labels[i]


class ImageBatch(TensorClass):
    images: torch.Tensor
    targets: torch.Tensor


def _fill(dataset: Synthetic, path) -> TensorDict:
    n = len(dataset)
    template = TensorDict(
        {"images": torch.zeros(n, 8, 8), "targets": torch.zeros(n, dtype=torch.int64)}, [n]
    )
    data = template.memmap_like(path)
    for i in range(n):
        image, label = dataset[i]
        # the image has a leading dim of 1: written into row i as torch does
        data[i] = TensorDict({"images": image, "targets": label}, [])
    return data


@pytest.mark.parametrize("num_workers", [0, 2])
def test_memmap_like_fill_and_dataloader(tmp_path, num_workers):
    dataset = Synthetic(10)
    data = _fill(dataset, tmp_path / "data")
    assert isinstance(data["images"], MemoryMappedTensor)
    assert torch.equal(data["images"], dataset.images[:, 0])
    assert torch.equal(data["targets"], dataset.labels)

    loader = DataLoader(
        data, batch_size=4, num_workers=num_workers, timeout=_WAIT if num_workers else 0
    )
    seen = []
    for batch in loader:
        assert isinstance(batch, TensorDict)
        seen.append(batch)
    assert [b.batch_size[0] for b in seen] == [4, 4, 2]
    assert torch.equal(torch.cat([b["images"] for b in seen]), dataset.images[:, 0])

    raw = DataLoader(
        data,
        batch_size=4,
        num_workers=num_workers,
        collate_fn=lambda x: x,
        timeout=_WAIT if num_workers else 0,
    )
    batches = list(raw)
    assert all(isinstance(b, TensorDict) for b in batches)
    assert torch.equal(torch.cat([b["targets"] for b in batches]), dataset.labels)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_of_samples_and_tensorclass(tmp_path, num_workers):
    samples = [TensorDict({"x": torch.full((2,), float(i))}, []) for i in range(5)]
    batches = list(
        DataLoader(
            samples, batch_size=2, num_workers=num_workers, timeout=_WAIT if num_workers else 0
        )
    )
    assert [b.batch_size for b in batches] == [torch.Size([2])] * 2 + [torch.Size([1])]
    assert torch.equal(torch.cat([b["x"] for b in batches]), torch.stack([s["x"] for s in samples]))

    dataset = Synthetic(6)
    data = _fill(dataset, tmp_path / "tc")
    typed = ImageBatch.from_tensordict(data)
    out = list(
        DataLoader(
            typed, batch_size=4, num_workers=num_workers, timeout=_WAIT if num_workers else 0
        )
    )
    assert all(isinstance(b, ImageBatch) for b in out)
    assert torch.equal(torch.cat([b.images for b in out]), dataset.images[:, 0])


def test_tiny_training_loop_matches_plain_tensors(tmp_path):
    dataset = Synthetic(12)
    data = _fill(dataset, tmp_path / "train")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    reference = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    reference.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for _ in range(2):
        for start, batch in zip(range(0, 12, 4), DataLoader(data, batch_size=4)):
            loss = nn.functional.cross_entropy(model(batch["images"]), batch["targets"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            images = dataset.images[start : start + 4, 0]
            labels = dataset.labels[start : start + 4]
            ref_loss = nn.functional.cross_entropy(reference(images), labels)
            ref_opt.zero_grad()
            ref_loss.backward()
            ref_opt.step()
            torch.testing.assert_close(loss, ref_loss)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)
