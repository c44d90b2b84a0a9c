"""Differential test: containers holding unusual tensors against torch on each leaf.

Hypothesis draws a batch size (0 to 2 dims, sizes 0 to 3), three leaves of unusual
kinds (non-contiguous, expanded with stride 0, ``as_strided``, complex, bool, small
integers, half precision, grad-tracking leaf and non-leaf, inference-mode, ``nn.Parameter``,
a ``__torch_function__`` subclass, meta, a view sharing the storage of another key), a
TensorDict or a TensorClass, then one op. Each leaf of the result must equal torch's
op on that leaf: values, dtype, shape, strides, tensor type, ``requires_grad``, and
whether it shares the input's storage. Where torch raises on a leaf, the container
raises an error of the same type that names the key.
"""

from __future__ import annotations

import copy
import pickle
import tempfile
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tdfunc import TensorClass, TensorDict


class Tagged(torch.Tensor):
    """A user subclass that takes part in dispatch (``__torch_function__``)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class Trio(TensorClass):
    a: torch.Tensor
    b: torch.Tensor
    n: TensorDict


KINDS = [
    "plain", "transposed", "sliced", "expanded", "as_strided", "complex", "bool", "int8",
    "uint8", "int64", "float16", "bfloat16", "grad_leaf", "grad_nonleaf", "inference",
    "parameter", "subclass", "meta", "shares_a",
]  # fmt: skip
FEATURE = (2,)


def _leaf(kind: str, batch: tuple, g: torch.Generator, a: torch.Tensor) -> torch.Tensor:
    shape = batch + FEATURE
    if kind == "transposed":
        return torch.randn(tuple(reversed(shape)), generator=g).permute(
            *reversed(range(len(shape)))
        )
    if kind == "sliced":
        return torch.randn(*batch, 2 * FEATURE[0], generator=g)[..., ::2]
    if kind == "expanded":
        return torch.randn(*[1] * len(batch), *FEATURE, generator=g).expand(shape)
    if kind == "as_strided":
        base = torch.randn(max(1, shape.__len__()) * 8 + 8, generator=g)
        strides = tuple(range(1, len(shape) + 1))  # overlapping rows of one buffer
        return base.as_strided(shape, strides)
    if kind == "complex":
        return torch.randn(shape, generator=g, dtype=torch.complex64)
    if kind == "bool":
        return torch.rand(shape, generator=g) > 0.5
    if kind in ("int8", "uint8", "int64"):
        return torch.randint(0, 5, shape, generator=g, dtype=getattr(torch, kind))
    if kind in ("float16", "bfloat16"):
        return torch.randn(shape, generator=g).to(getattr(torch, kind))
    if kind == "grad_leaf":
        return torch.randn(shape, generator=g).requires_grad_()
    if kind == "grad_nonleaf":
        return torch.randn(shape, generator=g).requires_grad_() * 2
    if kind == "inference":
        t = torch.randn(shape, generator=g)
        with torch.inference_mode():
            return t.clone()
    if kind == "parameter":
        return torch.nn.Parameter(torch.randn(shape, generator=g))
    if kind == "subclass":
        return torch.randn(shape, generator=g).as_subclass(Tagged)
    if kind == "meta":
        return torch.empty(shape, device="meta")
    if kind == "shares_a":  # a view of key "a": both keys read one storage
        return a.flip(-1) if a.layout is torch.strided and a.device.type != "meta" else a
    return torch.randn(shape, generator=g)


def _build(kinds: list, batch: tuple, seed: int) -> dict:
    """The leaves of one case; called twice, it gives two independent equal sets."""
    g = torch.Generator().manual_seed(seed)
    a = _leaf(kinds[0], batch, g, None)
    return {
        ("a",): a,
        ("b",): _leaf(kinds[1], batch, g, a),
        ("n", "c"): _leaf(kinds[2], batch, g, a),
    }


def _container(leaves: dict, batch: tuple, tensorclass: bool):
    nested = TensorDict({"c": leaves[("n", "c")]}, list(batch))
    if tensorclass:
        return Trio(a=leaves[("a",)], b=leaves[("b",)], n=nested, batch_size=list(batch))
    return TensorDict({"a": leaves[("a",)], "b": leaves[("b",)], "n": nested}, list(batch))


@st.composite
def cases(draw):
    rank = draw(st.sampled_from([1, 2, 0]))
    batch = tuple(draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank)))
    kinds = [draw(st.sampled_from(KINDS[:-1])), draw(st.sampled_from(KINDS))]
    kinds.append(draw(st.sampled_from(KINDS)))
    return kinds, batch, draw(st.integers(0, 2**16)), draw(st.booleans())


def _mask(batch: tuple) -> torch.Tensor:
    return (torch.arange(max(1, batch[0] if batch else 1)) % 2 == 0)[: batch[0] if batch else 1]


def _aligned(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return mask.reshape(*mask.shape, *[1] * (t.dim() - mask.dim()))


def ops_for(draw, batch: tuple) -> tuple:
    """``(name, op on the container, op on one leaf, compare strides)``."""
    rank = len(batch)
    names = ["clone", "detach", "contiguous", "to_f64", "to_same", "apply", "add", "mul"]
    names += ["eq", "to_dict", "pickle", "deepcopy", "zero_", "copy_", "update_", "sum_all"]
    names += ["stack", "unsqueeze", "expand", "consolidate", "memmap", "requires_grad_"]
    if rank:
        names += ["index", "slice", "mask", "sum", "mean", "std", "max", "cat", "unbind"]
        names += ["split", "reshape", "view", "where", "masked_fill", "tensor_index"]
    name = draw(st.sampled_from(names))
    feat = len(FEATURE)

    def keep(t):  # a leaf's batch view: reshape ops see batch dims then FEATURE
        return t

    if name == "clone":
        return name, lambda x: x.clone(), lambda t: t.clone(), True
    if name == "detach":
        return name, lambda x: x.detach(), lambda t: t.detach(), True
    if name == "contiguous":
        return name, lambda x: x.contiguous(), lambda t: t.contiguous(), True
    if name == "to_f64":
        return name, lambda x: x.to(torch.float64), lambda t: t.to(torch.float64), True
    if name == "to_same":  # a leaf already of that dtype is returned as it is
        return name, lambda x: x.to(torch.float32), lambda t: t.to(torch.float32), True
    if name == "apply":
        return name, lambda x: x.apply(lambda t: t * 2), lambda t: t * 2, True
    if name == "add":
        return name, lambda x: x + 1, lambda t: t + 1, True
    if name == "mul":
        return name, lambda x: x * x, lambda t: t * t, True
    if name == "eq":
        return name, lambda x: x == x, lambda t: t == t, True
    if name == "to_dict":
        return name, lambda x: TensorDict(x.to_dict(), list(batch)), keep, True
    if name == "pickle":
        return name, lambda x: pickle.loads(pickle.dumps(x)), _pickled, False
    if name == "deepcopy":
        return name, copy.deepcopy, copy.deepcopy, False
    if name == "zero_":
        return name, lambda x: x.zero_(), lambda t: t.zero_(), True
    if name in ("copy_", "update_"):
        method = name

        def container_copy(x):
            source = x.apply(lambda t: torch.ones_like(t))
            if method == "copy_":
                return x.copy_(source)
            return x.update_(source.to_dict())

        return name, container_copy, lambda t: t.copy_(torch.ones_like(t)), True
    if name == "requires_grad_":
        return name, lambda x: x.requires_grad_(), lambda t: t.requires_grad_(), True
    if name == "sum_all":  # no dim: every leaf reduced to a scalar
        return name, lambda x: x.sum(), lambda t: t.sum(), True
    if name == "stack":
        return (
            name,
            lambda x: torch.stack([x, x], 0),
            lambda t: torch.stack([t, t], 0),
            True,
        )
    if name == "unsqueeze":
        return name, lambda x: x.unsqueeze(0), lambda t: t.unsqueeze(0), True
    if name == "expand":
        return name, lambda x: x.expand(2, *batch), lambda t: t.expand(2, *t.shape), True
    if name == "consolidate":  # a copy into one storage; detached, as in tensordict
        return name, lambda x: x.consolidate(), _packed, False
    if name == "memmap":
        return name, _memmap_round_trip, _saved, False
    dim = draw(st.integers(-rank, rank - 1))
    d = dim % rank
    if name == "index":
        i = draw(st.integers(-3, 3))
        return name, lambda x: x[i], lambda t: t[i], True
    if name == "slice":
        return name, lambda x: x[1:], lambda t: t[1:], True
    # Advanced indexing copies; the layout of the copy is torch's choice (a mask read
    # as nonzero() indices can come back with other strides on a permuted leaf), so
    # only the values, dtype and flags are compared.
    if name == "mask":
        m = _mask(batch)
        return name, lambda x: x[m], lambda t: t[m], False
    if name == "tensor_index":
        idx = torch.tensor([0, -1, 0])
        return name, lambda x: x[idx], lambda t: t[idx], False
    if name in ("sum", "mean", "std"):
        keepdim = draw(st.booleans())
        return (
            name,
            lambda x: getattr(x, name)(dim, keepdim=keepdim),
            lambda t: getattr(t, name)(d, keepdim=keepdim),
            True,
        )
    if name == "max":
        return name, lambda x: x.max(dim)[0], lambda t: t.max(d)[0], True
    if name == "cat":
        return name, lambda x: torch.cat([x, x], dim), lambda t: torch.cat([t, t], d), True
    if name == "unbind":
        i = draw(st.integers(0, max(0, batch[d] - 1)))
        if not batch[d]:  # no pieces to compare: the count is checked
            return (
                name,
                lambda x: x.apply(lambda t: t) if not x.unbind(dim) else None,
                lambda t: t if not t.unbind(d) else None,
                True,
            )
        return (
            name,
            lambda x: x.unbind(dim)[i],
            lambda t: t.unbind(d)[i],
            True,
        )
    if name == "split":
        return name, lambda x: x.split(1, dim)[-1], lambda t: t.split(1, d)[-1], True
    if name in ("reshape", "view"):
        method = name
        return (
            name,
            lambda x: getattr(x, method)(-1),
            lambda t: getattr(t, method)(-1, *t.shape[rank:]) if t.dim() >= feat else t,
            True,
        )
    if name == "where":
        m = _mask(batch)
        return (
            name,
            lambda x: x.where(m.reshape(-1, *[1] * (rank - 1)).expand(batch), x * 0),
            lambda t: torch.where(_aligned(m, t), t, t * 0),
            True,
        )
    # masked_fill
    m = _mask(batch)
    return (
        name,
        lambda x: x.masked_fill(m.reshape(-1, *[1] * (rank - 1)).expand(batch), 1),
        lambda t: t.masked_fill(_aligned(m, t), 1),
        True,
    )


def _pickled(t: torch.Tensor) -> torch.Tensor:
    return pickle.loads(pickle.dumps(t))


def _packed(t: torch.Tensor) -> torch.Tensor:
    """What a copy into a new storage gives: plain, detached, dense, row-major."""
    return t.detach().as_subclass(torch.Tensor).clone(memory_format=torch.contiguous_format)


def _saved(t: torch.Tensor) -> torch.Tensor:
    """A file holds values: a meta tensor has none to write."""
    if t.device.type == "meta":
        raise TypeError("a meta tensor has no values to save")
    return _packed(t)


def _memmap_round_trip(x):
    with tempfile.TemporaryDirectory() as path:
        x.memmap(path)
        loaded = type(x).load_memmap(path)
        return loaded.apply(lambda t: t.clone())  # before the files go away


def _copy(t: torch.Tensor) -> torch.Tensor:
    """An independent copy of a leaf that keeps its kind (an in-place op must not reach
    the reference's input)."""
    if t.device.type == "meta":
        return t
    return t.detach().clone().requires_grad_(t.requires_grad) if t.is_leaf else t.clone()


def _key_named(error: BaseException, keys: list) -> bool:
    text = str(error) + " ".join(getattr(error, "__notes__", ()))
    return any(repr(k[0] if len(k) == 1 else k) in text for k in keys)


def _shares(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()


def _strides(t: torch.Tensor) -> tuple:
    """The strides that place elements (a dim of size 1 has any stride)."""
    return tuple(s for s, n in zip(t.stride(), t.shape) if n > 1)


def _compare(where, got, want, source, want_source, strides: bool) -> None:
    assert type(got) is type(want), (where, type(got), type(want))
    assert got.dtype == want.dtype, (where, got.dtype, want.dtype)
    assert got.shape == want.shape, (where, got.shape, want.shape)
    assert got.device == want.device, (where, got.device, want.device)
    assert got.requires_grad == want.requires_grad, (where, "requires_grad")
    assert got.is_inference() == want.is_inference(), (where, "inference")
    if want.device.type == "meta":
        return
    if strides and want.numel():  # an empty tensor's strides say nothing
        assert _strides(got) == _strides(want), (where, got.stride(), want.stride())
        assert _shares(got, source) == _shares(want, want_source), (where, "aliasing")
    torch.testing.assert_close(
        got.detach().as_subclass(torch.Tensor),
        want.detach().as_subclass(torch.Tensor),
        equal_nan=True,
        rtol=0,
        atol=0,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_unusual_leaves_match_torch_on_each_leaf(data):
    kinds, batch, seed, tensorclass = data.draw(cases())
    name, on_container, on_leaf, strides = ops_for(data.draw, batch)
    leaves = _build(kinds, batch, seed)
    container = _container(leaves, batch, tensorclass)
    reference_inputs = _build(kinds, batch, seed)  # in-place ops must not share inputs
    expected, errors = {}, {}
    if name == "consolidate" and len({t.device for t in leaves.values()}) > 1:
        with pytest.raises(ValueError, match="several devices"):  # one storage, one device
            on_container(container)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key, leaf in reference_inputs.items():
            try:
                expected[key] = on_leaf(leaf)
            except Exception as error:
                errors[key] = error
        if errors:
            with pytest.raises(Exception) as info:
                on_container(container)
            refused = list(errors)
            assert any(isinstance(info.value, type(errors[k])) for k in refused), (
                name, kinds, info.value, errors,
            )  # fmt: skip
            # an error of every leaf is the batch's (an index out of range); one of some
            # leaves is theirs and names one (copy.deepcopy walks the entries, not tdfunc)
            if expected and name != "deepcopy":
                assert _key_named(info.value, refused), (name, kinds, info.value, refused)
            return
        result = on_container(container)
    if name in ("zero_", "copy_", "update_", "requires_grad_"):
        assert result is container
    for key, want in expected.items():
        got = result.get(key)
        where = f"{name} {kinds} {batch} at {key}"
        _compare(where, got, want, leaves[key], reference_inputs[key], strides)


GRAD_KINDS = ["grad_leaf", "grad_nonleaf", "parameter", "transposed", "expanded", "sliced"]
GRAD_OPS = {
    "sum": (lambda x: x.sum(0), lambda t: t.sum(0)),
    "std": (lambda x: x.std(0), lambda t: t.std(0)),
    "reshape": (lambda x: x.reshape(-1), lambda t: t.reshape(-1, *FEATURE)),
    "stack": (lambda x: torch.stack([x, x * 2], 1), lambda t: torch.stack([t, t * 2], 1)),
    "where": (
        lambda x: x.where(torch.tensor([True, False, True]), x * 3),
        lambda t: torch.where(torch.tensor([True, False, True])[:, None], t, t * 3),
    ),
    "index": (lambda x: x[torch.tensor([2, 0, 2])], lambda t: t[torch.tensor([2, 0, 2])]),
    "apply": (lambda x: x.apply(torch.sin), torch.sin),
    "to_f64": (lambda x: x.to(torch.float64), lambda t: t.to(torch.float64)),
}


@pytest.mark.parametrize("op", sorted(GRAD_OPS))
@pytest.mark.parametrize("kind", GRAD_KINDS)
def test_gradients_through_container_ops_match_each_leaf(kind, op):
    on_container, on_leaf = GRAD_OPS[op]
    weight = torch.randn(2, generator=torch.Generator().manual_seed(1))
    leaves = _build([kind, "plain", kind], (3,), 0)
    sources = [t if t.requires_grad else t.requires_grad_() for t in leaves.values()]
    got = on_container(_container(leaves, (3,), False))
    loss = sum((got.get(k) * weight.to(got.get(k).dtype)).sum() for k in leaves)
    grads = torch.autograd.grad(loss, sources)
    want = sum((on_leaf(t) * weight.to(on_leaf(t).dtype)).sum() for t in leaves.values())
    for g, w in zip(grads, torch.autograd.grad(want, sources)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("kind", ["transposed", "expanded", "sliced", "as_strided", "float16"])
def test_vmap_and_grad_over_unusual_leaves_match_each_leaf(kind):
    leaves = {k: v.detach() for k, v in _build([kind, "plain", kind], (3,), 0).items()}
    td = _container(leaves, (3,), True)
    out = torch.func.vmap(lambda x: x.apply(lambda t: t.sin() * t))(td)
    grads = torch.func.grad(lambda x: sum((t.float() ** 2).sum() for t in x.values(True, True)))(td)
    for key, leaf in leaves.items():
        want = torch.func.vmap(lambda t: t.sin() * t)(leaf)
        torch.testing.assert_close(out.get(key), want)
        assert out.get(key).stride() == want.stride()
        torch.testing.assert_close(
            grads.get(key), torch.func.grad(lambda t: (t.float() ** 2).sum())(leaf)
        )


def test_a_torch_error_on_one_leaf_names_its_key_path():
    td = TensorDict({"a": torch.zeros(3), "n": {"b": torch.zeros(3, 2, dtype=torch.bool)}}, [3])
    with pytest.raises(RuntimeError, match=r"mean\(\)") as info:
        td.mean(0)  # torch's message speaks of "the input" only
    assert info.value.__notes__ == ["(raised by a torch operation on the leaf at key ('n', 'b'))"]
    with torch.inference_mode():
        frozen = torch.zeros(3)
    with pytest.raises(RuntimeError, match=r"at key 'x'"):
        TensorDict({"a": torch.zeros(3), "x": frozen}, [3]).zero_()
    sparse = TensorDict({"a": torch.zeros(3), "s": torch.eye(3).to_sparse()}, [3])
    with pytest.raises(RuntimeError, match=r"at key 's'"):
        sparse + 1
    with pytest.raises(RuntimeError, match=r"at key 's'"):
        sparse.reshape(3, 1)
    with pytest.raises(TypeError, match=r"leaf at key 's' has layout torch.sparse_coo"):
        sparse.consolidate()


def test_consolidate_refuses_leaves_on_several_devices():
    # one storage lies on one device: the cpu leaf was silently made a meta tensor
    td = TensorDict({"m": torch.empty(2, device="meta"), "c": torch.ones(2)}, [2])
    with pytest.raises(ValueError, match=r"several devices.*key 'm' on meta, key 'c' on cpu"):
        td.consolidate()
    out = td.consolidate(device="meta")
    assert out["c"].device.type == "meta"
