"""``torch.func`` transforms over TensorDicts, against the same transforms over plain dicts.

Every reference runs the same function through ``torch.func`` on the plain
nested dicts the TensorDicts are built from: torch's own pytree handles those,
so the reference involves no tdfunc code.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch.func import grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

from tdfunc import TensorClass, TensorDict, dims_like


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _raw(seed: int = 0) -> dict:
    """Batch [2, 3]; ``n`` has batch [2, 3]; ``n.m`` has batch [2, 3, 5]."""
    g = _gen(seed)
    return {
        "a": torch.randn(2, 3, 4, generator=g),
        "n": {
            "b": torch.randn(2, 3, generator=g),
            "m": {"c": torch.randn(2, 3, 5, 6, generator=g)},
        },
    }


def _td(raw: dict) -> TensorDict:
    td = TensorDict(raw, [2, 3])
    td["n", "m"].batch_size = [2, 3, 5]
    return td


def _flat(tree) -> dict:
    """``{key path: tensor}`` of a TensorDict or a plain nested dict."""
    out = {}
    for path, leaf in pytree.tree_flatten_with_path(tree)[0]:
        out[tuple(entry.key for entry in path)] = leaf
    return out


def _assert_close(result, reference, atol: float = 1e-6) -> None:
    got, want = _flat(result), _flat(reference)
    assert list(got) == list(want)
    for key in want:
        assert got[key].shape == want[key].shape, key
        assert torch.allclose(got[key], want[key], atol=atol), key


def _sin2(tree):
    return pytree.tree_map(lambda x: x.sin() * 2, tree)


def _insert(size: list, dim: int, value: int) -> torch.Size:
    size = list(size)
    size.insert(dim, value)
    return torch.Size(size)


# ---------------------------------------------------------------- vmap
@pytest.mark.parametrize("in_dim", [0, 1])
@pytest.mark.parametrize("out_dim", [0, 1])
def test_vmap_in_and_out_dims_match_plain_dicts(in_dim, out_dim):
    raw = _raw()
    td = _td(raw)
    inside = []

    def f(t):
        inside.append((t.batch_size, t["n"].batch_size, t["n", "m"].batch_size))
        return t.apply(lambda x: x.sin() * 2)

    out = vmap(f, in_dims=in_dim, out_dims=out_dim)(td)
    reference = vmap(_sin2, in_dims=in_dim, out_dims=out_dim)(raw)
    _assert_close(out, reference)
    kept = [3] if in_dim == 0 else [2]
    assert inside == [(torch.Size(kept), torch.Size(kept), torch.Size(kept + [5]))]
    mapped = 2 if in_dim == 0 else 3
    assert out.batch_size == _insert(kept, out_dim, mapped)
    assert out["n"].batch_size == out.batch_size
    assert out["n", "m"].batch_size == out.batch_size + torch.Size([5])


def test_nested_vmap_matches_plain_dicts():
    raw = _raw(1)
    inside = []

    def f(t):
        inside.append(t.batch_size)
        return t.apply(lambda x: x.sin() * 2)

    out = vmap(vmap(f), in_dims=1)(_td(raw))
    reference = vmap(vmap(_sin2), in_dims=1)(raw)
    _assert_close(out, reference)
    assert inside == [torch.Size([])]
    assert out.batch_size == torch.Size([3, 2])


def test_vmap_function_building_a_new_tensordict():
    raw = _raw(2)

    def f(t):
        return TensorDict({"y": t["a"].sum(-1), "z": {"w": t["n", "b"] * 2}}, t.batch_size)

    out = vmap(f)(_td(raw))
    assert out.batch_size == torch.Size([2, 3]) and out["z"].batch_size == torch.Size([2, 3])
    assert torch.allclose(out["y"], raw["a"].sum(-1))
    assert torch.allclose(out["z", "w"], raw["n"]["b"] * 2)


def test_vmap_randomness_different_with_dropout_matches_plain_dicts():
    raw = {"x": torch.ones(6, 50), "n": {"y": torch.ones(6, 4, 5)}}
    td = TensorDict(raw, [6])

    def drop(tree):
        return pytree.tree_map(lambda x: torch.nn.functional.dropout(x, 0.5), tree)

    torch.manual_seed(0)
    out = vmap(drop, randomness="different")(td)
    torch.manual_seed(0)
    reference = vmap(drop, randomness="different")(raw)
    _assert_close(out, reference)
    assert out.batch_size == torch.Size([6])
    assert not torch.equal(out["x"][0], out["x"][1])  # members differ


def test_vmap_chunk_size_matches_unchunked_and_plain_dicts():
    g = _gen(3)
    raw = {"x": torch.randn(7, 3, generator=g), "n": {"y": torch.randn(7, generator=g)}}
    td = TensorDict(raw, [7])
    out = vmap(_sin2, chunk_size=3)(td)
    _assert_close(out, vmap(_sin2)(raw))
    _assert_close(out, vmap(_sin2)(td))
    assert out.batch_size == torch.Size([7])


def test_vmap_in_dims_given_as_a_tensordict():
    raw = _raw(4)
    td = _td(raw)
    by_tree_map = pytree.tree_map(lambda _: 1, td)
    by_helper = dims_like(td, 1)
    assert type(by_helper) is TensorDict
    assert pytree.tree_leaves(by_helper) == pytree.tree_leaves(by_tree_map) == [1, 1, 1]
    reference = vmap(_sin2, in_dims=(1,))(raw)
    _assert_close(vmap(_sin2, in_dims=(by_tree_map,))(td), reference)
    _assert_close(vmap(_sin2, in_dims=(by_helper,))(td), reference)


def test_vmap_in_dims_per_sub_tensordict():
    g = _gen(5)
    raw = {
        "stacked": {"w": torch.randn(4, 3, 2, generator=g)},
        "shared": {"b": torch.randn(2, generator=g)},
    }
    td = TensorDict(
        {"stacked": TensorDict(raw["stacked"], [4]), "shared": TensorDict(raw["shared"], [])}, []
    )

    def f(p):
        return p["stacked", "w"] @ p["shared", "b"]

    in_dims = dims_like(td, 0, {"shared": None})
    assert pytree.tree_leaves(in_dims) == [0, None]
    out = vmap(f, (in_dims,))(td)
    reference = vmap(
        lambda p: p["stacked"]["w"] @ p["shared"]["b"], ({"stacked": 0, "shared": None},)
    )(raw)
    assert torch.allclose(out, reference)
    identity = vmap(lambda p: p, (in_dims,), out_dims=in_dims)(td)
    assert identity["stacked"].batch_size == torch.Size([4])
    assert identity["shared"].batch_size == torch.Size([])


def test_dims_like_errors():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, [2])
    with pytest.raises(KeyError, match=r"dims_like: .*'nn'.*Did you mean 'n'"):
        dims_like(td, 0, {"nn": None})
    with pytest.raises(TypeError, match=r"dims_like: the dim for key 'a' must be an int"):
        dims_like(td, 0, {"a": 1.0})
    with pytest.raises(TypeError, match=r"dims_like: expected a TensorDict"):
        dims_like({"a": torch.zeros(2)}, 0)
    nested = dims_like(td, None, {("n", "b"): 0})
    assert nested._data["a"] is None and nested["n"]._data["b"] == 0


def test_vmap_over_a_dim_that_is_not_a_batch_dim_is_an_error():
    unbatched = TensorDict({"x": torch.randn(3, 4)}, [])
    with pytest.raises(ValueError, match=r"batch_size=\[\] was mapped over dim 0 .*not one of"):
        vmap(lambda t: t)(unbatched)
    batched = TensorDict({"x": torch.randn(2, 3, 4), "y": torch.randn(2, 3, 4)}, [2])
    with pytest.raises(ValueError, match=r"batch_size=\[2\] was mapped over dim 1"):
        vmap(lambda t: t, in_dims=1)(batched)
    with pytest.raises(ValueError, match=r"mapped over dim 2 \(at key 'x'\)"):
        vmap(lambda t: t, in_dims=-1)(batched)
    # the same dims are fine once they are batch dims
    assert vmap(lambda t: t, in_dims=1)(TensorDict(batched, [2, 3])).batch_size == (3, 2)


def test_vmap_over_a_feature_dim_of_a_nested_level_is_an_error():
    td = TensorDict({"a": torch.randn(4, 3), "n": TensorDict({"b": torch.randn(4, 5)}, [4])}, [4])
    unbatched = TensorDict({"a": torch.randn(3), "n": TensorDict({"b": torch.randn(4, 5)}, [])}, [])
    assert vmap(lambda t: t)(td).batch_size == torch.Size([4])
    with pytest.raises(ValueError, match=r"batch_size=\[\] was mapped over dim 0 \(at key 'b'\)"):
        vmap(lambda t: t["n", "b"], (dims_like(unbatched, None, {"n": 0}),))(unbatched)


def test_spec_recorded_outside_rebuilt_inside_vmap():
    # one member's spec, rebuilt from the stacked leaves inside vmap (their batch
    # dim is the one vmap maps): not vmap's input boundary, nothing to refuse
    g = _gen(14)
    stacked = {"w": torch.randn(5, 4, 3, generator=g), "n": {"b": torch.randn(5, 4, generator=g)}}
    member = TensorDict({"w": torch.zeros(4, 3), "n": {"b": torch.zeros(4)}}, [])
    spec = pytree.tree_structure(member)

    def f(w, b):
        td = pytree.tree_unflatten([w, b], spec)
        assert td.batch_size == torch.Size([]) and td["n"].batch_size == torch.Size([])
        return td["n", "b"].sin() @ td["w"]

    out = vmap(f)(stacked["w"], stacked["n"]["b"])
    reference = torch.stack([stacked["n"]["b"][i].sin() @ stacked["w"][i] for i in range(5)])
    assert torch.allclose(out, reference)


def test_vmap_mixing_mapped_and_unmapped_leaves_is_an_error():
    td = TensorDict({"a": torch.randn(2, 3), "b": torch.randn(2, 3)}, [2])
    in_dims = dims_like(td, 0, {"b": None})
    with pytest.raises(ValueError, match=r"cannot infer the batch size .* same batch dim"):
        vmap(lambda t: t["a"], (in_dims,))(td)


@pytest.mark.parametrize("feature", [(1,), (4,)])
def test_feature_size_equal_to_batch_size(feature):
    g = _gen(6)
    raw = {"x": torch.randn(4, *feature, generator=g), "y": torch.randn(4, 4, 4, generator=g)}
    td = TensorDict(raw, [4])
    inside = []

    def f(t):
        inside.append(t.batch_size)
        return t.apply(torch.sin)

    out = vmap(f)(td)
    assert inside == [torch.Size([])] and out.batch_size == torch.Size([4])
    _assert_close(out, vmap(lambda d: pytree.tree_map(torch.sin, d))(raw))
    swapped = vmap(lambda t: t.apply(torch.sin), out_dims=1)(TensorDict({"y": raw["y"]}, [4, 4]))
    assert swapped.batch_size == torch.Size([4, 4])
    assert torch.allclose(swapped["y"], raw["y"].sin().transpose(0, 1))
    for transform in (jacrev, jacfwd):
        jac = transform(lambda t: t.apply(torch.sin))(TensorDict({"x": raw["x"]}, [4]))
        reference = transform(lambda d: pytree.tree_map(torch.sin, d))({"x": raw["x"]})
        assert torch.allclose(jac["x", "x"], reference["x"]["x"])
        # one block: output leaf shape (4, *feature) + input batch [4]
        assert jac["x"].batch_size == torch.Size([4, *feature, 4])
        assert jac.batch_size == jac["x"].batch_size


# ---------------------------------------------------------------- grad and jacobians
def _loss(tree):
    return (
        (tree["a"].sin() * 3).sum() + (tree["n"]["b"] ** 3).sum() + tree["n"]["m"]["c"].tanh().sum()
    )


def _td_loss(td):
    return (td["a"].sin() * 3).sum() + (td["n", "b"] ** 3).sum() + td["n", "m", "c"].tanh().sum()


def test_grad_matches_plain_dicts():
    raw = _raw(7)
    td = _td(raw)
    out = grad(_td_loss)(td)
    _assert_close(out, grad(_loss)(raw))
    assert type(out) is TensorDict and out.batch_size == td.batch_size
    assert out["n", "m"].batch_size == torch.Size([2, 3, 5])


def test_grad_with_aux_and_argnums():
    raw = _raw(8)
    x = torch.randn(4)

    def f(td, x):
        loss = _td_loss(td) * x.sum()
        return loss, td.apply(lambda t: t * 2)

    (g_td, g_x), aux = grad(f, argnums=(0, 1), has_aux=True)(_td(raw), x)

    def reference(d, x):
        return _loss(d) * x.sum(), pytree.tree_map(lambda t: t * 2, d)

    (r_td, r_x), r_aux = grad(reference, argnums=(0, 1), has_aux=True)(raw, x)
    _assert_close(g_td, r_td)
    _assert_close(aux, r_aux)
    assert torch.allclose(g_x, r_x) and aux.batch_size == torch.Size([2, 3])


@pytest.mark.parametrize("transform", [jacrev, jacfwd])
def test_jacobians_match_plain_dicts(transform):
    g = _gen(9)
    raw = {"a": torch.randn(3, 2, generator=g), "n": {"b": torch.randn(3, generator=g)}}
    td = TensorDict(raw, [3])

    def f(tree):
        return {"s": tree["a"].sin().sum(-1) * tree["n"]["b"], "t": tree["n"]["b"].exp()}

    def f_td(t):
        return TensorDict(f(t), t.batch_size)

    out = transform(f_td)(td)
    reference = transform(f)(raw)
    _assert_close(out, reference)
    # a block per (output leaf, input): output leaf shape (3,) + input batch [3]
    assert out["s"].batch_size == out["t"].batch_size == torch.Size([3, 3])
    assert out["s", "a"].shape == (3, 3, 2)
    assert out.batch_size == torch.Size([3, 3])  # the prefix the blocks share

    def g_td(t):
        return TensorDict({"s": t["n", "b"].exp(), "u": t["a"].cos()}, t.batch_size)

    out = transform(g_td)(td)
    assert out["u"].batch_size == torch.Size([3, 2, 3])
    assert out.batch_size == torch.Size([3])


def test_jacobian_of_a_scalar_function_is_shaped_like_the_input():
    raw = _raw(10)
    td = _td(raw)
    for transform in (jacrev, jacfwd):
        out = transform(_td_loss)(td)
        _assert_close(out, grad(_loss)(raw), atol=1e-5)
        assert out.batch_size == td.batch_size


def test_hessian_matches_plain_dicts():
    g = _gen(11)
    raw = {"a": torch.randn(2, 3, generator=g), "n": {"b": torch.randn(2, generator=g)}}
    td = TensorDict(raw, [2])

    def loss(tree):
        return (tree["a"].sin() * tree["n"]["b"].unsqueeze(-1)).sum()

    out = hessian(loss)(td)
    reference = hessian(loss)(raw)
    _assert_close(out, reference, atol=1e-5)
    assert out.batch_size == torch.Size([2])
    assert out["a", "n", "b"].shape == (2, 3, 2)


def test_jvp_with_tangents_of_another_batch_size():
    raw = _raw(12)
    td = _td(raw)
    tangent_raw = pytree.tree_map(torch.ones_like, raw)
    # same keys, different batch size: the specs are equal (structure only)
    tangents = TensorDict(tangent_raw, [2])
    primal_out, tangent_out = jvp(lambda t: t.apply(torch.sin), (td,), (tangents,))
    r_primal, r_tangent = jvp(lambda d: pytree.tree_map(torch.sin, d), (raw,), (tangent_raw,))
    _assert_close(primal_out, r_primal)
    _assert_close(tangent_out, r_tangent)
    assert tangent_out.batch_size == torch.Size([2, 3])


def test_vjp_matches_plain_dicts():
    raw = _raw(13)
    out, pullback = vjp(lambda t: t.apply(torch.sin), _td(raw))
    _, r_pullback = vjp(lambda d: pytree.tree_map(torch.sin, d), raw)
    cotangent = pytree.tree_map(torch.ones_like, raw)
    (got,) = pullback(out.apply(torch.ones_like))
    (want,) = r_pullback(cotangent)
    _assert_close(got, want)
    assert got.batch_size == torch.Size([2, 3])


def test_vmap_of_grad_per_member():
    g = _gen(14)
    raw = {"w": torch.randn(5, 3, generator=g), "n": {"b": torch.randn(5, generator=g)}}
    x = torch.randn(3, generator=g)

    def loss(p, x):
        return ((p["w"] @ x + p["n"]["b"]) ** 2).sum()

    out = vmap(grad(loss), (0, None))(TensorDict(raw, [5]), x)
    _assert_close(out, vmap(grad(loss), (0, None))(raw, x))
    assert out.batch_size == torch.Size([5])


# ---------------------------------------------------------------- TensorClass
class _Params(TensorClass["frozen"]):
    w: torch.Tensor
    b: torch.Tensor


def test_grad_and_vmap_over_a_frozen_tensorclass():
    g = _gen(15)
    w, b, x = torch.randn(4, 2, 3, generator=g), torch.randn(4, 2, generator=g), torch.randn(3)
    params = _Params(w=w, b=b, batch_size=[4])

    def loss(p, x):
        return (torch.tanh(p.w @ x + p.b) ** 2).sum()

    out = vmap(grad(loss), (0, None))(params, x)
    reference = vmap(grad(lambda d, x: loss(_Ref(**d), x)), (0, None))({"w": w, "b": b}, x)
    assert type(out) is _Params and out.batch_size == torch.Size([4])
    assert torch.allclose(out.w, reference["w"]) and torch.allclose(out.b, reference["b"])


class _Ref:
    """A plain attribute holder for the reference (no tdfunc)."""

    def __init__(self, w, b):
        self.w, self.b = w, b
