"""Memory-mapped views sent to another process keep their place in the file.

Each case sends through a real ``multiprocessing`` queue to a real (forked)
process of ``process_harness``; the receiver reports the values it sees, and
writes through its view to show it maps the sender's file (not a copy). The
expected values are computed on plain tensors.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest
import torch
from process_harness import run_ranks

from tdfunc import MemoryMappedTensor, TensorDict

VALUES = torch.arange(24, dtype=torch.float32).reshape(8, 3)
VIEWS = {
    "t[5:8]": lambda t: t[5:8],
    "t[::3]": lambda t: t[::3],
    "t[:, 1]": lambda t: t[:, 1],
    "chunk": lambda t: t.chunk(3)[1],
    "split": lambda t: t.split([2, 5, 1])[1],
    "unbind": lambda t: t.unbind(1)[2],
    "t().narrow": lambda t: t.t().narrow(1, 2, 3),
}


def _receive(queue, count: int, write: bool):
    """fn of a rank: take ``count`` objects, report what each holds (and write -1 into it)."""

    def fn(rank: int):
        seen = []
        for _ in range(count):
            item = queue.get(timeout=5)
            if isinstance(item, torch.Tensor):
                seen.append((type(item).__name__, item.tolist()))
                if write:
                    item.fill_(-1.0)
            else:
                seen.append((type(item).__name__, item["x"].tolist()))
        return seen

    return fn


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_view_arrives_with_its_offset_and_strides(tmp_path, name):
    mapped = MemoryMappedTensor.from_tensor(VALUES, filename=tmp_path / "x.memmap")
    view, expected = VIEWS[name](mapped), VIEWS[name](VALUES.clone())
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(view)
    outcome = run_ranks(_receive(queue, 1, write=True), world=1)
    assert outcome.value(0) == [("MemoryMappedTensor", expected.tolist())]
    # the receiver wrote through its view into the sender's file, exactly there
    reference = VALUES.clone()
    VIEWS[name](reference).fill_(-1.0)
    assert torch.equal(mapped, reference)
    on_disk = MemoryMappedTensor.from_filename(tmp_path / "x.memmap", torch.float32, (8, 3))
    assert torch.equal(on_disk, reference)


def test_a_slice_of_a_loaded_checkpoint_arrives_as_that_slice(tmp_path):
    TensorDict({"x": VALUES}, [8]).memmap(tmp_path / "ckpt")
    loaded = TensorDict.load_memmap(tmp_path / "ckpt")
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(loaded[4:6])
    queue.put(loaded.split(3)[1])
    outcome = run_ranks(_receive(queue, 2, write=False), world=1)
    assert outcome.value(0) == [
        ("TensorDict", VALUES[4:6].tolist()),
        ("TensorDict", VALUES[3:6].tolist()),
    ]


def test_a_receiver_refuses_a_file_replaced_after_the_sender_mapped_it(tmp_path):
    path = tmp_path / "x.memmap"
    old = MemoryMappedTensor.from_tensor(VALUES, filename=path)
    MemoryMappedTensor.from_tensor(VALUES * 100, filename=path, existsok=True)
    assert torch.equal(old, VALUES)  # the sender still maps its own (old) data
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(old[2:4])
    outcome = run_ranks(_receive(queue, 1, write=False), world=1)
    kind, text = outcome.error(0)
    assert kind == "StaleFileError"
    assert "was replaced since it was sent" in text and os.fspath(path) in text


def test_a_receiver_refuses_a_deleted_file_and_does_not_recreate_it(tmp_path):
    path = tmp_path / "x.memmap"
    mapped = MemoryMappedTensor.from_tensor(VALUES, filename=path)
    os.remove(path)
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(mapped[1])
    outcome = run_ranks(_receive(queue, 1, write=False), world=1)
    assert outcome.error(0)[0] == "StaleFileError"
    assert not os.path.exists(path)


def _write_into_received(queue):
    def fn(rank: int):
        td = queue.get(timeout=5)
        td["b"][1] = -1.0  # in place: must reach the sender's file
        return td["a"].tolist(), td["b"].tolist()

    return fn


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_a_container_consolidated_into_a_file_is_sent_by_file(tmp_path, strategy):
    """torch's own pickling of such leaves fails (file_descriptor) or silently moves the
    sender's storage to shared memory (file_system): they must travel by file."""
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        td = TensorDict({"a": torch.arange(3.0), "b": torch.ones(3, 2)}, [3])
        consolidated = td.consolidate(filename=tmp_path / "c.bin")
        queue = multiprocessing.get_context("fork").Queue()
        queue.put(consolidated)
        outcome = run_ranks(_write_into_received(queue), world=1)
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)
    expected_b = torch.ones(3, 2)
    expected_b[1] = -1.0
    assert outcome.value(0) == ([0.0, 1.0, 2.0], expected_b.tolist())
    assert torch.equal(consolidated["b"], expected_b)  # the receiver wrote into the file
    assert consolidated["a"].untyped_storage().filename is not None  # sender still maps it
    consolidated["a"][0] = 9.0  # and the sender's writes still reach the file
    raw = torch.from_file(str(tmp_path / "c.bin"), size=3, dtype=torch.float32)
    assert raw[0].item() == 9.0


def test_a_leaf_of_a_shared_data_file_arrives_at_its_offset(tmp_path):
    # many small leaves share one file (each a view at an offset): each one sent alone
    # lands on its own bytes of that file
    leaves = {f"w{i}": torch.full((3,), float(i)) for i in range(20)}
    saved = TensorDict(leaves, []).memmap(tmp_path / "ck")
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(saved["w7"])
    outcome = run_ranks(_receive(queue, 1, write=True), world=1)
    assert outcome.value(0) == [("MemoryMappedTensor", [7.0, 7.0, 7.0])]
    again = TensorDict.load_memmap(tmp_path / "ck")
    assert again["w7"].tolist() == [-1.0] * 3
    assert all(again[f"w{i}"].tolist() == [float(i)] * 3 for i in range(20) if i != 7)
