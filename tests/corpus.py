"""A shared corpus of containers for round-trip style tests.

Every builder returns a fresh object (new tensors, deterministic values) so a
test may mutate what it gets. ``raw_*`` builders return the plain-Python
description ``(nested dict, batch_size)``; the matching builder without the
prefix returns it as a ``TensorDict``. ``CORPUS`` maps a name to each
TensorDict builder, for ``pytest.mark.parametrize``.

Helpers here never use tdfunc to compute a reference: :func:`plain_leaves`
walks the raw dict.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tdfunc import NonTensorData, TensorClass, TensorDict


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- raw builders
def raw_empty() -> tuple[dict, list[int]]:
    """No keys, no batch dims."""
    return {}, []


def raw_empty_batched() -> tuple[dict, list[int]]:
    """No keys, batch dims [3, 2]."""
    return {}, [3, 2]


def raw_flat_0d() -> tuple[dict, list[int]]:
    """Batch size [] (every dim is a feature dim)."""
    g = _gen(0)
    return {"x": torch.randn(4, generator=g), "y": torch.randint(0, 9, (2, 3), generator=g)}, []


def raw_flat_1d() -> tuple[dict, list[int]]:
    """One batch dim; float, int and bool leaves."""
    g = _gen(1)
    return {
        "obs": torch.randn(5, 3, generator=g),
        "action": torch.randint(0, 4, (5,), generator=g),
        "done": torch.rand(5, generator=g) > 0.5,
    }, [5]


def raw_nested_2d() -> tuple[dict, list[int]]:
    """Two batch dims, two levels of nesting, one nested dict with a longer batch."""
    g = _gen(2)
    return {
        "a": torch.randn(4, 3, 2, generator=g),
        "b": {
            "c": torch.randn(4, 3, generator=g),
            "d": {"e": torch.arange(4 * 3 * 5, dtype=torch.float64).reshape(4, 3, 5)},
        },
    }, [4, 3]


def raw_non_contiguous() -> tuple[dict, list[int]]:
    """Leaves that are transposed, strided or expanded views."""
    g = _gen(3)
    return {
        "t": torch.randn(2, 4, 3, generator=g).transpose(0, 1),  # (4, 2, 3)
        "s": torch.randn(8, 2, generator=g)[::2],  # (4, 2)
        "e": torch.randn(1, 2, 5, generator=g).expand(4, 2, 5),
    }, [4, 2]


def raw_non_tensor() -> tuple[dict, list[int]]:
    """Tensor leaves beside Python values (kept as NonTensorData)."""
    g = _gen(4)
    return {
        "x": torch.randn(3, 2, generator=g),
        "name": "a string!",
        "meta": {"tag": "nested", "y": torch.ones(3, dtype=torch.int32)},
    }, [3]


def raw_zero_batch() -> tuple[dict, list[int]]:
    """A batch dim of size 0."""
    return {"x": torch.zeros(0, 3), "n": {"y": torch.zeros(0)}}, [0]


RAW: dict[str, Callable[[], tuple[dict, list[int]]]] = {
    "empty": raw_empty,
    "empty_batched": raw_empty_batched,
    "flat_0d": raw_flat_0d,
    "flat_1d": raw_flat_1d,
    "nested_2d": raw_nested_2d,
    "non_contiguous": raw_non_contiguous,
    "non_tensor": raw_non_tensor,
    "zero_batch": raw_zero_batch,
}


def _build(raw: tuple[dict, list[int]]) -> TensorDict:
    source, batch_size = raw
    return TensorDict(source, batch_size=batch_size)


# ---------------------------------------------------------------- TensorDict builders
def empty() -> TensorDict:
    return _build(raw_empty())


def empty_batched() -> TensorDict:
    return _build(raw_empty_batched())


def flat_0d() -> TensorDict:
    return _build(raw_flat_0d())


def flat_1d() -> TensorDict:
    return _build(raw_flat_1d())


def nested_2d() -> TensorDict:
    """Batch [4, 3]; ``("b", "d")`` has batch [4, 3, 5]."""
    source, batch_size = raw_nested_2d()
    td = TensorDict(source, batch_size=batch_size)
    td["b"]["d"].batch_size = [4, 3, 5]
    return td


def non_contiguous() -> TensorDict:
    return _build(raw_non_contiguous())


def non_tensor() -> TensorDict:
    return _build(raw_non_tensor())


def zero_batch() -> TensorDict:
    return _build(raw_zero_batch())


def named() -> TensorDict:
    """Batch [2, 3] with dim names."""
    g = _gen(5)
    return TensorDict(
        {"x": torch.randn(2, 3, 4, generator=g), "n": {"y": torch.randn(2, 3, generator=g)}},
        batch_size=[2, 3],
        names=["env", "time"],
    )


CORPUS: dict[str, Callable[[], TensorDict]] = {
    "empty": empty,
    "empty_batched": empty_batched,
    "flat_0d": flat_0d,
    "flat_1d": flat_1d,
    "nested_2d": nested_2d,
    "non_contiguous": non_contiguous,
    "non_tensor": non_tensor,
    "zero_batch": zero_batch,
    "named": named,
}

BATCHED = [name for name in CORPUS if name not in ("empty", "flat_0d")]


# ---------------------------------------------------------------- TensorClass
class Sample(TensorClass):
    """The corpus TensorClass: tensor fields, a nested TensorDict, a non-tensor field."""

    obs: torch.Tensor
    reward: torch.Tensor
    extra: TensorDict
    label: str = "train"


def raw_sample() -> tuple[dict, list[int]]:
    """The fields of :func:`sample` as a plain dict (batch [4, 3], float leaves)."""
    g = _gen(6)
    return {
        "obs": torch.randn(4, 3, 2, generator=g),
        "reward": torch.randn(4, 3, generator=g),
        "extra": {"value": torch.randn(4, 3, 5, generator=g)},
        "label": "train",
    }, [4, 3]


def sample() -> Sample:
    """A :class:`Sample` built from :func:`raw_sample`."""
    raw, batch_size = raw_sample()
    extra = TensorDict(raw["extra"], batch_size)
    return Sample(raw["obs"], raw["reward"], extra, raw["label"], batch_size=batch_size)


# ---------------------------------------------------------------- references
def plain_leaves(source: dict, prefix: tuple = ()) -> dict[tuple, object]:
    """``{key path: value}`` for every leaf of a plain nested dict (no tdfunc)."""
    out: dict[tuple, object] = {}
    for key, value in source.items():
        if isinstance(value, dict):
            out.update(plain_leaves(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def leaves_of(td) -> dict[tuple, object]:
    """``{key path: stored value}`` of a TensorDict, read through its public API."""
    out: dict[tuple, object] = {}
    # non-tensor data too: tensordict's default is_leaf leaves it out
    is_leaf = lambda cls: not getattr(cls, "_is_tensor_collection", False)  # noqa: E731
    for key in td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf):
        path = key if isinstance(key, tuple) else (key,)
        out[path] = td.get(key)
    return out


def assert_same_leaves(td, expected: dict[tuple, object]) -> None:
    """``td`` holds exactly ``expected`` (tensors compared exactly, with dtype)."""
    got = leaves_of(td)
    assert set(got) == set(expected), (sorted(got), sorted(expected))
    for path, want in expected.items():
        have = got[path]
        if isinstance(want, torch.Tensor):
            assert isinstance(have, torch.Tensor), path
            assert have.dtype == want.dtype, path
            assert have.shape == want.shape, (path, have.shape, want.shape)
            assert torch.equal(have, want), path
        elif isinstance(want, NonTensorData):
            assert have == want.data, path
        else:
            assert have == want, path
