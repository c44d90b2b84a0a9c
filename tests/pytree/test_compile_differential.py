"""TensorDict and TensorClass under ``torch.compile`` and ``torch.export``, against eager.

Every compiled function is checked three ways: its result equals the same function
run eagerly (and, where it has one, the same function compiled on a plain dict of
tensors); ``fullgraph=True`` makes any graph break an error; the ``CompileCounter``
backend counts graphs, so a fresh instance of the same shapes that recompiles fails.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.export import Dim, export
from torch.func import functional_call, grad

from tdfunc import TensorDict, optim, tensorclass


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@tensorclass(frozen=True)
class _Batch:
    obs: torch.Tensor
    act: torch.Tensor
    tag: str = "train"


@tensorclass
class _Params:
    w: torch.Tensor


def _td(seed: int, rows: int = 4) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        a=torch.randn(rows, 3, generator=g) + 0.5,
        b=TensorDict(c=torch.randn(rows, 2, generator=g), batch_size=[rows]),
        batch_size=[rows],
    )


def _plain(td) -> dict:
    return {key: td.get(key) for key in td.keys(True, True)}


def _assert_same(got, want) -> None:
    assert type(got) is type(want)
    assert got.batch_size == want.batch_size
    assert sorted(map(str, got.keys(True, True))) == sorted(map(str, want.keys(True, True)))
    for key in want.keys(True, True):
        torch.testing.assert_close(got.get(key), want.get(key), rtol=0, atol=0)


def _compiled(fn, **kwargs):
    counter = CompileCounter()
    return torch.compile(fn, backend=counter, fullgraph=True, **kwargs), counter


# ---------------------------------------------------------------- one graph, no recompile
@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda td: td.view(-1, 1), id="view-inferred"),
        pytest.param(lambda td: td.reshape(2, -1), id="reshape-inferred"),
        pytest.param(lambda td: (td * 2 + td.exp())[1:3].apply(torch.sin), id="arith-index"),
        pytest.param(lambda td: torch.stack([td, td], 1).unbind(0)[2], id="stack-unbind"),
    ],
)
def test_out_of_place_ops_one_graph_for_fresh_instances(fn):
    compiled, counter = _compiled(fn)
    for seed in range(3):
        _assert_same(compiled(_td(seed)), fn(_td(seed)))
    assert counter.frame_count == 1


def test_in_place_methods_and_index_writes_match_eager():
    def step(td, sub):
        td.mul_(2.0)
        td["a"].add_(1)
        td[0] = sub
        td[1:3] = td[2:4].clone()
        td.set(("b", "new"), td["b", "c"] * 3)
        return td["a"].sum()

    compiled, counter = _compiled(step)
    for seed in range(2):
        got, want = _td(seed), _td(seed)
        sub = _td(10 + seed)[0]
        torch.testing.assert_close(compiled(got, sub), step(want, sub))
        _assert_same(got, want)
    assert counter.frame_count == 1


def test_in_place_dtype_error_changes_nothing_under_compile():
    def scale(td):
        td.mul_(0.5)
        return td

    td = _td(0)
    td["count"] = torch.ones(4, dtype=torch.long)
    before = td.clone()
    with pytest.raises(RuntimeError, match=r"cannot update the torch\.int64 entry"):
        torch.compile(scale, backend="eager")(td)
    _assert_same(td, before)


def test_index_write_into_expanded_entry_refused_under_compile():
    def write(td, sub):
        td[0] = sub
        return td

    td = TensorDict(a=torch.zeros(3).expand(4, 3), batch_size=[4])
    with pytest.raises(Exception, match="share memory"):
        torch.compile(write, backend="eager")(td, TensorDict(a=torch.ones(3)))
    assert torch.equal(td["a"], torch.zeros(4, 3))


def test_frozen_batch_built_read_and_returned_inside_compile():
    def fn(obs, act, batch):
        made = _Batch(obs=obs * 2, act=act, tag="made", batch_size=[obs.shape[0]])
        scaled = batch * obs[:, :1]  # a frozen instance and a tensor operand
        bonus = 1.0 if batch.tag == "train" else -1.0
        return made, scaled, batch.obs.sum(-1) * bonus

    compiled, counter = _compiled(fn)
    for seed in range(2):
        g = torch.Generator().manual_seed(seed)
        obs, act = torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)
        batch = _Batch(obs=obs + 1, act=act, batch_size=[4])
        got, want = compiled(obs, act, batch), fn(obs, act, batch)
        for left, right in zip(got[:2], want[:2]):
            _assert_same(left, right)
            assert left.tag == right.tag and left._frozen
        torch.testing.assert_close(got[2], want[2])
    assert counter.frame_count == 1


def test_operators_with_tensor_operands():
    # the forms dynamo can tell apart from an in-place operator: one graph, eager results
    def fn(td, t):
        return t - td, t / td, t**td, (td < t).float(), (t == td).float(), t // td

    compiled, counter = _compiled(fn)
    for seed in range(2):
        td, t = _td(seed), torch.rand(4, 1) + 0.5
        for got, want in zip(compiled(td, t), fn(td, t)):
            _assert_same(got, want)
    assert counter.frame_count == 1


def test_ambiguous_operator_on_mutable_container_is_refused_then_right_eagerly():
    def fn(td, t):
        alias = td
        td += t  # in place: ``alias`` sees it
        return alias

    td, t = _td(0), torch.full((4, 1), 2.0)
    with pytest.raises(Exception, match="cannot tell whether to update the TensorDict"):
        torch.compile(fn, backend="eager", fullgraph=True)(td, t)
    want = fn(_td(0), t)
    got = torch.compile(fn, backend="eager")(td, t)  # the graph breaks; Python decides
    assert got is td
    _assert_same(got, want)


# ---------------------------------------------------------------- shapes
def test_new_batch_sizes_recompile_or_stay_dynamic_never_wrong():
    def fn(td):
        return (td * 2).sum(0), td[1:-1], td.reshape(-1, 1)

    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    for rows in (4, 5, 7, 9):
        for got, want in zip(compiled(_td(rows, rows)), fn(_td(rows, rows))):
            _assert_same(got, want)


def test_dynamic_batch_slices_without_recompiles():
    def fn(td):
        return td[1:] * 2, td[:-1].sum(0)

    def plain(d):  # the same function on a plain dict of tensors
        return {k: v[1:] * 2 for k, v in d.items()}

    compiled, counter = _compiled(fn, dynamic=True)
    plain_compiled, plain_counter = _compiled(plain, dynamic=True)
    for rows in (5, 6, 8):
        td = TensorDict(a=torch.randn(rows, 2), batch_size=[rows])
        for got, want in zip(compiled(td), fn(td)):
            _assert_same(got, want)
        torch.testing.assert_close(plain_compiled(_plain(td))["a"], fn(td)[0]["a"])
    assert counter.frame_count == plain_counter.frame_count == 1


# ---------------------------------------------------------------- modules, transforms, optim
def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))


def test_to_module_and_grad_step_match_functional_call_on_dicts():
    template = _mlp(0)
    x, y = torch.randn(5, 3), torch.randn(5, 2)

    def loss(p):
        with p.to_module(template):
            return ((template(x) - y) ** 2).mean()

    def step(p):
        return p - 0.1 * grad(loss)(p)

    def reference(model):
        params = {k: v.detach() for k, v in model.named_parameters()}
        grads = grad(lambda d: ((functional_call(template, d, (x,)) - y) ** 2).mean())(params)
        return {k: params[k] - 0.1 * grads[k] for k in params}

    compiled, counter = _compiled(step)
    for seed in (1, 2):
        model = _mlp(seed)
        got = compiled(TensorDict.from_module(model).detach())
        for name, value in reference(model).items():
            torch.testing.assert_close(got.get(tuple(name.split("."))), value)
    assert counter.frame_count == 1


def test_functional_optimizer_steps_one_graph():
    opt = optim.adam(lr=0.1)

    def update(p, g, state):
        updates, state = opt.update(g, state, p)
        return optim.apply_updates(p, updates), state

    compiled, counter = _compiled(update)
    params, state = _td(0), opt.init(_td(0))
    eager_params, eager_state = _td(0), opt.init(_td(0))
    for seed in range(1, 4):
        params, state = compiled(params, _td(seed), state)
        eager_params, eager_state = update(eager_params, _td(seed), eager_state)
        _assert_same(params, eager_params)
    assert counter.frame_count == 1


# ---------------------------------------------------------------- torch.export
class _Reshaper(nn.Module):
    def forward(self, td):
        out = td.clone()
        out["a"] = out["a"] + 1
        return out.reshape(-1)[1:]


def test_export_nested_reshape_and_slice_keep_the_batch_dim_dynamic():
    batch = Dim("batch", min=3)
    program = export(_Reshaper(), (_td(0),), dynamic_shapes=([{0: batch}, {0: batch}],))
    for rows in (4, 7):
        got = program.module()(_td(rows, rows))
        assert type(got) is TensorDict and got.batch_size == torch.Size([rows - 1])
        _assert_same(got, _Reshaper()(_td(rows, rows)))


class _Reader(nn.Module):
    def forward(self, td, batch):
        return td["a"].sin() + td["b", "c"].sum(-1, keepdim=True) + batch.obs


def test_strict_export_of_container_inputs_keeps_the_batch_dim_dynamic():
    batch = Dim("batch", min=2)
    frozen = _Batch(obs=torch.ones(4, 3), act=torch.ones(4, 2), batch_size=[4])
    program = export(
        _Reader(),
        (_td(0), frozen),
        dynamic_shapes=([{0: batch}, {0: batch}], [{0: batch}, {0: batch}]),
        strict=True,
    )
    for rows in (4, 7):
        frozen = _Batch(obs=torch.randn(rows, 3), act=torch.ones(rows, 2), batch_size=[rows])
        got = program.module()(_td(rows, rows), frozen)
        torch.testing.assert_close(got, _Reader()(_td(rows, rows), frozen))


def test_stack_and_cat_of_non_tensor_values_one_graph():
    def fn(batch, td):
        return torch.stack([batch, batch], 1), torch.cat([td, td], -1)

    def inputs():
        batch = _Batch(obs=torch.ones(2, 3), act=torch.ones(2, 2), tag="eval", batch_size=[2])
        rows = [TensorDict(a=torch.full((3,), float(j)), s=f"v{j}") for j in range(2)]
        return batch, torch.stack(rows)

    compiled, counter = _compiled(fn)
    got, want = compiled(*inputs()), fn(*inputs())
    for left, right in zip(got, want):
        _assert_same(left, right)
    assert got[0].tag == want[0].tag == [["eval", "eval"], ["eval", "eval"]]
    assert got[1]["s"] == want[1]["s"] == ["v0", "v1", "v0", "v1"]
    assert counter.frame_count == 1


def test_indexing_per_element_non_tensor_values_one_graph_and_still_a_view():
    def batch():
        rows = [
            TensorDict(a=torch.full((2,), float(j)), s=[f"{j}a", f"{j}b"], batch_size=[2])
            for j in range(4)
        ]
        return torch.stack(rows)  # "s": one string per element of the batch [4, 2]

    def fn(td):
        return td[1:3], td[2], td[1:, -1]

    compiled, counter = _compiled(fn)
    source = batch()
    got, want = compiled(source), fn(batch())
    for left, right in zip(got, want):
        _assert_same(left, right)
        assert left["s"] == right["s"]
    got[0][0, 0] = TensorDict(a=torch.tensor(-1.0), s="new")  # a view, as in eager code
    assert source["s"][1][0] == "new" and source["a"][1, 0] == -1
    assert counter.frame_count == 1
