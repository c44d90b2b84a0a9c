"""The persistence examples of tensordict's documentation, with the import changed to tdfunc."""

from __future__ import annotations

import tempfile
import textwrap

import pytest
import torch
from torch import nn

from tdfunc import MemoryMappedTensor, TensorDict, tensorclass


def test_readme_parameter_serialization(tmp_path):
    """README: save a model's parameters, load them all or one sub-module's, load them back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 3))
    reference = {k: v.detach().clone() for k, v in model.state_dict().items()}
    path = str(tmp_path / "saved" / "folder")
    params = TensorDict.from_module(model)
    params.memmap(path, num_threads=16)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    params = TensorDict.load_memmap(path, num_threads=16)
    params.to_module(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in reference.items())
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())
    params["0"].to_module(model[0])
    params0 = TensorDict.load_memmap(path + "/0", num_threads=16)
    assert sorted(params0.keys()) == ["bias", "weight"]
    params0.to_module(model[0])
    assert torch.equal(model[0].weight, reference["0.weight"])
    x = torch.randn(5, 3)
    expected = (x @ reference["0.weight"].T + reference["0.bias"]) @ reference[
        "1.weight"
    ].T + reference["1.bias"]
    torch.testing.assert_close(model(x), expected)


def test_004_transformer_weights_round_trip(tmp_path):
    """Saving tutorial: ``weights.memmap(path, num_threads=32)``, ``load_memmap``; equal weights."""
    model = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32)
    weights = TensorDict.from_module(model)
    weights_disk = weights.memmap(tmp_path, num_threads=32)
    new_weights = TensorDict.load_memmap(tmp_path)
    assert (weights_disk == new_weights).all()
    for name, tensor in model.state_dict().items():
        assert torch.equal(new_weights.get(tuple(name.split("."))), tensor)


def test_004_nested_types_directory_example():
    """Saving tutorial: a stack of TensorDicts and a tensorclass inside a TensorDict round-trip."""
    td_list = [TensorDict({"item": i}, batch_size=[]) for i in range(4)]

    @tensorclass
    class MyClass:
        data: torch.Tensor
        metadata: str

    tc = MyClass(torch.randn(3), metadata="some text", batch_size=[])
    data = TensorDict({"td_list": torch.stack(td_list), "tensorclass": tc}, [])
    with tempfile.TemporaryDirectory() as tempdir:
        data.memmap_(tempdir)
        loaded_data = TensorDict.load_memmap(tempdir)
        assert (loaded_data == data).all()
        assert type(loaded_data["tensorclass"]) is MyClass
        assert loaded_data["tensorclass"].metadata == "some text"
        assert loaded_data["td_list", "item"].tolist() == [0, 1, 2, 3]


def test_004_existing_memmap_tensors():
    """Saving tutorial: memmap twice, no prefix, shares tensors; another needs copy_existing."""
    td = TensorDict({"a": 1}, [])
    td0 = td.memmap()
    td1 = td0.memmap()
    assert td0["a"] is td1["a"]
    with tempfile.TemporaryDirectory() as tmpdir_0:
        td0 = td.memmap(tmpdir_0)
        td0 = td.memmap(tmpdir_0)  # works, results are just overwritten
        with tempfile.TemporaryDirectory() as tmpdir_1:
            # The documentation runs this line without copy_existing, but its text (and the
            # tensordict library) make it an error: the data would be duplicated.
            with pytest.raises(RuntimeError, match="copy_existing=True"):
                td0.memmap(tmpdir_1)
            td0.memmap(tmpdir_1, copy_existing=True)
            td_load = TensorDict.load_memmap(tmpdir_1)  # works!
            assert (td_load == td).all()
        with tempfile.TemporaryDirectory() as tmpdir_1:
            with pytest.raises(FileNotFoundError, match=r"meta\.json"):
                TensorDict.load_memmap(tmpdir_1)  # breaks!


def test_004_memmap_like_dataset(tmp_path):
    """Saving tutorial, TensorClass page: preallocate from an expanded datum, fill, read back."""

    def make_datum():
        return TensorDict({"image": torch.randint(255, (3, 64, 64)), "label": 0}, batch_size=[])

    dataset_size = 1_000_000
    datum = make_datum()
    data = datum.expand(dataset_size)
    data_disk = data.memmap_like(tmp_path / "data")
    del data
    assert type(data_disk["image"]) is MemoryMappedTensor
    assert data_disk.shape == (dataset_size,) and data_disk["image"].shape[1:] == (3, 64, 64)
    data_disk[123] = datum
    assert torch.equal(TensorDict.load_memmap(tmp_path / "data")[123]["image"], datum["image"])


def test_000_memmap_like_docstring_example(tmp_path):
    td = TensorDict(
        {
            "a": torch.zeros((3, 64, 64), dtype=torch.uint8),
            "b": torch.zeros(1, dtype=torch.int64),
        },
        batch_size=[],
    ).expand(1_000_000)
    buffer = td.memmap_like(str(tmp_path / "dataset"))
    assert buffer["a"].shape == (1_000_000, 3, 64, 64) and buffer.is_locked


def test_000_load_memmap_fromkeys_and_nested(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    td = TensorDict.fromkeys(["a", "b", "c", ("nested", "e")], 0)
    td.memmap("./saved_td")
    td_load = TensorDict.load_memmap("./saved_td")
    assert (td == td_load).all()
    nested = TensorDict.load_memmap("./saved_td/nested")
    assert nested["e"] == 0


SEED_003_OUTPUT = """\
meta: TensorDict(
    fields={
        a: Tensor(shape=torch.Size([]), device=meta, dtype=torch.float32, is_shared=False),
        b: TensorDict(
            fields={
                c: Tensor(shape=torch.Size([]), device=meta, dtype=torch.float32, is_shared=False)},
            batch_size=torch.Size([]),
            device=meta,
            is_shared=False)},
    batch_size=torch.Size([]),
    device=meta,
    is_shared=False)
fake: TensorDict(
    fields={
        a: FakeTensor(shape=torch.Size([]), device=cpu, dtype=torch.float32, is_shared=False),
        b: TensorDict(
            fields={
                c: FakeTensor(shape=torch.Size([]), device=cpu, dtype=torch.float32, <SHARED>
            batch_size=torch.Size([]),
            device=cpu,
            is_shared=False)},
    batch_size=torch.Size([]),
    device=cpu,
    is_shared=False)
""".replace("<SHARED>\n", "is_shared=False)},\n")  # keeps the documentation's 103-character line


def test_003_meta_and_fake_loading_prints_as_documented(capsys):
    td = TensorDict({"a": torch.zeros(()), "b": {"c": torch.zeros(())}})
    with tempfile.TemporaryDirectory() as path:
        td.save(path)
        td_load = TensorDict.load_memmap(path, device="meta")
        print("meta:", td_load)
        from torch._subclasses import FakeTensorMode

        with FakeTensorMode():
            td_load = TensorDict.load_memmap(path)
            print("fake:", td_load)
    assert capsys.readouterr().out == textwrap.dedent(SEED_003_OUTPUT)
