"""Differential test: random sequences of shape ops against torch on every leaf.

Hypothesis draws a container (TensorDict or TensorClass; 0 to 3 batch dims; feature
dims; a nested level with batch dims of its own; a ``NonTensorData`` or a
``NonTensorStack``; dim names or none) and a sequence of shape ops. The reference never
goes through tdfunc: each tensor leaf gets torch's op with the batch dims of the top
level (its other dims follow along), each level's batch size is torch's shape for a
tensor of that level's batch shape, and a non-tensor entry is a tensor of codes (one per
element) that moves as a tensor would. After every op the leaves, batch sizes, names and
non-tensor values must match; where torch raises, the container must raise too. At the
end, a write into the result must reach the original leaves exactly when it does for
torch's op on the tensors (views vs copies).
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from tdfunc import NonTensorStack, TensorClass, TensorDict

SETTINGS = settings(
    max_examples=int(os.environ.get("TDFUNC_HUNT_EXAMPLES", 80)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
VALUES = ["v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7"]  # non-tensor values by code
DROP = object()  # an op after which no batch dim of the top level keeps a name
ANY = "<any name>"  # a nested level's own dim after DROP: its name is not checked


class Box(TensorClass):
    a: torch.Tensor
    n: TensorDict
    s: Any


# ---------------------------------------------------------------- reference state
class Ref:
    """The container as plain tensors: leaves, each level's batch shape and names."""

    def __init__(self, leaves, levels, names, codes):
        self.leaves = leaves  # path -> tensor
        self.levels = levels  # level path -> batch shape (tuple)
        self.names = names  # level path -> list of names
        self.codes = codes  # path of a non-tensor entry -> int64 codes of its level's batch


def _apply_ref(ref: Ref, op: dict) -> Ref:
    r = len(ref.levels[()])
    fn, nt = op["leaf"], op.get("nt", op["leaf"])
    leaves = {p: fn(t, r) for p, t in ref.leaves.items()}
    levels = {p: tuple(fn(torch.empty(s), r).shape) for p, s in ref.levels.items()}
    codes = {p: nt(c, r) for p, c in ref.codes.items()}
    top = op["names"](ref.names[()], r)
    new_r = len(levels[()])
    names = {}
    for level, old in ref.names.items():
        if top is DROP:  # the top level's names are gone; a nested level's own may stay
            names[level] = [None] * new_r + [ANY] * (len(levels[level]) - new_r)
        else:
            names[level] = list(top) + list(old[r:])
    return Ref(leaves, levels, names, codes)


def _set_batch_size(new: tuple):
    """The reference of ``container.batch_size = new``: the leaves stay; a top-level
    ``NonTensorData`` takes the new batch; names of the dims kept stay, new dims have none."""
    k = len(new)

    def ref_fn(ref: Ref, container) -> Ref:
        r = len(ref.levels[()])
        top_entries = [t.shape for p, t in ref.leaves.items() if len(p) == 1]
        top_entries += [torch.Size(s) for p, s in ref.levels.items() if len(p) == 1]
        codes = dict(ref.codes)
        for path, c in ref.codes.items():
            if len(path) != 1:
                continue
            entry = _entry(container, path)
            if type(entry) is NonTensorStack:
                top_entries.append(c.shape)
            else:  # one value, whatever the batch
                codes[path] = torch.full(new, VALUES.index(entry.data))
        if any(tuple(shape[:k]) != new for shape in top_entries):
            raise ValueError(f"batch size {list(new)} does not fit {top_entries}")
        names = dict(ref.names)
        names[()] = list(ref.names[()][:k]) + [None] * (k - r)
        if k > r:  # a nested level shares the new dim: it takes its (lack of) name
            for level, old in ref.names.items():
                if level:
                    names[level] = names[()] + list(old[k:])
        levels = dict(ref.levels)
        levels[()] = new
        return Ref(dict(ref.leaves), levels, names, codes)

    return ref_fn


# ---------------------------------------------------------------- containers
@st.composite
def containers(draw):
    rank = draw(st.integers(0, 3))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    if rank and draw(st.integers(0, 9)) == 0:  # an empty dim, now and then
        batch = batch[:-1] + (0,)
    feature = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    extra = tuple(draw(st.lists(st.integers(1, 3), max_size=1)))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(batch + feature, generator=gen)
    b = torch.randn(batch + extra + (2,), generator=gen)
    if draw(st.booleans()) and a.dim() >= 2:  # a non-contiguous leaf: reshape copies it
        a = a.transpose(0, -1).contiguous().transpose(0, -1)
    named = draw(st.booleans())
    top_names = [f"d{i}" for i in range(rank)] if named else [None] * rank
    own = [draw(st.sampled_from([None, "e"])) for _ in extra]
    inner = batch + extra
    if draw(st.booleans()):
        inner_codes = torch.randint(0, len(VALUES), inner, generator=gen)
        t = NonTensorStack.from_list(_decode(inner_codes), batch_size=list(inner))
    else:
        inner_codes, t = torch.full(inner, 1), VALUES[1]
    nested = TensorDict({"b": b, "t": t}, list(inner))
    if named or any(own):
        nested.names = top_names + own
    stacked = rank and draw(st.booleans())
    if stacked:
        codes = torch.randint(0, len(VALUES), batch, generator=gen)
        s = NonTensorStack.from_list(_decode(codes), batch_size=list(batch))
    else:
        codes = torch.zeros(batch, dtype=torch.int64)
        s = VALUES[0]
    if draw(st.booleans()):
        container = Box(a=a, n=nested, s=s, batch_size=list(batch))
    else:
        container = TensorDict({"a": a, "n": nested, "s": s}, list(batch))
    if named:
        container.names = top_names
    ref = Ref(
        {("a",): a.clone(), ("n", "b"): b.clone()},
        {(): batch, ("n",): batch + extra},
        {(): top_names, ("n",): top_names + own},
        {("s",): codes, ("n", "t"): inner_codes},
    )
    return container, ref


def _decode(codes: torch.Tensor) -> list:
    """The values a tensor of codes stands for, as a nested list (``-1``: ``None``)."""
    if codes.dim():
        return [_decode(c) for c in codes]
    return None if codes < 0 else VALUES[int(codes)]


# ---------------------------------------------------------------- ops
def _norm(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _rest(t: torch.Tensor, r: int) -> tuple:
    return tuple(range(r, t.dim()))


def _factor(draw, numel: int) -> list:
    """A shape with ``numel`` elements (maybe with one ``-1``)."""
    if numel == 0:
        return draw(st.sampled_from([[0], [0, 2], [2, 0, 1]]))
    shape = []
    left = numel
    for p in (2, 3):
        while left % p == 0 and draw(st.booleans()):
            shape.append(p)
            left //= p
    shape.append(left)
    shape = draw(st.permutations(shape))
    shape = list(shape) + [1] * draw(st.integers(0, 1))
    if draw(st.booleans()) and numel:
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    return shape


def _pad_dim(t: torch.Tensor, d: int, left: int, right: int, value) -> torch.Tensor:
    if left < 0:
        t = t.narrow(d, -left, t.shape[d] + left)
        left = 0
    if right < 0:
        t = t.narrow(d, 0, t.shape[d] + right)
        right = 0
    shape = list(t.shape)
    parts = []
    if left:
        shape[d] = left
        parts.append(torch.full(shape, value, dtype=t.dtype))
    parts.append(t)
    if right:
        shape[d] = right
        parts.append(torch.full(shape, value, dtype=t.dtype))
    return torch.cat(parts, d) if len(parts) > 1 else t.clone()


def _keep(names, r):
    return names


def _align(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return mask.reshape(mask.shape + (1,) * (t.dim() - mask.dim()))


@st.composite
def ops(draw, batch: tuple, dtype: torch.dtype):
    """One op for a container of batch size ``batch``: the container call and the reference."""
    r = len(batch)
    numel = math.prod(batch)
    names = ["reshape", "view", "flatten", "unsqueeze", "squeeze", "expand", "stack"]
    if dtype in (torch.float32, torch.int32):
        names += ["view_dtype"]
    if r:
        names += ["unflatten", "permute", "transpose", "movedim", "repeat", "repeat_interleave"]
        names += ["split", "chunk", "unbind", "tensor_split", "cat", "gather", "masked_select"]
        names += ["masked_fill", "where", "pad", "roll", "flip", "narrow", "torch_split"]
    names += ["batch_size"]
    name = draw(st.sampled_from(names))
    nd = lambda d: _norm(d, r)  # noqa: E731

    if name == "batch_size":  # the setter, in place: shrink, or grow by one dim
        grow = not r or draw(st.booleans())
        new = batch + (draw(st.integers(1, 3)),) if grow else batch[: draw(st.integers(0, r - 1))]

        def call(c):
            c.batch_size = list(new)
            return c

        return dict(name=f"batch_size = {list(new)}", call=call, ref=_set_batch_size(new))

    if name in ("reshape", "view"):
        shape = _factor(draw, numel)
        resolved = list(torch.empty(batch).reshape(shape).shape)
        as_list = draw(st.booleans())

        def call(c):
            return getattr(c, name)(shape) if as_list else getattr(c, name)(*shape)

        def leaf(t, r):
            return getattr(t, name)(resolved + list(t.shape[r:]))

        return dict(name=f"{name}{shape}", call=call, leaf=leaf, names=lambda n, r: DROP)
    if name == "view_dtype":
        target = torch.int32 if dtype == torch.float32 else torch.float32
        return dict(
            name=f"view({target})",
            call=lambda c: c.view(target),
            leaf=lambda t, r: t.view(target),
            nt=lambda t, r: t,
            names=_keep,
        )
    if name == "flatten":
        if not r:
            return dict(
                name="flatten()",
                call=lambda c: c.flatten(),
                leaf=lambda t, r: t.unsqueeze(0),
                names=lambda n, r: DROP,
            )
        start = draw(st.integers(-r, r - 1))
        end = draw(st.integers(-r, r - 1))
        if nd(start) > nd(end):
            start, end = end, start

        return dict(
            name=f"flatten({start}, {end})",
            call=lambda c: torch.flatten(c, start, end) if start < 0 else c.flatten(start, end),
            leaf=lambda t, r: t.flatten(_norm(start, r), _norm(end, r)),
            names=lambda n, r: (
                n[: nd(start)] + [None] + n[nd(end) + 1 :] if nd(start) != nd(end) else n
            ),
        )
    if name == "unflatten":
        dim = draw(st.integers(-r, r - 1))
        sizes = _factor(draw, batch[nd(dim)])
        return dict(
            name=f"unflatten({dim}, {sizes})",
            call=lambda c: c.unflatten(dim, sizes),
            leaf=lambda t, r: t.unflatten(_norm(dim, r), sizes),
            names=lambda n, r: (
                n if len(sizes) == 1 else n[: nd(dim)] + [None] * len(sizes) + n[nd(dim) + 1 :]
            ),
        )
    if name == "unsqueeze":
        dim = draw(st.integers(-r - 1, r))
        d = _norm(dim, r + 1)
        return dict(
            name=f"unsqueeze({dim})",
            call=lambda c: torch.unsqueeze(c, dim) if dim < 0 else c.unsqueeze(dim),
            leaf=lambda t, r: t.unsqueeze(d),
            names=lambda n, r: n[:d] + [None] + n[d:],
        )
    if name == "squeeze":
        if r and draw(st.booleans()):
            dim = draw(st.integers(-r, r - 1))
            dims = [nd(dim)] if batch[nd(dim)] == 1 else []
            call = lambda c: c.squeeze(dim)  # noqa: E731
            label = f"squeeze({dim})"
        else:
            dims = [d for d in range(r) if batch[d] == 1]
            call = lambda c: c.squeeze()  # noqa: E731
            label = "squeeze()"

        def leaf(t, r):
            for d in reversed(dims):
                t = t.squeeze(d)
            return t

        return dict(
            name=label,
            call=call,
            leaf=leaf,
            names=lambda n, r: [x for i, x in enumerate(n) if i not in dims],
        )
    if name == "expand":
        lead = tuple(draw(st.lists(st.integers(1, 2), max_size=1)))
        shape = list(lead) + [
            draw(st.sampled_from([-1, 2])) if s == 1 else draw(st.sampled_from([-1, s]))
            for s in batch
        ]
        resolved = list(lead) + [s if x == -1 else x for s, x in zip(batch, shape[len(lead) :])]
        form = draw(st.sampled_from(["args", "list", "expand_as", "broadcast_to"]))

        def call(c):
            if form == "args":
                return c.expand(*shape)
            if form == "list":
                return c.expand(shape)
            if form == "broadcast_to":
                return c.broadcast_to(resolved)
            return c.expand_as(torch.empty(resolved))

        return dict(
            name=f"{form}({shape})",
            call=call,
            leaf=lambda t, r: t.expand(resolved + list(t.shape[r:])),
            names=lambda n, r: [None] * len(lead) + n,
        )
    if name == "stack":
        dim = draw(st.integers(-r - 1, r))
        d = _norm(dim, r + 1)
        return dict(
            name=f"torch.stack(dim={dim})",
            call=lambda c: torch.stack([c, c], dim),
            leaf=lambda t, r: torch.stack([t, t], d),
            names=lambda n, r: n[:d] + [None] + n[d:],
        )
    if name == "cat":
        dim = draw(st.integers(-r, r - 1))
        return dict(
            name=f"torch.cat(dim={dim})",
            call=lambda c: torch.cat([c, c], dim),
            leaf=lambda t, r: torch.cat([t, t], _norm(dim, r)),
            names=_keep,
        )
    if name in ("permute", "transpose", "movedim"):
        if name == "permute":
            order = draw(st.permutations(range(r)))
            given = [d - r if draw(st.booleans()) else d for d in order]
            as_list = draw(st.booleans())
            call = (lambda c: c.permute(given)) if as_list else (lambda c: c.permute(*given))
        elif name == "transpose":
            d0, d1 = draw(st.integers(-r, r - 1)), draw(st.integers(-r, r - 1))
            order = list(range(r))
            order[nd(d0)], order[nd(d1)] = order[nd(d1)], order[nd(d0)]
            given = (d0, d1)
            call = lambda c: torch.transpose(c, d0, d1) if d0 < 0 else c.transpose(d0, d1)  # noqa: E731
        else:
            src = draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r, unique=True))
            dst = draw(
                st.lists(st.integers(0, r - 1), min_size=len(src), max_size=len(src), unique=True)
            )
            src = [d - r if draw(st.booleans()) else d for d in src]
            # torch says where each dim goes: strides 1..r tell the dims apart
            probe = torch.empty_strided((1,) * r, tuple(range(1, r + 1)), device="meta")
            order = [s - 1 for s in probe.movedim(src, dst).stride()]
            given = (src, dst)
            single = len(src) == 1 and draw(st.booleans())
            if single:
                call = lambda c: c.movedim(src[0], dst[0])  # noqa: E731
            else:
                call = lambda c: c.movedim(src, dst)  # noqa: E731
        return dict(
            name=f"{name}{given}",
            call=call,
            leaf=lambda t, r: t.permute(list(order) + list(_rest(t, r))),
            names=lambda n, r: [n[d] for d in order],
        )
    if name == "repeat":
        reps = [draw(st.integers(1, 2)) for _ in range(r + draw(st.integers(0, 1)))]
        return dict(
            name=f"repeat({reps})",
            call=lambda c: c.repeat(*reps) if len(reps) % 2 else torch.tile(c, reps),
            leaf=lambda t, r: t.repeat(reps + [1] * (t.dim() - r)),
            names=lambda n, r: [None] * (len(reps) - r) + n,
        )
    if name == "repeat_interleave":
        dim = draw(st.integers(-r, r - 1))
        k = draw(st.integers(1, 2))
        if draw(st.booleans()):  # one count per element
            gen = torch.Generator().manual_seed(draw(st.integers(0, 99)))
            k = torch.randint(0, 3, (batch[nd(dim)],), generator=gen)
        function = draw(st.booleans())
        return dict(
            name=f"repeat_interleave({k}, {dim})",
            call=lambda c: (
                torch.repeat_interleave(c, k, dim) if function else c.repeat_interleave(k, dim)
            ),
            leaf=lambda t, r: t.repeat_interleave(k, _norm(dim, r)),
            names=_keep,
        )
    if name in ("split", "chunk", "tensor_split", "torch_split", "unbind"):
        dim = draw(st.integers(-r, r - 1))
        n = batch[nd(dim)]
        arg = draw(st.integers(1, 3))
        if name in ("split", "torch_split") and n and draw(st.booleans()):
            arg = draw(st.lists(st.integers(0, n), min_size=1, max_size=3))
            arg = arg[:-1] + [n - sum(arg[:-1])] if sum(arg[:-1]) <= n else [n]
        method = "split" if name == "torch_split" else name
        probe = (
            torch.empty(batch).unbind(nd(dim))
            if name == "unbind"
            else getattr(torch.empty(batch), method)(arg, nd(dim))
        )
        if not probe:  # unbind of an empty dim: nothing to pick
            reject()
        pick = draw(st.integers(0, len(probe) - 1))

        def call(c):
            if name == "torch_split":
                return torch.split(c, arg, dim)[pick]
            if name == "unbind":
                return c.unbind(dim)[pick]
            return getattr(c, name)(arg, dim)[pick]

        def leaf(t, r):
            if name == "unbind":
                return t.unbind(_norm(dim, r))[pick]
            return getattr(t, method)(arg, _norm(dim, r))[pick]

        names = (
            (lambda n, r: [x for i, x in enumerate(n) if i != nd(dim)])
            if name == "unbind"
            else _keep
        )
        return dict(name=f"{name}({arg}, {dim})[{pick}]", call=call, leaf=leaf, names=names)
    if name == "gather":
        dim = draw(st.integers(-r, r - 1))
        size = list(batch)
        size[nd(dim)] = draw(st.integers(1, 3))
        if not batch[nd(dim)]:
            size[nd(dim)] = 0
        hi = max(batch[nd(dim)], 1)
        index = torch.randint(
            0, hi, size, generator=torch.Generator().manual_seed(draw(st.integers(0, 99)))
        )

        def leaf(t, r):
            extra = t.shape[r:]
            full = index.reshape(index.shape + (1,) * len(extra)).expand(index.shape + extra)
            return torch.gather(t, _norm(dim, r), full)

        return dict(
            name=f"gather({dim}, {size})",
            call=lambda c: c.gather(dim, index),
            leaf=leaf,
            names=_keep,
        )
    if name in ("masked_select", "masked_fill", "where"):
        k = draw(st.integers(1, r))
        mask = (
            torch.rand(batch[:k], generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
            > 0.5
        )
        if name == "masked_select":
            return dict(
                name=f"masked_select({list(mask.shape)})",
                call=lambda c: c.masked_select(mask),
                leaf=lambda t, r: t[mask],
                names=lambda n, r: DROP,
            )
        if name == "masked_fill":
            return dict(
                name=f"masked_fill({list(mask.shape)})",
                call=lambda c: c.masked_fill(mask, 7.0),
                leaf=lambda t, r: t.masked_fill(_align(mask, t), 7.0),
                nt=lambda t, r: t,
                names=_keep,
            )
        as_function = k == r and draw(st.booleans())
        return dict(
            name=f"where({list(mask.shape)})",
            call=lambda c: torch.where(mask, c, 7.0) if as_function else c.where(mask, 7.0),
            leaf=lambda t, r: torch.where(_align(mask, t), t, 7.0),
            nt=lambda t, r: t,
            names=_keep,
        )
    if name == "pad":
        count = draw(st.integers(1, r))
        sizes = []
        for d in range(count):
            left = draw(st.integers(-batch[d], 2))
            right = draw(st.integers(-(batch[d] + left), 2)) if batch[d] + left >= 0 else 0
            sizes += [left, right]

        def leaf(t, r, value=0.0):
            for d in range(count):
                t = _pad_dim(t, d, sizes[2 * d], sizes[2 * d + 1], value)
            return t

        return dict(
            name=f"pad({sizes})",
            call=lambda c: c.pad(sizes),
            leaf=leaf,
            nt=lambda t, r: leaf(t, r, -1),
            names=_keep,
        )
    if name == "roll":
        count = draw(st.integers(1, r))
        dims = draw(st.lists(st.integers(-r, r - 1), min_size=count, max_size=count, unique_by=nd))
        shifts = [draw(st.integers(-3, 3)) for _ in dims]
        if len(dims) == 1 and draw(st.booleans()):
            dims, shifts = dims[0], shifts[0]
        return dict(
            name=f"roll({shifts}, {dims})",
            call=lambda c: c.roll(shifts, dims),
            leaf=lambda t, r: t.roll(
                shifts, [nd(d) for d in dims] if isinstance(dims, list) else nd(dims)
            ),
            names=_keep,
        )
    if name == "flip":
        dims = draw(st.lists(st.integers(-r, r - 1), min_size=1, max_size=r, unique_by=nd))
        return dict(
            name=f"flip({dims})",
            call=lambda c: c.flip(*dims) if len(dims) % 2 else torch.flip(c, dims),
            leaf=lambda t, r: t.flip([nd(d) for d in dims]),
            names=_keep,
        )
    if name == "narrow":
        dim = draw(st.integers(-r, r - 1))
        n = batch[nd(dim)]
        start = draw(st.integers(0, n))
        length = draw(st.integers(0, n - start))
        if start and draw(st.booleans()):
            start -= n  # a negative start counts from the end, as in torch
        return dict(
            name=f"narrow({dim}, {start}, {length})",
            call=lambda c: (
                torch.narrow(c, dim, start, length) if start < 0 else c.narrow(dim, start, length)
            ),
            leaf=lambda t, r: t.narrow(nd(dim), start, length),
            names=_keep,
        )
    raise AssertionError(name)


# ---------------------------------------------------------------- comparison
def _entry(container, path):
    level = container
    for key in path[:-1]:
        level = level.get(key)
    return (
        level._to_tensordict_view()._data[path[-1]]
        if hasattr(level, "_to_tensordict_view")
        else level.get(path[-1])
    )


def _level(container, path):
    level = container
    for key in path:
        level = level.get(key)
    return level


def _check(container, ref: Ref, label: str) -> None:
    for path, want in ref.levels.items():
        level = _level(container, path)
        assert tuple(level.batch_size) == want, (label, path, level.batch_size, want)
        names = ref.names[path]
        got = [g if n != ANY else ANY for g, n in zip(level.names, names)]
        assert got == names, (label, path, level.names, names)
    for path, want in ref.leaves.items():
        got = container.get(path)
        assert got.dtype == want.dtype, (label, path, got.dtype, want.dtype)
        assert got.shape == want.shape, (label, path, got.shape, want.shape)
        assert torch.equal(got, want), (label, path)
    for path, codes in ref.codes.items():
        got = _entry(container, path)
        assert tuple(got.batch_size) == tuple(codes.shape), (
            label,
            path,
            got.batch_size,
            codes.shape,
        )
        assert got.tolist() == _decode(codes), (label, path, got.tolist())


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@SETTINGS
@given(data=st.data(), start=containers())
def test_shape_op_sequences_match_torch_on_every_leaf(data, start):
    container, ref = start
    source_ref = ref
    originals = {path: container.get(path) for path in ref.leaves}
    steps = data.draw(st.integers(1, 4))
    trail = []
    for _ in range(steps):
        dtypes = {t.dtype for t in ref.leaves.values()}
        dtype = dtypes.pop() if len(dtypes) == 1 else None
        op = data.draw(ops(ref.levels[()], dtype))
        trail.append(op["name"])
        label = " -> ".join(trail)
        try:
            expected = op["ref"](ref, container) if "ref" in op else _apply_ref(ref, op)
        except (RuntimeError, IndexError, ValueError, TypeError):
            try:
                op["call"](container)
            except (RuntimeError, IndexError, ValueError, TypeError):
                return
            raise AssertionError(
                f"{label}: torch raises on a leaf, the container does not"
            ) from None
        container = op["call"](container)
        ref = expected
        _check(container, ref, label)
    # views vs copies: the result shares storage with the source leaf where torch's does
    for path, want in ref.leaves.items():
        ref_shares = _shares(want, source_ref.leaves[path])
        got_shares = _shares(container.get(path), originals[path])
        assert got_shares == ref_shares, (label, path, "shares storage", got_shares, ref_shares)
    try:
        for want in ref.leaves.values():
            want.add_(1)
    except RuntimeError:  # torch refuses to write into an expanded view: so would the leaf
        return
    container.apply_(lambda t: t.add_(1))
    for path, want in source_ref.leaves.items():
        assert torch.equal(originals[path], want), (label, path, "write through the result")
    _check(container, ref, label + " -> add_(1)")
