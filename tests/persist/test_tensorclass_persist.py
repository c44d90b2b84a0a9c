"""TensorClass persistence: memmap, memmap_, memmap_like, load_memmap, load, load_, save, ..."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import pytest
import torch

from tdfunc import TensorClass, TensorDict, tensorclass
from tdfunc._persist.memmap_tensor import MemoryMappedTensor


class Record(TensorClass):
    obs: torch.Tensor
    reward: torch.Tensor
    note: str = "hello"
    extra: Any = None


class FrozenRecord(TensorClass["frozen"]):
    obs: torch.Tensor


def make(seed: int = 0) -> Record:
    generator = torch.Generator().manual_seed(seed)
    return Record(
        torch.randn(4, 3, generator=generator), torch.randn(4, generator=generator), batch_size=[4]
    )


def assert_same(loaded: Record, source: Record) -> None:
    assert type(loaded) is Record and loaded.batch_size == source.batch_size
    assert torch.equal(loaded.obs, source.obs) and torch.equal(loaded.reward, source.reward)
    assert loaded.note == source.note and loaded.extra is None


def test_memmap_and_load_back_as_the_class(tmp_path):
    source = make()
    saved = source.memmap(tmp_path)
    assert type(saved) is Record and saved.is_locked
    assert isinstance(saved.obs, MemoryMappedTensor) and saved.saved_path == str(tmp_path)
    assert_same(saved, source)
    assert_same(Record.load_memmap(tmp_path), source)
    assert_same(TensorDict.load_memmap(tmp_path), source)  # the class is recorded on disk
    assert_same(Record.load(tmp_path), source)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert "Record" in json.dumps(meta)


def test_save_and_dumps_are_memmap(tmp_path):
    source = make(1)
    for api, path in (("save", tmp_path / "a"), ("dumps", tmp_path / "b")):
        out = getattr(source, api)(path)
        assert type(out) is Record
        assert_same(Record.load_memmap(path), source)


def test_memmap_in_place(tmp_path):
    record = make(2)
    expected = record.clone()
    assert record.memmap_(tmp_path) is record
    assert isinstance(record.obs, MemoryMappedTensor)
    record.obs[0] = 7.0
    expected.obs[0] = 7.0
    assert_same(Record.load_memmap(tmp_path), expected)


def test_memmap_like_and_load_in_place(tmp_path):
    template = make(3)
    empty = template.memmap_like(tmp_path / "like")
    assert type(empty) is Record and torch.equal(empty.obs, torch.zeros(4, 3))
    source = make(4)
    source.memmap(tmp_path / "src")
    target = make(5)
    assert target.load_(tmp_path / "src") is target
    assert_same(target, source)
    target2 = make(6)
    target2.load_memmap_(tmp_path / "src")
    assert_same(target2, source)


def test_memmap_refresh(tmp_path):
    first = make(7).memmap(tmp_path)
    second = make(8)
    second.memmap(tmp_path)
    assert first.memmap_refresh_() is first
    assert_same(first, second)
    with pytest.raises(RuntimeError, match="no saved path"):
        make(9).memmap_refresh_()


def test_frozen_instances_save_but_refuse_in_place_loading(tmp_path):
    frozen = FrozenRecord(torch.arange(6.0).reshape(2, 3), batch_size=[2])
    saved = frozen.memmap(tmp_path)
    assert type(saved) is FrozenRecord and torch.equal(saved.obs, frozen.obs)
    loaded = FrozenRecord.load_memmap(tmp_path)
    assert type(loaded) is FrozenRecord
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.obs = torch.zeros(2, 3)
    for write in (
        lambda: frozen.memmap_(tmp_path / "x"),
        lambda: frozen.load_(tmp_path),
        lambda: saved.memmap_refresh_(),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            write()


def test_tensordict_saved_data_loads_into_a_class(tmp_path):
    td = TensorDict({"obs": torch.ones(2, 3), "reward": torch.zeros(2)}, [2])
    td.memmap(tmp_path)
    loaded = Record.load_memmap(tmp_path)
    assert type(loaded) is Record and torch.equal(loaded.obs, torch.ones(2, 3))
    assert loaded.note == "hello"  # missing fields get their defaults


def test_seed_nested_layout_example(tmp_path):
    td_list = [TensorDict({"item": i}, batch_size=[]) for i in range(4)]

    @tensorclass
    class MyClass:
        data: torch.Tensor
        metadata: str

    tc = MyClass(torch.randn(3), metadata="some text", batch_size=[])
    data = TensorDict({"td_list": torch.stack(td_list), "tensorclass": tc}, [])
    data.memmap_(tmp_path)
    loaded = TensorDict.load_memmap(tmp_path)
    assert (loaded == data).all()
    assert type(loaded["tensorclass"]) is MyClass
    assert loaded["tensorclass"].metadata == "some text"
    assert os.path.isdir(tmp_path / "tensorclass")
