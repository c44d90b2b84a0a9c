"""Flatten and unflatten ask "is a fake mode on?" through the count of dispatch modes
first: no mode at all means no fake mode. Any mode, fake or not, must still be seen."""

import random

import pytest
import torch
import torch._dynamo.testing
import torch.utils._pytree as torch_pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from tdfunc import TensorClass, TensorDict


class _PassThrough(TorchDispatchMode):
    """A user's mode that runs every op as it is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _tree() -> TensorDict:
    return TensorDict({"a": torch.zeros(2, 3), "n": {"b": torch.ones(2)}}, batch_size=[2])


def test_a_user_mode_is_not_taken_for_a_fake_one():
    outside = torch_pytree.tree_structure(_tree()).context
    with _PassThrough():
        leaves, spec = torch_pytree.tree_flatten(_tree())
        inside = spec.context
        # the cached context is reused (no fake tensors), and the round trip is exact
        assert inside is outside
        out = torch_pytree.tree_unflatten([leaf * 2 for leaf in leaves], spec)
    assert out.batch_size == torch.Size([2])
    torch.testing.assert_close(out["a"], torch.zeros(2, 3))
    torch.testing.assert_close(out["n", "b"], torch.full((2,), 2.0))


def test_a_fake_mode_is_seen_by_flatten_and_unflatten():
    outside = torch_pytree.tree_structure(_tree()).context
    with FakeTensorMode() as mode:
        fake = TensorDict(
            {"a": mode.from_tensor(torch.zeros(2, 3)), "n": {"b": mode.from_tensor(torch.ones(2))}},
            batch_size=[2],
        )
        first = torch_pytree.tree_flatten(fake)
        second = torch_pytree.tree_flatten(fake)
        # under fake tensors no context is cached: each flatten builds its own
        assert first[1].context is not outside
        assert first[1].context is not second[1].context
        out = torch_pytree.tree_unflatten(*first)
    assert out.batch_size == torch.Size([2])
    assert out["n", "b"].shape == torch.Size([2])


class _Pair(TensorClass):
    x: torch.Tensor
    y: torch.Tensor


class _FrozenPair(TensorClass, frozen=True):
    x: torch.Tensor
    y: torch.Tensor


def test_tensorclass_rebuilds_hold_the_plain_tensordict_and_keep_frozen():
    for cls in (_Pair, _FrozenPair, _Pair):  # the first rebuild finds the plain class
        instance = cls(x=torch.zeros(3, 2), y=torch.ones(3), batch_size=[3])
        leaves, spec = torch_pytree.tree_flatten(instance)
        out = torch_pytree.tree_unflatten([leaf + 1 for leaf in leaves], spec)
        assert type(out) is cls
        assert type(out._to_tensordict_view()) is cls._plain_tensordict()
        assert out.batch_size == torch.Size([3])
        torch.testing.assert_close(out.x, torch.ones(3, 2))
        assert out.is_locked is (cls is _FrozenPair)
        with torch.no_grad():
            inside = torch.func.vmap(lambda p: p)(instance)
        assert type(inside) is cls and inside.batch_size == torch.Size([3])


def test_first_tensorclass_rebuild_may_happen_while_dynamo_traces(monkeypatch):
    import tdfunc._tensorclass.state as state

    # as in a fresh process: no rebuild has found the plain TensorDict's constructor yet
    monkeypatch.setattr(state, "_PLAIN_NEW", {})
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def double(pair: _Pair) -> _Pair:
        inner = torch_pytree.tree_map(lambda t: t * 2, pair)  # a rebuild inside the trace
        return inner.apply(lambda t: t + 1)

    for _ in range(3):
        pair = _Pair(x=torch.randn(3, 2), y=torch.randn(3), batch_size=[3])
        out = double(pair)
        assert type(out) is _Pair and out.batch_size == torch.Size([3])
        torch.testing.assert_close(out.x, pair.x * 2 + 1)
        torch.testing.assert_close(out.y, pair.y * 2 + 1)
    assert counter.frame_count == 1


def test_rebuilding_another_tensorclass_later_does_not_recompile():
    # a compiled function must not depend on which classes were rebuilt elsewhere
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounter()

    @torch.compile(backend=counter, fullgraph=True)
    def double(pair: _Pair) -> _Pair:
        return torch_pytree.tree_map(lambda t: t * 2, pair)

    class _Later(TensorClass):
        a: torch.Tensor

    for step in range(3):
        pair = _Pair(x=torch.randn(3, 2), y=torch.randn(3), batch_size=[3])
        torch.testing.assert_close(double(pair).x, pair.x * 2)
        if step == 0:  # an eager rebuild of a class the compiled code never saw
            later = _Later(a=torch.ones(2), batch_size=[2])
            assert torch_pytree.tree_map(lambda t: t + 1, later).a.sum() == 4
    assert counter.frame_count == 1


# ---------------------------------------------------------------- random trees
class _Cell(TensorClass):
    a: torch.Tensor
    tag: str
    sub: TensorDict


def _random_container(seed: int):
    """A container of 1-4 levels, batch rank 0-3, names, TensorClass levels, non-tensor
    entries and 1 to about 60 leaves."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    rank = rng.randint(0, 3)
    batch = tuple(rng.randint(1, 3) for _ in range(rank))

    def level(batch: tuple, depth: int):
        data: dict = {}
        for index in range(rng.randint(1, 5)):
            if depth < 3 and rng.random() < 0.3:
                extra = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 1)))
                data[f"k{index}"] = level(batch + extra, depth + 1)
            elif rng.random() < 0.1:
                data[f"k{index}"] = f"note {index}"
            else:
                feature = tuple(rng.randint(1, 4) for _ in range(rng.randint(0, 2)))
                data[f"k{index}"] = torch.randn(batch + feature, generator=generator)
        out = TensorDict(data, list(batch))
        if depth and rng.random() < 0.25:
            a = torch.randn(batch, generator=generator)
            return _Cell(a=a, tag="t", sub=out, batch_size=list(batch))
        return out

    root = level(batch, 0)
    if rank and rng.random() < 0.5:
        root.names = [f"d{i}" for i in range(rank)]
    return root


def _describe(tree) -> list:
    """Every level's class, keys, batch size and names, and every leaf's value."""
    out = []
    view = tree._to_tensordict_view()
    out.append((type(tree), tuple(view.keys()), tree.batch_size, view._names))
    for key, value in view._data.items():
        if isinstance(value, torch.Tensor):
            out.append((key, value.shape, value.sum().item()))
        elif getattr(type(value), "_is_tensor_collection", False) and hasattr(value, "_data"):
            out.append((key, _describe(value)))
        else:
            out.append((key, type(value).__name__, getattr(value, "data", value)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_random_trees_agree_with_and_without_a_dispatch_mode(seed):
    tree = _random_container(seed)

    def run():
        leaves, spec = torch_pytree.tree_flatten(tree)
        same = torch_pytree.tree_unflatten(leaves, spec)
        doubled = torch_pytree.tree_map(lambda t: t * 2, tree)
        if tree.batch_size:
            mapped = torch.func.vmap(lambda t: t.apply(lambda x: x + 1))(tree)
        else:
            mapped = doubled
        return [_describe(same), _describe(doubled), _describe(mapped)]

    expected = run()
    with _PassThrough():
        got = run()
    assert got == expected


@pytest.mark.parametrize("width", [1, 100, 256, 257, 1000])
def test_wide_levels_agree_with_and_without_a_dispatch_mode(width):
    # around the width where a level's shapes stop being compared as one tuple
    tree = TensorDict({f"k{i}": torch.full((2, i % 3 + 1), float(i)) for i in range(width)}, [2])

    def run():
        return _describe(torch_pytree.tree_map(lambda t: t + 1, tree)), _describe(
            torch.func.vmap(lambda t: t * 2)(tree)
        )

    expected = run()
    with _PassThrough():
        assert run() == expected


class _OwnPlain(TensorDict):
    """A TensorDict class that a TensorClass below names as its plain one."""

    __slots__ = ()


class _Custom(TensorClass):
    x: torch.Tensor

    @classmethod
    def _plain_tensordict(cls):
        return _OwnPlain


def test_each_tensorclass_rebuilds_with_the_plain_class_its_hook_names():
    pairs = _Pair(x=torch.zeros(2), y=torch.ones(2), batch_size=[2])
    custom = _Custom(x=torch.zeros(2), batch_size=[2])
    for _ in range(2):  # the second round reads what the first one found
        for instance in (pairs, custom):
            out = torch_pytree.tree_map(lambda t: t + 1, instance)
            assert type(out) is type(instance)
            assert type(out._to_tensordict_view()) is type(instance)._plain_tensordict()
            torch.testing.assert_close(out.x, torch.ones(2))
