"""In-place writes (locked, memory-mapped, consolidated, ``set_``, ``update_``, ``apply_``)
pass the same batch-size check as ``set``: a scalar or one row never fills every row."""

from __future__ import annotations

import pytest
import torch

from tdfunc import TensorDict

BAD = [torch.tensor(5.0), torch.ones(2), torch.ones(1, 2)]


def _plain() -> TensorDict:
    return TensorDict({"a": torch.zeros(3, 2), "n": {"b": torch.zeros(3, 2)}}, [3])


def _containers(tmp_path):
    return {
        "unlocked": _plain(),
        "locked": _plain().lock_(),
        "memmap": _plain().memmap(tmp_path / "m"),
        "consolidated": _plain().consolidate(),
        "consolidated file": _plain().consolidate(tmp_path / "c.bin"),
    }


def _error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("value", BAD, ids=lambda v: str(list(v.shape)))
@pytest.mark.parametrize("key", ["a", ("n", "b")])
def test_every_container_refuses_what_set_refuses_with_the_same_error(tmp_path, value, key):
    expected = _error(lambda: _plain().set(key, value))
    for kind, td in _containers(tmp_path).items():
        before = td[key].clone()
        assert _error(lambda td=td: td.__setitem__(key, value)) == expected, kind
        assert torch.equal(td[key], before), kind  # nothing broadcast into the rows


def test_the_file_of_a_memmap_is_untouched_by_a_refused_write(tmp_path):
    m = _plain().memmap(tmp_path / "m")
    with pytest.raises(ValueError, match=r"shape \[\], which does not start with the batch"):
        m["a"] = torch.tensor(5.0)
    assert torch.equal(TensorDict.load_memmap(tmp_path / "m")["a"], torch.zeros(3, 2))
    with pytest.raises(RuntimeError, match="Cannot modify locked TensorDict"):
        m["a"] = torch.ones(3, 2)  # replacing the memory-mapped tensor is refused
    m.set_("a", torch.ones(3, 2))  # a right-shaped value is written into the file
    assert torch.equal(TensorDict.load_memmap(tmp_path / "m")["a"], torch.ones(3, 2))


@pytest.mark.parametrize(
    "write",
    [
        lambda td, v: td.set_("a", v),
        lambda td, v: td.update_({"a": v}),
        lambda td, v: td.set("a", v, inplace=True),
        lambda td, v: td.update({"a": v}, inplace=True),
    ],
    ids=["set_", "update_", "set(inplace)", "update(inplace)"],
)
def test_explicit_inplace_writes_check_the_batch_size(write):
    for value in BAD:
        td = _plain()
        with pytest.raises(ValueError, match="does not start with the batch size"):
            write(td, value)
        assert torch.equal(td["a"], torch.zeros(3, 2))
    td = _plain()
    write(td, torch.ones(3, 1))  # feature dims broadcast, as copy_ does
    assert torch.equal(td["a"], torch.ones(3, 2))


def test_apply_inplace_refuses_a_result_without_the_batch_dims(tmp_path):
    m = _plain().memmap(tmp_path / "m")
    with pytest.raises(ValueError, match="apply_: the value at key 'a' has shape"):
        m.apply_(lambda x: x.sum())
    assert torch.equal(m["a"], torch.zeros(3, 2))
    m.apply_(lambda x: x + 1)
    assert torch.equal(TensorDict.load_memmap(tmp_path / "m")["a"], torch.ones(3, 2))


def test_consolidate_refuses_an_existing_file_unless_existsok(tmp_path):
    path = tmp_path / "c.bin"
    path.write_bytes(b"keep me")
    with pytest.raises(FileExistsError, match="already exists; pass existsok=True"):
        _plain().consolidate(filename=path)
    assert path.read_bytes() == b"keep me"
    old = TensorDict({"a": torch.ones(3, 2)}, [3]).consolidate(filename=tmp_path / "d.bin")
    new = _plain().consolidate(filename=tmp_path / "d.bin", existsok=True)
    assert torch.equal(new["a"], torch.zeros(3, 2))
    assert torch.equal(old["a"], torch.ones(3, 2))  # replaced, not written through
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.bin", "d.bin"]


def test_a_batch_mismatch_is_caught_as_tensordict_catches_it():
    # tensordict raises RuntimeError; tdfunc's error is a ValueError too
    td = TensorDict({"y": torch.zeros(3, 4, 5)}, batch_size=[3, 4])
    writes = {
        "set": lambda: td.set("z", torch.ones(5)),
        "set inplace": lambda: td.set("y", torch.ones(5), inplace=True),
        "setitem": lambda: td.__setitem__("z", torch.ones(5)),
        "constructor": lambda: TensorDict({"a": torch.ones(5)}, [3]),
    }
    for name, write in writes.items():
        with pytest.raises(RuntimeError, match="does not start with the batch size") as caught:
            write()
        assert isinstance(caught.value, ValueError), name
