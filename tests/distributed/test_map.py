"""TensorDict.map over worker processes, against plain-tensor references.

Worker functions live at module level so that "spawn" workers can import them.
Most tests use the platform's default start method (fork on Linux: fast); one
runs the "spawn" path.
"""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as torch_mp

from tdfunc import TensorClass, TensorDict
from tdfunc._distributed.map import td_map


# ---------------------------------------------------------------- worker functions
def process_data(data):
    """The documented example, verbatim."""
    images = data.get("images").flip(-2).clone()
    labels = data.get("labels") // 10
    # we update the td inplace
    data.set_("images", images)  # flip image
    data.set_("labels", labels)  # cluster labels


def summarise(data):
    return TensorDict(
        {
            "mean": data.get("images").float().mean(dim=(-3, -2, -1)),
            ("meta", "label"): data.get("labels") + 1,
        },
        data.batch_size,
    )


def double_or_none(data):
    if data.get("labels").sum() % 2 == 0:
        return None  # in-place edit: this chunk contributes itself
    data.set_("labels", data.get("labels") * 2)
    return data.clone()


def doubled(data):
    return data.apply(lambda t: t * 2)


def fails_on_label_13(data):
    if (data.get("labels") == 13).any():
        raise ValueError("label 13 is cursed")


def returns_an_int(data):
    return 3


def dies(data):
    os._exit(3)


def column_sums(data):
    return TensorDict({"s": data.get("x").sum(-1)}, data.batch_size)


class Frame(TensorClass):
    pixels: torch.Tensor
    label: torch.Tensor


def brighten(frame):
    frame.pixels.add_(1)


# ---------------------------------------------------------------- data
def _dataset(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 100, (n,), generator=g)
    return images, labels


def _td(images: torch.Tensor, labels: torch.Tensor) -> TensorDict:
    return TensorDict({"images": images.clone(), "labels": labels.clone()}, [len(labels)])


# ---------------------------------------------------------------- tests
def test_seed_example_one_item_at_a_time_in_place(capsys):
    images, labels = _dataset()
    data = _td(images, labels)
    data_preproc = data.map(process_data, num_workers=2, chunksize=0, pbar=True)
    assert data_preproc is data  # fn returned None: the shared data was edited in place
    assert data.is_shared()
    assert torch.equal(data["images"], images.flip(-2))
    assert torch.equal(data["labels"], labels // 10)
    progress = capsys.readouterr().err
    assert "TensorDict.map" in progress and "64/64" in progress


def _mapped_copy(tensor: torch.Tensor, path) -> torch.Tensor:
    """A copy of ``tensor`` in a file-backed (memory-mapped) storage, made without tdfunc."""
    nbytes = tensor.numel() * tensor.element_size()
    storage = torch.UntypedStorage.from_file(str(path), shared=True, nbytes=nbytes)
    mapped = torch.empty(0, dtype=tensor.dtype).set_(storage, 0, tensor.shape, tensor.stride())
    return mapped.copy_(tensor)


def _on_disk(path, like: torch.Tensor) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(path.read_bytes()), dtype=like.dtype)
    return raw[: like.numel()].view(like.shape)


def test_spawn_workers_get_shared_and_memory_mapped_leaves(tmp_path):
    images, labels = _dataset(24, seed=1)
    data = TensorDict({"images": images.clone()}, [24]).memmap_(tmp_path / "data").unlock_()
    data.set("labels", labels.clone())  # a plain leaf: moved to shared memory
    path = data["images"].filename
    out = data.map(flip_and_summarise, num_workers=2, num_chunks=3, mp_start_method="spawn")
    # returned TensorDicts are concatenated
    assert out.batch_size == torch.Size([24])
    assert torch.allclose(out["mean"], images.float().mean(dim=(1, 2, 3)))
    assert torch.equal(out["meta", "label"], labels // 10 + 1)
    # in-place writes reached the file (mapped again by name) and the shared labels
    assert data["images"].untyped_storage().filename == path
    assert torch.equal(_on_disk(Path(path), images), images.flip(-2))
    assert torch.equal(data["labels"], labels // 10)


def flip_and_summarise(data):
    process_data(data)
    return summarise(data)


@pytest.mark.parametrize("chunksize", [0, 5])
def test_returned_tensordicts_are_stacked_or_concatenated(chunksize):
    images, labels = _dataset(23, seed=2)
    out = _td(images, labels).map(summarise if chunksize else _item_summary, 0, 2, chunksize)
    expected_mean = images.float().mean(dim=(1, 2, 3))
    assert out.batch_size == torch.Size([23])
    assert torch.allclose(out["mean"], expected_mean)
    assert torch.equal(out["meta", "label"], labels + 1)


def _item_summary(item):
    assert item.batch_size == torch.Size([])  # chunksize=0: the item, dim removed
    return summarise(item)


def test_chunks_returning_none_contribute_themselves():
    images, labels = _dataset(30, seed=3)
    data = _td(images, labels)
    out = data.map(double_or_none, num_workers=2, chunksize=4)
    expected = []
    for start in range(0, 30, 4):  # reference: the same rule in a Python loop
        chunk = labels[start : start + 4]
        expected.append(chunk if chunk.sum() % 2 == 0 else chunk * 2)
    assert torch.equal(out["labels"], torch.cat(expected))
    assert torch.equal(out["images"], images)


def test_map_over_a_later_batch_dim():
    x = torch.randn(3, 10, 4)
    out = TensorDict({"x": x.clone()}, [3, 10]).map(column_sums, dim=1, num_workers=2, num_chunks=4)
    assert out.batch_size == torch.Size([3, 10])
    assert torch.allclose(out["s"], x.sum(-1))


def test_worker_exception_surfaces_with_remote_traceback():
    images, labels = _dataset(16, seed=4)
    labels[9] = 13
    with pytest.raises(RuntimeError) as info:
        _td(images, labels).map(fails_on_label_13, num_workers=2, chunksize=0)
    message = str(info.value)
    assert "ValueError: label 13 is cursed" in message
    assert "on item 9 along dim 0" in message
    assert "Worker traceback" in message and "in fails_on_label_13" in message


def test_bad_return_type_and_dead_worker():
    images, labels = _dataset(8, seed=5)
    with pytest.raises(TypeError, match=r"fn must return None .* got int"):
        _td(images, labels).map(returns_an_int, num_workers=2)
    with pytest.raises(RuntimeError, match="a worker process died"):
        _td(images, labels).map(dies, num_workers=1)


def test_memory_mapped_leaves_in_a_caller_pool(tmp_path):
    images, labels = _dataset(12, seed=6)
    path = tmp_path / "images.bin"
    data = TensorDict({"images": _mapped_copy(images, path), "labels": labels.clone()}, [12])
    with torch_mp.get_context().Pool(2) as pool:  # chunks are pickled with every task
        assert data.map(process_data, chunksize=5, pool=pool) is data
    assert data["images"].untyped_storage().filename == str(path)  # not moved to shm
    assert torch.equal(_on_disk(path, images), images.flip(-2))
    assert torch.equal(data["labels"], labels // 10)


def test_tensorclass_chunks():
    pixels = torch.randn(10, 2, 2)
    frames = Frame(pixels=pixels.clone(), label=torch.arange(10), batch_size=[10])
    holder = TensorDict({"frames": frames}, [10])
    holder.map(_brighten_nested, num_workers=2, num_chunks=2)
    assert torch.allclose(holder["frames"].pixels, pixels + 1)


def test_tensorclass_at_the_top():
    pixels = torch.randn(10, 2, 2)
    frames = Frame(pixels=pixels.clone(), label=torch.arange(10), batch_size=[10])
    if hasattr(frames, "map"):
        out = frames.map(brighten, num_workers=2, chunksize=0)
    else:  # until TensorClass forwards map: the implementation takes any container
        out = td_map(frames, brighten, num_workers=2, chunksize=0)
    assert out is frames
    assert torch.allclose(frames.pixels, pixels + 1)


def _brighten_nested(chunk):
    assert isinstance(chunk["frames"], Frame)
    brighten(chunk["frames"])


def test_caller_provided_pools():
    images, labels = _dataset(20, seed=7)
    context = torch_mp.get_context()
    with context.Pool(2) as pool:
        data = _td(images, labels)
        assert data.map(process_data, chunksize=6, pool=pool) is data
        assert torch.equal(data["images"], images.flip(-2))
        labels[14] = 13
        with pytest.raises(RuntimeError, match="on item 14 along dim 0"):
            _td(images, labels).map(fails_on_label_13, chunksize=0, pool=pool)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as executor:
        out = _td(images, labels).map(summarise, chunksize=7, pool=executor)
        assert torch.equal(out["meta", "label"], labels + 1)


def test_unpicklable_fn_with_spawn_is_a_clear_error():
    td = TensorDict({"a": torch.zeros(8)}, [8])
    with pytest.raises(TypeError, match="fn must be picklable: define it at module level"):
        td.map(lambda data: None, num_workers=2, mp_start_method="spawn")


def test_argument_errors_and_empty_batch():
    td = TensorDict({"a": torch.zeros(4, 2)}, [4])
    with pytest.raises(ValueError, match="chunksize or num_chunks, not both"):
        td.map(process_data, chunksize=1, num_chunks=2)
    with pytest.raises(ValueError, match="chunksize must be an int >= 0"):
        td.map(process_data, chunksize=-1)
    with pytest.raises(ValueError, match=r"dim must be a batch dim in \[-1, 1\)"):
        td.map(process_data, dim=1)
    with pytest.raises(TypeError, match="fn must be callable"):
        td.map("process_data")
    with pytest.raises(TypeError, match="pool must be a multiprocessing Pool"):
        td.map(process_data, pool=object())
    empty = TensorDict({"a": torch.zeros(0, 2)}, [0])
    assert empty.map(returns_an_int) is empty  # nothing to do: no pool is started


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("chunksize", [0, None])
def test_the_mapped_dim_keeps_its_name(dim, chunksize):
    # one item at a time stacks the outputs: the new dim is the mapped one, as in the
    # concatenation of chunks
    values = torch.arange(24.0).reshape(4, 3, 2)
    data = TensorDict({"x": values.clone()}, [4, 3], names=["sample", "time"])
    out = data.map(doubled, dim=dim, num_workers=2, chunksize=chunksize)
    assert out.names == ["sample", "time"]
    assert torch.equal(out["x"], values * 2)
