"""A memory-mapped non-tensor leaf's in-place update is written to its directory.

References are the plain Python values written.
"""

from __future__ import annotations

import pytest
import torch

from tdfunc import NonTensorData, TensorDict

VALUES = [("x", "y"), (0, 1), (0.5, 1.5), ([0, "s", 2], [9, "t", 11]), ({"k": 1, 2: 3}, {"k": 4})]


@pytest.mark.parametrize("values", VALUES)
def test_update_of_a_memmapped_leaf_reaches_the_files(tmp_path, values):
    before, after = values
    td = TensorDict({"val": NonTensorData(before), "n": {"s": NonTensorData(before)}}, [])
    td.memmap_(tmp_path)
    assert td._is_memmap and td.is_locked
    for key in ("val", ("n", "s")):
        leaf = td.get(key)
        assert leaf._is_memmap and leaf._tensordict._is_memmap
        with pytest.raises(RuntimeError, match="lock"):
            leaf.update(NonTensorData(after))
        leaf.update_(NonTensorData(after))
    loaded = TensorDict.load_memmap(tmp_path)
    assert loaded["val"] == after and loaded["n", "s"] == after
    # a loaded leaf is mapped too: its updates reach the files
    loaded.get("val").update_(NonTensorData(before))
    assert TensorDict.load_memmap(tmp_path)["val"] == before
    assert not TensorDict({"val": NonTensorData(before)}, [])._is_memmap


def test_update_inside_a_tensorclass_reaches_the_files(tmp_path):
    from tdfunc import TensorClass

    class Item(TensorClass):
        x: torch.Tensor
        label: str

    td = TensorDict({"item": Item(x=torch.zeros(2), label="a", batch_size=[2])}, [2])
    td.memmap_(tmp_path)
    stored = td.get(("item", "label"))
    assert isinstance(stored, NonTensorData)
    stored.update_(NonTensorData("b", batch_size=[2]))
    assert TensorDict.load_memmap(tmp_path)["item"].label == "b"


# A replay buffer on disk: every in-place write of the container reaches the
# files of its string entries, as its tensor writes reach theirs. The reference
# is a Python list per entry, written the same way.


def _buffer(tmp_path, one_value=False):
    if one_value:  # one value for the whole batch, until a write makes them differ
        tag = NonTensorData("x", batch_size=[6])
        source = TensorDict({"obs": torch.zeros(6, 2), "tag": tag, "next": {"info": tag}}, [6])
        return source.memmap(tmp_path)
    item = TensorDict({"obs": torch.zeros(2), "tag": "x", "next": {"info": "x"}}, [])
    return item.expand(6).memmap_like(tmp_path)


def _strings(td):
    return list(td["tag"]), list(td["next", "info"])


@pytest.mark.parametrize("one_value", [True, False])
def test_index_writes_into_a_memmapped_buffer_reach_the_files(tmp_path, one_value):
    buf = _buffer(tmp_path, one_value)
    ref = ["x"] * 6
    writes = [
        (torch.tensor([4, 5, 0]), ["a", "b", "c"]),  # wrap-around, as a ring buffer writes
        (slice(1, 3), ["d", "e"]),
        (torch.tensor([True, False, True, False, False, False]), ["f", "g"]),
        (3, "h"),
    ]
    for index, tags in writes:
        batch_size = [] if isinstance(index, int) else [len(tags)]
        obs = torch.ones(*batch_size, 2)
        buf[index] = TensorDict({"obs": obs, "tag": tags, "next": {"info": tags}}, batch_size)
        positions = torch.arange(6)[index].reshape(-1).tolist()
        for position, tag in zip(positions, tags if batch_size else [tags]):
            ref[position] = tag
        assert _strings(buf) == (ref, ref)
        assert _strings(TensorDict.load_memmap(tmp_path)) == (ref, ref)


def test_in_place_methods_of_a_memmapped_buffer_reach_the_files(tmp_path):
    buf = _buffer(tmp_path)
    steps = [
        (lambda: buf.set_("tag", "q"), ["q"] * 6),
        (lambda: buf.update_({"tag": list("abcdef")}), list("abcdef")),
        (lambda: buf.set_at_("tag", "z", 2), list("abzdef")),
        (lambda: buf.update_at_({"tag": "y", "obs": torch.ones(2)}, 5), list("abzdey")),
        (
            lambda: buf.copy_(
                TensorDict({"obs": torch.ones(6, 2), "tag": "k", "next": {"info": "k"}}, [6])
            ),
            ["k"] * 6,
        ),
    ]
    for step, expected in steps:
        step()
        for td in (buf, TensorDict.load_memmap(tmp_path)):
            tags = td["tag"]
            assert (list(tags) if isinstance(tags, list) else [tags] * 6) == expected


def test_a_failed_in_place_write_leaves_the_files_alone(tmp_path):
    buf = _buffer(tmp_path)
    with pytest.raises((ValueError, RuntimeError)):  # the second entry does not fit
        buf.update_({"tag": "new", "obs": torch.ones(6, 3)})
    assert list(buf["tag"]) == ["x"] * 6
    assert list(TensorDict.load_memmap(tmp_path)["tag"]) == ["x"] * 6
