"""``pack`` and ``PackLayout``: the packed tensor equals the leaves flattened and
concatenated by hand, ``unpack`` gives the container back as views, tensordict 0.15.3 gives
the same (run in its own process), and the errors name the API and the problem."""

# The probe below is one script run by both libraries; its lines are long.
# ruff: noqa: E501
from __future__ import annotations

import pickle

import pytest
import tensordict_peer
import torch

from tdfunc import PackLayout, TensorDict, tensorclass

PROBE = r"""
import torch
from LIB import TensorDict, PackLayout
def run(f):
    try: return f()
    except Exception as e: return type(e).__name__
g = torch.Generator().manual_seed(0)
td = TensorDict(p=torch.randn(5, generator=g), v=torch.randn(5, 3, generator=g), nested=TensorDict(stress=torch.randn(5, 2, 3, 3, generator=g), batch_size=[5, 2]), a_b=torch.randn(5, 1, 2, generator=g), batch_size=[5])
for dim in (-2, -1, 0, 1):
    flat, layout = td.pack(dim)
    print(dim, list(flat.shape), flat.is_contiguous(), layout.keys, [list(s) for s in layout.shapes], layout.dim, layout.offsets, layout.numel, [(k, list(s), c) for k, s, c in layout.nested])
    print(flat.flatten().round(decimals=3).tolist()[:12], bool((layout.unpack(flat) == td).all()))
flat, layout = td.pack()
out = layout.unpack(flat.index_select(0, torch.tensor([0, 2])))
print(list(out.batch_size), list(out["nested"].batch_size), list(layout.unpack(flat.unsqueeze(0)).batch_size))
print(bool((td.pack(layout=layout)[0] == flat).all()), td.pack(0)[1] == layout, hash(td.pack(1)[1]) == hash(layout))
m = TensorDict(a=torch.randn(2, 3, 4, generator=g), b=torch.randn(2, 3, generator=g), batch_size=[2, 3])
for dim in (-3, -1, 0, 2):
    fl, la = m.pack(dim)
    print(list(fl.shape), la.dim, bool((la.unpack(fl) == m).all()))
print(run(lambda: td.pack(layout=td.pack(0)[1])), run(lambda: td.exclude("p").pack(layout=layout)), run(lambda: td.pack(2)), run(lambda: td.pack(-3)))
print(run(lambda: TensorDict(a=torch.zeros(2), b=torch.zeros(2, dtype=torch.long), batch_size=[2]).pack()), run(lambda: TensorDict(a=torch.zeros(2), s="x", batch_size=[2]).pack()), run(lambda: layout.unpack(flat[:, :5])))
e, el = TensorDict(batch_size=[3]).pack()
print(list(e.shape), e.dtype, el.keys, el.numel, list(TensorDict(a=torch.zeros(())).pack()[0].shape))
print(PackLayout(keys=("a",), shapes=([2],)) == PackLayout(keys=("a",), shapes=(torch.Size([2]),)))
print(run(lambda: td.pack(layout=PackLayout(keys=("p", "v", ("nested", "stress"), "a_b"), shapes=([], [4], [2, 3, 3], [1, 2])))))
"""


@pytest.mark.slow  # a tensordict process
def test_pack_as_tensordict():
    expected, got = tensordict_peer.printed_by_both(PROBE)
    assert got == expected


def _corpus():
    g = torch.Generator().manual_seed(0)
    yield TensorDict(
        p=torch.randn(4, generator=g), v=torch.randn(4, 3, generator=g), batch_size=[4]
    )
    yield TensorDict(x=torch.randn(3, generator=g))  # 0-d batch
    yield TensorDict(
        n={"deep": {"x": torch.randn(2, 5, generator=g)}},
        y=torch.randn(2, 2, 2, generator=g),
        batch_size=[2],
    )
    yield TensorDict(
        a=torch.randn(2, 3, 4, generator=g), b=torch.randn(2, 3, generator=g), batch_size=[2, 3]
    )
    yield TensorDict(a=torch.randn(0, 2, generator=g), batch_size=[0])  # no rows
    yield TensorDict(a=torch.randn(3, 4, generator=g)[:, ::2], batch_size=[3])  # not contiguous


@pytest.mark.parametrize("case", range(6))
def test_pack_equals_a_cat_of_the_flattened_leaves(case):
    td = list(_corpus())[case]
    ndim = td.batch_dims
    keys = list(td.keys(True, True, sort=True))
    columns = [td[k].reshape(*td.batch_size, td[k].shape[ndim:].numel()) for k in keys]
    reference = torch.cat(columns, dim=-1)
    for dim in range(-(ndim + 1), ndim + 1):
        flat, layout = td.pack(dim)
        assert torch.equal(flat, reference.movedim(-1, dim)) and flat.is_contiguous()
        out = layout.unpack(flat)
        assert sorted(out.keys(True, True), key=str) == sorted(keys, key=str)
        for key in keys:
            assert torch.equal(out[key], td[key])
        if flat.numel():
            assert out[keys[0]].untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_the_layout_is_a_value():
    td = next(_corpus())
    _, layout = td.pack()
    assert layout == PackLayout(keys=("p", "v"), shapes=([], [3]), dim=-1)
    assert hash(layout) == hash(PackLayout(keys=("p", "v"), shapes=(torch.Size([]), (3,))))
    assert pickle.loads(pickle.dumps(layout)) == layout
    with pytest.raises(AttributeError):
        layout.dim = 0  # frozen
    assert layout.offsets == (0, 1) and layout.numel == 4


@tensorclass
class _Particle:
    pos: torch.Tensor
    vel: torch.Tensor
    tag: torch.Tensor = None


@tensorclass
class _Swarm:
    particle: _Particle
    weight: torch.Tensor


def test_tensorclasses_come_back_with_their_class():
    swarm = _Swarm(
        particle=_Particle(pos=torch.randn(4, 3), vel=torch.randn(4, 3), batch_size=[4]),
        weight=torch.rand(4),
        batch_size=[4],
    )
    flat, layout = swarm.pack()
    assert layout.cls is _Swarm and layout.nested == (("particle", torch.Size([]), _Particle),)
    out = layout.unpack(flat[1:3])
    assert type(out) is _Swarm and type(out.particle) is _Particle and out.particle.tag is None
    assert torch.equal(out.particle.pos, swarm.particle.pos[1:3])
    # gradients flow through the packed tensor
    leaf = torch.randn(4, 3, requires_grad=True)
    flat, layout = TensorDict(x=leaf, batch_size=[4]).pack()
    layout.unpack(flat * 2)["x"].sum().backward()
    assert torch.equal(leaf.grad, torch.full((4, 3), 2.0))


def test_hostile_inputs():
    td = TensorDict(
        a=torch.ones(2, 3), n={"empty": TensorDict(batch_size=[2])}, batch_size=[2], names=["row"]
    ).lock_()
    flat, layout = td.pack()
    out = layout.unpack(flat)
    assert out["n", "empty"].batch_size == torch.Size([2]) and td.is_locked
    empty, layout = TensorDict(batch_size=[3]).pack()
    assert empty.shape == (3, 0) and layout.unpack(empty).batch_size == torch.Size([3])


def test_errors_name_the_api_and_the_problem():
    td = next(_corpus())
    flat, layout = td.pack()
    with pytest.raises(
        ValueError,
        match=r"TensorDict.pack: cannot pack along dim -2 \(counted from the end\) with a layout packed along dim -1",
    ):
        td.pack(0, layout=layout)
    with pytest.raises(
        KeyError,
        match=r"the leaves differ from the layout's keys: missing \['p'\], not in the layout \[\]",
    ):
        td.exclude("p").pack(layout=layout)
    with pytest.raises(
        ValueError, match=r"the leaf 'v' has the feature shape \[3\]; the layout has \[4\]"
    ):
        td.pack(layout=PackLayout(keys=("p", "v"), shapes=([], [4])))
    with pytest.raises(IndexError, match=r"dim must be in \[-2, 1\] for the batch size \[4\]"):
        td.pack(2)
    with pytest.raises(
        TypeError,
        match=r"the leaves must share one dtype: torch.float32 at 'p', torch.int64 at 'q'",
    ):
        td.set("q", torch.zeros(4, dtype=torch.long)).pack()
    with pytest.raises(TypeError, match=r"cannot pack the non-tensor entry 's'"):
        TensorDict(s="text", batch_size=[]).pack()
    with pytest.raises(ValueError, match=r"PackLayout.unpack: expected 4 entries along dim -1"):
        layout.unpack(flat[:, :3])
    with pytest.raises(TypeError, match=r"PackLayout.unpack: expected the packed tensor"):
        layout.unpack([1.0])
    with pytest.raises(TypeError, match=r"layout must be a PackLayout, got dict"):
        td.pack(layout={"keys": ("p",)})
    with pytest.raises(ValueError, match=r"PackLayout: 2 keys but 1 shapes"):
        PackLayout(keys=("a", "b"), shapes=([],))
    with pytest.raises(
        TypeError, match=r"PackLayout: each of shapes must be a torch.Size or a list of ints"
    ):
        PackLayout(keys=("a",), shapes=([-1],))


def test_a_layout_reused_on_another_container_describes_that_container():
    # pack(layout=) handed the given layout back: unpack then rebuilt the container the
    # layout came from (its class, its nested levels), not the one packed
    swarm = _Swarm(
        particle=_Particle(pos=torch.randn(4, 3), vel=torch.randn(4, 3), batch_size=[4]),
        weight=torch.rand(4),
        batch_size=[4],
    )
    _, layout = swarm.pack()
    plain = TensorDict(
        particle=TensorDict(pos=torch.randn(4, 3), vel=torch.randn(4, 3), batch_size=[4, 3]),
        weight=torch.rand(4),
        empty=TensorDict(batch_size=[4]),
        batch_size=[4],
    )
    flat, mine = plain.pack(layout=layout)
    assert mine.keys == layout.keys and mine.offsets == layout.offsets
    assert mine.cls is None and mine.nested == (
        ("empty", torch.Size([]), None),
        ("particle", torch.Size([3]), None),
    )
    out = mine.unpack(flat)
    assert type(out) is TensorDict and type(out["particle"]) is TensorDict
    assert out["particle"].batch_size == (4, 3) and out["empty"].batch_size == (4,)
    assert (out == plain).all()
    # the same structure gives the very layout it was given (a cache keyed on it holds)
    again = _Swarm(
        particle=_Particle(pos=torch.zeros(2, 3), vel=torch.zeros(2, 3), batch_size=[2]),
        weight=torch.zeros(2),
        batch_size=[2],
    )
    assert again.pack(layout=layout)[1] is layout


def test_a_nested_tensor_leaf_is_refused_by_name():
    # it failed inside torch with an AttributeError about a NestedIntNode
    ragged = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    td = TensorDict(x=torch.zeros(2), obs=TensorDict(r=ragged, batch_size=[2]), batch_size=[2])
    with pytest.raises(
        TypeError, match=r"TensorDict.pack: cannot pack the nested tensor at \('obs', 'r'\)"
    ):
        td.pack()
