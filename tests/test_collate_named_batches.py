"""``DataLoader`` batches of a named TensorDict keep the batch dim names.

A ``DataLoader`` over a TensorDict reads each batch with one ``td[indices]``
(``__getitems__``), a tensor index: its dims keep the name of the dim they
index, with 0 and 2 worker processes. Values are checked against the same
rows read from the plain tensors.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from tdfunc import TensorDict

# a worker that hangs fails the test instead of blocking the suite
_WAIT = 60.0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batches_keep_names_and_rows(num_workers):
    x = torch.arange(24.0).reshape(6, 2, 2)
    flags = torch.arange(6) % 2 == 0
    inner = TensorDict({"y": x.clone()}, [6, 2], names=["sample", "step"])
    data = TensorDict({"x": x, "flag": flags, "inner": inner}, [6], names=["sample"])
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0)).tolist()
    loader = DataLoader(
        data,
        batch_size=4,
        sampler=order,
        num_workers=num_workers,
        timeout=_WAIT if num_workers else 0,
    )
    batches = list(loader)
    assert [b.batch_size for b in batches] == [torch.Size([4]), torch.Size([2])]
    for batch, rows in zip(batches, (order[:4], order[4:])):
        assert batch.names == ["sample"]
        assert batch["inner"].names == ["sample", "step"]
        assert torch.equal(batch["x"], x[rows])
        assert torch.equal(batch["flag"], flags[rows])
        assert torch.equal(batch["inner", "y"], x[rows])
