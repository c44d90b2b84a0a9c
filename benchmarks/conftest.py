"""Shared fixtures for the benchmarks.

Every benchmark times one implementation of one operation; the three
implementations of an operation (tdfunc, the plain-PyTorch baseline and, when
installed, the ``tensordict`` library) share a ``group`` so that the ratio of
their medians can be read from one run::

    .venv-bench/bin/python -m pytest benchmarks/bench_container.py --benchmark-enable -q

``tensordict`` is imported only inside the fixture that needs it (through
``pytest.importorskip``): importing it patches ``torch._functorch.vmap`` for
the whole process.
"""

from __future__ import annotations

import pytest
import torch

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


@pytest.fixture
def tensordict_lib():
    """The ``tensordict`` module, or skip when it is not installed."""
    return pytest.importorskip("tensordict")


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
