"""Shared fixtures for the benchmarks.

Every benchmark times one implementation of one operation; the three
implementations of an operation (tdfunc, the plain-PyTorch baseline and, when
installed, the ``tensordict`` library) share a ``group`` so that the ratio of
their medians can be read from one run::

    .venv-bench/bin/python -m pytest benchmarks/bench_container.py --benchmark-enable -q

``tensordict`` is imported only inside the fixture that needs it
(:func:`import_tensordict`): importing it patches ``torch._functorch.vmap`` for
the whole process. Its benchmarks time it in this process, so they run only where
it is installed (``pip install -c constraints.txt -e ".[bench]"``); elsewhere they
are deselected, and one line at the end of the run says how many and what to install
(rather than one skip line per benchmark).

Importing this file pins glibc's allocator (:func:`pin_allocator`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import platform

import pytest
import torch


def pin_allocator() -> None:
    """Keep freed memory in the process (glibc only; a no-op elsewhere).

    Benchmarks allocate on every call. By default glibc serves big buffers with
    ``mmap`` and returns freed memory to the OS, so a timed call can pay for page
    faults on fresh pages that the previous call just released; whether it does
    depends on the allocator's history, not on the code being measured. Big
    buffers come from the heap and the heap is never trimmed, so that every
    call after the warm-up reuses memory that is already mapped.
    """
    if platform.libc_ver()[0] != "glibc":
        return
    mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: no mmap below 1 GiB
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed memory


pin_allocator()  # at import: every benchmark process, before the first allocation is timed

BATCH = (4, 6)


def nested_tensors(batch: tuple[int, ...] = BATCH, seed: int = 0) -> dict:
    """Three leaves, one of them nested: ``{"a": ., "b": {"c": ., "d": .}}``."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(*batch, 3, generator=generator),
        "b": {
            "c": torch.randn(*batch, 4, 5, generator=generator),
            "d": torch.randn(*batch, generator=generator),
        },
    }


@pytest.fixture
def one_thread():
    """Single-threaded kernels for the benchmark: its tensors are tiny, and on a shared
    machine the intra-op thread pool adds millisecond stalls that drown the Python
    overhead timed (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def batch() -> tuple[int, ...]:
    return BATCH


@pytest.fixture
def make_nested():
    """The builder :func:`nested_tensors` (benchmarks that need several trees)."""
    return nested_tensors


@pytest.fixture
def nested_dict() -> dict:
    """The baseline: plain nested dicts of tensors."""
    return nested_tensors()


@pytest.fixture
def nested_td():
    """The same data as a tdfunc ``TensorDict`` with batch size ``BATCH``."""
    from tdfunc import TensorDict

    return TensorDict(nested_tensors(), batch_size=BATCH)


TENSORDICT_REASON = (
    "times tensordict beside tdfunc in this process; to run them, install it "
    "(pip install -c constraints.txt -e '.[bench]') and pass --benchmark-enable"
)


def import_tensordict():
    """The ``tensordict`` module, or skip the benchmark with :data:`TENSORDICT_REASON`."""
    return pytest.importorskip("tensordict", reason=TENSORDICT_REASON)


_DESELECTED: list[str] = []


def pytest_collection_modifyitems(config, items):
    if importlib.util.find_spec("tensordict") is not None:
        return
    kept, dropped = [], []
    for item in items:
        needs = "tensordict_lib" in getattr(item, "fixturenames", ())
        (dropped if needs else kept).append(item)
    if dropped:
        items[:] = kept
        config.hook.pytest_deselected(items=dropped)
        _DESELECTED.extend(item.nodeid for item in dropped)


def pytest_terminal_summary(terminalreporter):
    if _DESELECTED:
        terminalreporter.write_line(
            f"{len(_DESELECTED)} benchmarks deselected, each {TENSORDICT_REASON}"
        )


@pytest.fixture
def tensordict_lib():
    """The ``tensordict`` module, or skip when it is not installed."""
    return import_tensordict()


@pytest.fixture
def nested_anchor(tensordict_lib):
    """The same data as a ``tensordict.TensorDict``."""
    return tensordict_lib.TensorDict(nested_tensors(), batch_size=BATCH)


def deep_tensors(batch: tuple[int, ...] = BATCH, seed: int = 0) -> dict:
    """One leaf at each depth 1 to 4: ``a``, ``b.c``, ``b.d.e``, ``b.d.f.g``."""
    generator = torch.Generator().manual_seed(seed)

    def leaf(*feature: int) -> torch.Tensor:
        return torch.randn(*batch, *feature, generator=generator)

    return {"a": leaf(3), "b": {"c": leaf(4), "d": {"e": leaf(), "f": {"g": leaf(2)}}}}


def module_parameters(seed: int = 0) -> dict:
    """The ``nn.Parameter`` objects of a three-layer MLP, nested as ``from_module`` nests them."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 1)
    )
    return {
        name: {"weight": layer.weight, "bias": layer.bias}
        for name, layer in model.named_children()
        if isinstance(layer, torch.nn.Linear)
    }


@pytest.fixture
def make_deep():
    """The builder :func:`deep_tensors`."""
    return deep_tensors


@pytest.fixture
def make_params():
    """The builder :func:`module_parameters`."""
    return module_parameters
