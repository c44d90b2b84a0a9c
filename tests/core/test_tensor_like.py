"""Reductions and pointwise math of containers, against the same computation on plain
tensors, leaf by leaf (nested containers, batch rank 0/1/2, names, locked containers).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from leafwise_helpers import BATCH, NAMES, assert_leafwise, make

from tdfunc import TensorDict
from tdfunc._core.helpers.pointwise_names import PREDICATES, UNARY

REDUCTIONS = ["sum", "mean", "std", "var", "prod", "amax", "amin", "nansum", "nanmean"]


def _ref(op: str, t: torch.Tensor, dims=None, keepdim=False) -> torch.Tensor:
    if dims is None:
        return getattr(t, op)()
    if op == "prod":
        for d in sorted(dims, reverse=True):
            t = t.prod(d, keepdim=keepdim)
        return t
    return getattr(t, op)(dims, keepdim=keepdim)


@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_over_every_element(op, rank):
    td, plain = make(rank, lock=True)
    result = getattr(td, op)()
    assert_leafwise(result, {k: _ref(op, v) for k, v in plain.items()}, [])
    assert result.names == []


@pytest.mark.parametrize("rank", [1, 2])
@pytest.mark.parametrize("op", REDUCTIONS)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduction_over_batch_dim(op, rank, keepdim):
    td, plain = make(rank, names=True)
    for dim in range(-rank, rank):
        d = dim % rank
        result = getattr(td, op)(dim, keepdim=keepdim)
        size = list(BATCH[rank])
        if keepdim:
            size[d] = 1
        else:
            del size[d]
        expected = {k: _ref(op, v, (d,), keepdim) for k, v in plain.items()}
        assert_leafwise(result, expected, size)
        names = list(NAMES[rank])
        if not keepdim:
            del names[d]
        assert result.names == (names if any(names) else [None] * len(size))


@pytest.mark.parametrize("op", ["sum", "mean", "std", "var", "amax", "amin", "prod"])
def test_reduction_over_several_batch_dims(op):
    td, plain = make(2)
    result = getattr(td, op)((0, 1))
    assert_leafwise(result, {k: _ref(op, v, (0, 1)) for k, v in plain.items()}, [])
    result = getattr(td, op)((1, 0), keepdim=True)
    assert_leafwise(result, {k: _ref(op, v, (0, 1), True) for k, v in plain.items()}, [1, 1])


@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduction_over_feature_dims(op, rank):
    td, plain = make(rank)
    size = BATCH[rank]
    expected = {k: _ref(op, v.reshape(*size, -1), (rank,)) for k, v in plain.items()}
    assert_leafwise(getattr(td, op)("feature"), expected, size)
    together = torch.cat([v.reshape(*size, -1) for v in plain.values()], -1)
    torch.testing.assert_close(getattr(td, op)("feature", reduce=True), _ref(op, together, (rank,)))


@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize("op", REDUCTIONS)
def test_reduce_true_gives_one_number(op, rank):
    td, plain = make(rank)
    flat = torch.cat([v.flatten() for v in plain.values()])
    torch.testing.assert_close(getattr(td, op)(reduce=True), _ref(op, flat))


def test_reduce_true_along_a_batch_dim_concatenates():
    td = TensorDict({"a": torch.randn(3, 4), "b": torch.randn(3, 2)}, [3])
    torch.testing.assert_close(td.sum(1, reduce=True), torch.cat([td["a"], td["b"]], 1).sum(1))
    torch.testing.assert_close(td.sum(-1, reduce=True), torch.cat([td["a"], td["b"]], 1).sum(1))
    same = TensorDict({"a": torch.randn(3, 4), "b": torch.randn(2, 4)}, [])
    torch.testing.assert_close(same.mean(0, reduce=True), torch.cat([same["a"], same["b"]]).mean(0))
    values = same.max(0, reduce=True)
    torch.testing.assert_close(values.values, torch.cat([same["a"], same["b"]]).max(0).values)
    with pytest.raises(ValueError, match="same number of dims"):
        TensorDict({"a": torch.randn(3, 4), "b": torch.randn(3)}, [3]).sum(0, reduce=True)


def test_reduction_errors_name_the_api():
    td, _ = make(1)
    with pytest.raises(IndexError, match="sum"):
        td.sum(1)
    with pytest.raises(ValueError, match="keepdim"):
        td.mean("feature", keepdim=True)
    with pytest.raises(TypeError, match="dim"):
        td.sum("x")


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("rank", [1, 2])
def test_max_min_with_dim_give_values_and_indices(op, rank):
    td, plain = make(rank)
    for dim in range(rank):
        out = getattr(td, op)(dim)
        assert type(out).__name__ == op
        size = [s for d, s in enumerate(BATCH[rank]) if d != dim]
        assert_leafwise(out.values, {k: getattr(v, op)(dim).values for k, v in plain.items()}, size)
        assert_leafwise(
            out.indices, {k: getattr(v, op)(dim).indices for k, v in plain.items()}, size
        )
        only = getattr(td, op)(dim, keepdim=True, return_indices=False)
        expected = {k: getattr(v, op)(dim, keepdim=True).values for k, v in plain.items()}
        assert_leafwise(only, expected, [1 if d == dim else s for d, s in enumerate(BATCH[rank])])
    assert_leafwise(getattr(td, op)(), {k: getattr(v, op)() for k, v in plain.items()}, [])
    flat = torch.cat([v.flatten() for v in plain.values()])
    torch.testing.assert_close(getattr(td, op)(reduce=True), getattr(flat, op)())


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin(op):
    td, plain = make(2)
    out = getattr(td, op)(1)
    assert_leafwise(out.values, {k: getattr(v, op)(1).values for k, v in plain.items()}, [3, 4])
    assert_leafwise(out.indices, {k: getattr(v, op)(1).indices for k, v in plain.items()}, [3, 4])


@pytest.mark.parametrize("op", ["cumsum", "cumprod", "softmax", "log_softmax"])
@pytest.mark.parametrize("rank", [1, 2])
def test_scans_along_a_batch_dim(op, rank):
    td, plain = make(rank, names=True)
    for dim in range(-rank, rank):
        result = getattr(td, op)(dim)
        expected = {k: getattr(v, op)(dim % rank) for k, v in plain.items()}
        assert_leafwise(result, expected, BATCH[rank])
        assert result.names == NAMES[rank]


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_logsumexp(rank):
    td, plain = make(rank)
    dims = tuple(range(rank))
    expected = {k: v.logsumexp(dims) if rank else v for k, v in plain.items()}
    assert_leafwise(td.logsumexp(), expected, [])
    if rank:
        expected = {k: v.logsumexp(rank - 1, keepdim=True) for k, v in plain.items()}
        size = BATCH[rank][:-1] + [1]
        assert_leafwise(td.logsumexp(-1, keepdim=True), expected, size)


@pytest.mark.parametrize("op", ["all", "any"])
def test_all_any_with_and_without_dim(op):
    td, plain = make(2)
    mask = td > 0
    masks = {k: v > 0 for k, v in plain.items()}
    assert getattr(mask, op)() == builtins_of(op).__call__(
        bool(getattr(v, op)()) for v in masks.values()
    )
    assert_leafwise(getattr(mask, op)(1), {k: getattr(v, op)(1) for k, v in masks.items()}, [3])
    assert_leafwise(
        getattr(mask, op)((0, 1)), {k: getattr(v, op)((0, 1)) for k, v in masks.items()}, []
    )


def builtins_of(op: str):
    import builtins

    return getattr(builtins, op)


def test_norm_is_one_norm_per_leaf():
    td, plain = make(2)
    td["s"] = "text"
    norms = td.norm()
    assert norms["s"] == "text"
    del norms["s"]
    assert_leafwise(norms, {k: torch.linalg.vector_norm(v) for k, v in plain.items()}, [])
    renamed = td.exclude("s").norm(key_transform=lambda key: key + "_norm")
    assert set(renamed.keys(True, True)) == {
        tuple(p + "_norm" for p in k) if len(k) > 1 else k[0] + "_norm" for k in plain
    }
    assert td.norm(dtype=torch.float64)["a"].dtype == torch.float64


# ---------------------------------------------------------------- torch.* dispatch
def test_torch_reductions_dispatch_to_the_methods():
    td, plain = make(2)
    assert_leafwise(torch.mean(td, 0), {k: v.mean(0) for k, v in plain.items()}, [4])
    assert_leafwise(torch.std(td, 1), {k: v.std(1) for k, v in plain.items()}, [3])
    assert_leafwise(torch.var(td), {k: v.var() for k, v in plain.items()}, [])
    assert_leafwise(torch.sum(td, (0, 1)), {k: v.sum((0, 1)) for k, v in plain.items()}, [])
    out = torch.max(td, 1)
    assert_leafwise(out.indices, {k: v.max(1).indices for k, v in plain.items()}, [3])
    assert_leafwise(torch.cumsum(td, 0), {k: v.cumsum(0) for k, v in plain.items()}, [3, 4])
    assert_leafwise(torch.softmax(td, 1), {k: v.softmax(1) for k, v in plain.items()}, [3, 4])
    assert_leafwise(F.log_softmax(td, 0), {k: v.log_softmax(0) for k, v in plain.items()}, [3, 4])
    assert_leafwise(torch.logsumexp(td, 0), {k: v.logsumexp(0) for k, v in plain.items()}, [4])


def test_torch_maximum_minimum_either_side():
    td, plain = make(1)
    other, other_plain = make(1, seed=1)
    assert_leafwise(
        torch.maximum(td, other),
        {k: torch.maximum(v, other_plain[k]) for k, v in plain.items()},
        [3],
    )
    zero = torch.zeros(())
    assert_leafwise(
        torch.minimum(zero, td), {k: torch.minimum(zero, v) for k, v in plain.items()}, [3]
    )
    assert_leafwise(
        td.maximum(other), {k: torch.maximum(v, other_plain[k]) for k, v in plain.items()}, [3]
    )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"])
def test_losses_leaf_by_leaf(loss, reduction):
    td, plain = make(1)
    target, target_plain = make(1, seed=3)
    fn = getattr(F, loss)
    out = fn(td, target, reduction=reduction)
    expected = {k: fn(v, target_plain[k], reduction=reduction) for k, v in plain.items()}
    assert_leafwise(out, expected, [3] if reduction == "none" else [])


def test_bce_with_a_tensor_target():
    logits = TensorDict({"a": torch.randn(3, 2)}, [3])
    target = torch.ones(3, 2)
    out = F.binary_cross_entropy_with_logits(logits, target)
    torch.testing.assert_close(out["a"], F.binary_cross_entropy_with_logits(logits["a"], target))
    assert out.batch_size == torch.Size([])
    probs = logits.sigmoid()
    out = F.binary_cross_entropy(target, probs, reduction="none")  # the container second
    torch.testing.assert_close(
        out["a"], F.binary_cross_entropy(target, probs["a"], reduction="none")
    )


# ---------------------------------------------------------------- pointwise
@pytest.mark.parametrize("name", UNARY)
def test_unary_out_of_place_and_in_place(name):
    td, plain = make(2, names=True, positive=True)
    result = getattr(td, name)()
    assert_leafwise(result, {k: getattr(torch, name)(v) for k, v in plain.items()}, [3, 4])
    assert result.names == ["x", "y"]
    assert result is not td
    locked, plain = make(2, lock=True, positive=True)  # in place is allowed when locked
    before = locked["a"]
    assert getattr(locked, name + "_")() is locked
    assert locked["a"] is before
    assert_leafwise(
        locked, {k: getattr(torch, name)(v) for k, v in make(2, positive=True)[1].items()}, [3, 4]
    )
    assert_leafwise(
        getattr(torch, name)(td),
        {k: getattr(torch, name)(v) for k, v in make(2, positive=True)[1].items()},
        [3, 4],
    )


@pytest.mark.parametrize("name", PREDICATES)
def test_predicates(name):
    x = torch.tensor([[1.0, float("nan")], [float("inf"), -float("inf")]])
    td = TensorDict({"a": x, "n": {"b": x.T.contiguous()}}, [2])
    expected = {("a",): getattr(torch, name)(x), ("n", "b"): getattr(torch, name)(x.T)}
    assert_leafwise(getattr(td, name)(), expected, [2])
    assert_leafwise(getattr(torch, name)(td), expected, [2])


def test_isnan_any_reads_like_tensordict():
    td = TensorDict({"a": torch.zeros(2), "b": torch.tensor([0.0, float("nan")])}, [2])
    assert td.isnan().any() is True
    assert td.exclude("b").isnan().any() is False


def test_clamp_family():
    td, plain = make(1)
    assert_leafwise(td.clamp(-0.5, 0.5), {k: v.clamp(-0.5, 0.5) for k, v in plain.items()}, [3])
    assert_leafwise(td.clamp_min(0.1), {k: v.clamp_min(0.1) for k, v in plain.items()}, [3])
    assert_leafwise(td.clamp_max(0.1), {k: v.clamp_max(0.1) for k, v in plain.items()}, [3])
    assert_leafwise(torch.clamp(td, max=0.0), {k: v.clamp(max=0.0) for k, v in plain.items()}, [3])
    td.clamp_(-0.2, 0.2)
    assert_leafwise(td, {k: v.clamp(-0.2, 0.2) for k, v in plain.items()}, [3])
    td.clamp_min_(0.0).clamp_max_(0.1)
    assert_leafwise(td, {k: v.clamp(0.0, 0.1) for k, v in plain.items()}, [3])


def test_binary_methods_and_in_place_pairs():
    td, plain = make(2)
    other, other_plain = make(2, seed=5)
    assert_leafwise(
        td.add(other, alpha=2), {k: v + 2 * other_plain[k] for k, v in plain.items()}, [3, 4]
    )
    assert_leafwise(td.sub(other), {k: v - other_plain[k] for k, v in plain.items()}, [3, 4])
    assert_leafwise(td.mul(2.0), {k: v * 2 for k, v in plain.items()}, [3, 4])
    assert_leafwise(td.div(other), {k: v / other_plain[k] for k, v in plain.items()}, [3, 4])
    assert_leafwise(
        td.lerp(other, 0.3),
        {k: torch.lerp(v, other_plain[k], 0.3) for k, v in plain.items()},
        [3, 4],
    )
    assert_leafwise(
        td.addcmul(other, other, value=0.5),
        {k: torch.addcmul(v, other_plain[k], other_plain[k], value=0.5) for k, v in plain.items()},
        [3, 4],
    )
    td.maximum_(other)
    assert_leafwise(td, {k: torch.maximum(v, other_plain[k]) for k, v in plain.items()}, [3, 4])
    td.addcdiv_(other, other.abs() + 1, value=2)
    expected = {
        k: torch.addcdiv(
            torch.maximum(v, other_plain[k]), other_plain[k], other_plain[k].abs() + 1, value=2
        )
        for k, v in plain.items()
    }
    assert_leafwise(td, expected, [3, 4])


class _Frozen(TensorDict):
    """Stands in for a frozen TensorClass: the in-place refusal path of the mixins."""

    __slots__ = ()
    _tc_frozen = True

    def _check_mutable(self, api, hint=None):
        raise RuntimeError(f"frozen: {api}")


def test_in_place_refused_when_frozen_out_of_place_allowed():
    td = _Frozen({"a": torch.ones(2)}, [2])
    for call in (
        lambda: td.exp_(),
        lambda: td.clamp_(0, 1),
        lambda: td.maximum_(td),
        lambda: td.masked_fill_(torch.tensor([True, False]), 0.0),
        lambda: td.set_at_("a", 0.0, 0),
    ):
        with pytest.raises(RuntimeError, match="frozen"):
            call()
    assert td.exp()["a"].tolist() == torch.ones(2).exp().tolist()
    assert td["a"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("op", ["max", "min", "cummax", "cummin", "cumsum", "softmax"])
def test_ops_along_one_dim_refuse_several_dims(op):
    # torch.max(t, dim=(0, 1)) is an error; reducing dim 0 only would be a silent wrong answer
    td = TensorDict({"a": torch.randn(3, 4)}, [3, 4])
    with pytest.raises(TypeError, match=f"TensorDict.{op}: dim must be a single int"):
        getattr(td, op)(dim=(0, 1))
    if op in ("max", "min"):
        with pytest.raises(TypeError, match="single int"):
            getattr(td, op)(dim=(0, 1), reduce=True)
    one = getattr(td, op)(dim=(1,))  # a tuple holding one dim is that dim
    reference = getattr(td["a"], op)(1)
    one = one if isinstance(one, TensorDict) else one[0]
    reference = reference if isinstance(reference, torch.Tensor) else reference[0]
    assert torch.equal(one["a"], reference)


def test_a_dim_given_twice_or_of_a_wrong_type_is_refused():
    td = TensorDict({"a": torch.randn(3, 4)}, [3, 4])
    with pytest.raises(ValueError, match="more than once"):
        td.sum(dim=(0, -2))  # torch: "dim 0 appears multiple times"
    with pytest.raises(TypeError, match="dim must be an int, a tuple of ints"):
        td.mean(dim=0.5)
    assert torch.equal(td.sum(dim=[0, 1])["a"], td["a"].sum((0, 1)))


def test_quantile_takes_integer_leaves_as_floats_and_refuses_complex_ones():
    ints = TensorDict({"a": torch.arange(6).reshape(3, 2)}, [3])
    assert torch.equal(ints.quantile(0.5, 0)["a"], torch.quantile(ints["a"].float(), 0.5, 0))
    # a complex leaf cast to float would lose its imaginary part: torch refuses, so do we
    values = torch.randn(3, 2, dtype=torch.complex64)
    with pytest.raises(RuntimeError):
        torch.quantile(values, 0.5, 0)
    with pytest.raises(RuntimeError):
        TensorDict({"a": values}, [3]).quantile(0.5, 0)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "std", "prod", "max"])
def test_keepdim_without_dim_keeps_every_dim_with_size_one(op):
    # torch.amax(t, keepdim=True) has t's dims, each of size 1; keepdim was ignored
    td, ref = make(2, names=True)
    out = getattr(td, op)(keepdim=True)

    def reference(t):
        if op == "prod":
            return t.prod().reshape([1] * t.dim())
        return getattr(t, "amax" if op == "max" else op)(dim=None, keepdim=True)

    assert_leafwise(out, {k: reference(v) for k, v in ref.items()}, [1, 1])
    assert out.names == ["x", "y"] and out["n"].batch_size == torch.Size([1, 1])


@pytest.mark.parametrize(
    "call",
    [
        lambda f, x: f(x, 0, False),  # torch's third positional argument is unbiased
        lambda f, x: f(x, False),  # torch.std(input, unbiased)
        lambda f, x: f(x, 0, True, True),
        lambda f, x: f(x, 0, unbiased=False, keepdim=True),
        lambda f, x: f(x, dim=1, correction=0),
        lambda f, x: f(x),
    ],
)
@pytest.mark.parametrize("fn", [torch.std, torch.var], ids=["std", "var"])
def test_torch_std_and_var_read_torchs_signature(fn, call):
    # torch.std(td, 0, False) was read as keepdim=False: Bessel-corrected, silently
    td, ref = make(2)
    expected = {k: call(fn, v) for k, v in ref.items()}
    out = call(fn, td)
    assert_leafwise(out, expected, out.batch_size)
    assert out.batch_size == expected[("b",)].shape or not out.batch_dims


def test_a_bool_dim_is_refused():
    td, _ = make(2)
    with pytest.raises(TypeError, match="dim must be an int"):
        td.std(False)  # would have reduced dim 0


@pytest.mark.parametrize(
    "call",
    [
        lambda x: torch.quantile(x, 0.25, 0),
        lambda x: torch.add(x, 2, alpha=3),
        lambda x: torch.sub(x, 1),
        lambda x: torch.mul(x, 2),
        lambda x: torch.div(x, 2),
        lambda x: torch.pow(x, 2),
    ],
    ids=["quantile", "add", "sub", "mul", "div", "pow"],
)
def test_torch_functions_with_a_container_first(call):
    td, ref = make(2)
    expected = {k: call(v) for k, v in ref.items()}
    out = call(td)
    assert_leafwise(out, expected, out.batch_size)
    assert out.batch_size == expected[("b",)].shape  # "b" has no feature dims
