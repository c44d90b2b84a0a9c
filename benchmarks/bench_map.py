"""``TensorDict.map`` beside a hand-written process pool and ``tensordict``'s ``map``.

The preprocessing example of tensordict's README: flip 512 uint8 images (3x32x32) and cluster
their labels, in place, in chunks of 32, on 2 worker processes (fork). Every
implementation starts its own pool per call, as ``map`` does. The baseline is
what one writes with plain PyTorch: tensors in shared memory, a process pool
whose initializer receives them, tasks that carry index ranges.
Target (ratio of medians): tdfunc within 1.3x of the baseline, and not slower
than ``tensordict``.
"""

from __future__ import annotations

import concurrent.futures

import pytest
import torch
import torch.multiprocessing as torch_mp

from tdfunc import TensorDict

N, CHUNK, WORKERS, ROUNDS = 512, 32, 2, 5


def _data():
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (N, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 100, (N,), generator=generator)
    return images, labels


def process_data(data):
    data.set_("images", data.get("images").flip(-2).clone())
    data.set_("labels", data.get("labels") // 10)


def _check(images, labels, got_images, got_labels):
    assert torch.equal(got_images, images.flip(-2))
    assert torch.equal(got_labels, labels // 10)


@pytest.mark.benchmark(group="map-in-place")
def test_map_tdfunc(benchmark):
    images, labels = _data()

    def setup():
        return (TensorDict({"images": images.clone(), "labels": labels.clone()}, [N]),), {}

    def run(td):
        return td.map(process_data, num_workers=WORKERS, chunksize=CHUNK)

    out = benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    _check(images, labels, out["images"], out["labels"])


_SHARED: tuple = ()


def _init(images, labels):
    global _SHARED
    torch.set_num_threads(1)
    _SHARED = (images, labels)


def _chunk(bounds):
    start, stop = bounds
    images, labels = _SHARED
    images[start:stop] = images[start:stop].flip(-2).clone()
    labels[start:stop] = labels[start:stop] // 10


@pytest.mark.benchmark(group="map-in-place")
def test_map_baseline(benchmark):
    images, labels = _data()

    def setup():
        return (images.clone().share_memory_(), labels.clone().share_memory_()), {}

    def run(shared_images, shared_labels):
        with concurrent.futures.ProcessPoolExecutor(
            WORKERS,
            mp_context=torch_mp.get_context(),
            initializer=_init,
            initargs=(shared_images, shared_labels),
        ) as pool:
            list(pool.map(_chunk, [(s, min(s + CHUNK, N)) for s in range(0, N, CHUNK)]))
        return shared_images, shared_labels

    got_images, got_labels = benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    _check(images, labels, got_images, got_labels)


@pytest.mark.benchmark(group="map-in-place")
def test_map_tensordict(benchmark, tensordict_lib):
    tensordict = tensordict_lib
    images, labels = _data()

    def setup():
        td = tensordict.TensorDict({"images": images.clone(), "labels": labels.clone()}, [N])
        return (td,), {}

    def run(td):
        td.map(process_data, num_workers=WORKERS, chunksize=CHUNK)
        return td

    out = benchmark.pedantic(run, setup=setup, rounds=ROUNDS, iterations=1)
    _check(images, labels, out["images"], out["labels"])
