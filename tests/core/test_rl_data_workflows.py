"""Replay buffers and rollouts as RL users write them, against plain tensors and lists.

- A ring buffer preallocated from one transition (``expand(capacity).clone()``),
  written with slices, index tensors that wrap around and boolean masks, sampled
  with random index tensors; nested ``("next", ...)`` keys and a string entry. The
  reference is one plain tensor (or Python list) per entry, written the same way.
- Rollouts: per-step TensorDicts stacked into ``[T]`` and ``[B, T]`` with a named
  ``"time"`` dim, GAE and reward-to-go computed with TensorDict arithmetic against a
  loop over plain tensors, ``split``/``unbind`` over time, ``reshape(-1)`` and
  ``td[torch.randperm(n)]`` for minibatches.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdfunc import TensorDict

CAPACITY = 7
GAMMA, LAMBDA = 0.9, 0.8


def transition(n: int | None, seed: int) -> TensorDict:
    """A batch of ``n`` transitions (one transition for None), with a string tag."""
    g = torch.Generator().manual_seed(seed)
    size = [] if n is None else [n]
    shape = tuple(size)
    tags = f"t{seed}" if n is None else [f"t{seed}.{i}" for i in range(n)]
    return TensorDict(
        {
            "obs": torch.randn(*shape, 3, generator=g),
            "action": torch.randint(0, 4, shape, generator=g),
            "tag": tags,
            "next": {
                "obs": torch.randn(*shape, 3, generator=g),
                "reward": torch.randn(*shape, 1, generator=g),
                "done": torch.rand(*shape, 1, generator=g) < 0.3,
            },
        },
        size,
    )


TENSOR_KEYS = ["obs", "action", ("next", "obs"), ("next", "reward"), ("next", "done")]


def empty_buffer(how: str) -> TensorDict:
    item = transition(None, 0)
    if how == "expand":
        return item.expand(CAPACITY).clone()
    return torch.zeros_like(item.expand(CAPACITY).clone())


def plain_buffer() -> dict:
    item = transition(None, 0)
    ref = {key: item[key].expand(CAPACITY, *item[key].shape).clone() for key in TENSOR_KEYS}
    ref["tag"] = [item["tag"]] * CAPACITY
    return ref


def write_plain(ref: dict, index, batch: TensorDict) -> None:
    positions = torch.arange(CAPACITY)[index].reshape(-1).tolist()
    for key in TENSOR_KEYS:
        ref[key][index] = batch[key]
    tags = batch["tag"]
    for position, tag in zip(positions, tags if isinstance(tags, list) else [tags]):
        ref["tag"][position] = tag


def assert_same(buf: TensorDict, ref: dict) -> None:
    for key in TENSOR_KEYS:
        assert torch.equal(buf[key], ref[key]), key
    assert list(buf["tag"]) == ref["tag"]


# one write: (kind, start, count); the index is built from them
WRITE = st.tuples(
    st.sampled_from(["ring", "slice", "mask", "int", "list"]),
    st.integers(0, CAPACITY - 1),
    st.integers(1, CAPACITY),
)


def make_index(kind: str, start: int, count: int, seed: int):
    if kind == "ring":  # a ring buffer's write that may wrap around
        return torch.arange(start, start + count) % CAPACITY
    if kind == "slice":
        return slice(start, min(start + count, CAPACITY))
    if kind == "mask":
        return torch.rand(CAPACITY, generator=torch.Generator().manual_seed(seed)) < 0.5
    if kind == "int":
        return start
    return sorted({(start + 2 * i) % CAPACITY for i in range(count)})


@pytest.mark.parametrize("how", ["expand", "zeros_like"])
@settings(max_examples=25, deadline=None)
@given(writes=st.lists(WRITE, min_size=1, max_size=6), sample_seed=st.integers(0, 99))
def test_ring_buffer_writes_and_samples_like_plain_tensors(how, writes, sample_seed):
    buf, ref = empty_buffer(how), plain_buffer()
    if how == "zeros_like":
        for key in TENSOR_KEYS:
            ref[key].zero_()
    for seed, (kind, start, count) in enumerate(writes, 1):
        index = make_index(kind, start, count, seed)
        n = int(torch.arange(CAPACITY)[index].numel())
        if n == 0:
            continue
        batch = transition(None if kind == "int" else n, seed)
        buf[index] = batch
        write_plain(ref, index, batch)
        assert_same(buf, ref)
    sample = torch.randint(0, CAPACITY, (5,), generator=torch.Generator().manual_seed(sample_seed))
    drawn = buf[sample]
    assert drawn.batch_size == torch.Size([5])
    for key in TENSOR_KEYS:
        assert torch.equal(drawn[key], ref[key][sample])
    assert list(drawn["tag"]) == [ref["tag"][i] for i in sample.tolist()]
    # the sample is a copy: writing it leaves the buffer alone
    drawn["obs"].add_(1.0)
    assert torch.equal(buf["obs"], ref["obs"])


def test_memmapped_ring_buffer_keeps_every_write(tmp_path):
    buf = transition(None, 0).expand(CAPACITY).memmap_like(tmp_path)
    ref = {key: torch.zeros_like(buf[key]) for key in TENSOR_KEYS}
    ref["tag"] = list(buf["tag"])
    ptr = 0
    for seed, n in enumerate([3, 4, 5, 2], 1):  # 14 transitions: the ring wraps twice
        index = torch.arange(ptr, ptr + n) % CAPACITY
        batch = transition(n, seed)
        buf[index] = batch
        write_plain(ref, index, batch)
        ptr = (ptr + n) % CAPACITY
    mask = torch.arange(CAPACITY) % 3 == 0
    batch = transition(int(mask.sum()), 9)
    buf[mask] = batch
    write_plain(ref, mask, batch)
    assert_same(buf, ref)
    assert_same(TensorDict.load_memmap(tmp_path), ref)


# ---------------------------------------------------------------------- rollouts
def collect(batch: int, steps: int, seed: int) -> list[list[TensorDict]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(batch):
        trajectory = []
        for _ in range(steps):
            step = {
                "obs": torch.randn(2, generator=g),
                "value": torch.randn(1, generator=g),
                "next": {
                    "reward": torch.randn(1, generator=g),
                    "done": torch.rand(1, generator=g) < 0.3,
                    "value": torch.randn(1, generator=g),
                },
            }
            trajectory.append(TensorDict(step, []))
        out.append(trajectory)
    return out


def gae_loop(reward, done, value, next_value):
    """GAE over the last dim of ``[B, T, 1]`` tensors, one env and step at a time."""
    advantage = torch.zeros_like(reward)
    for b in range(reward.shape[0]):
        running = torch.zeros(1)
        for t in reversed(range(reward.shape[1])):
            alive = (~done[b, t]).float()
            delta = reward[b, t] + GAMMA * next_value[b, t] * alive - value[b, t]
            running = delta + GAMMA * LAMBDA * alive * running
            advantage[b, t] = running
    return advantage


def returns_loop(reward, done):
    out = torch.zeros_like(reward)
    for b in range(reward.shape[0]):
        acc = torch.zeros(1)
        for t in reversed(range(reward.shape[1])):
            acc = reward[b, t] + GAMMA * acc * (~done[b, t]).float()
            out[b, t] = acc
    return out


@settings(max_examples=10, deadline=None)
@given(batch=st.integers(1, 3), steps=st.integers(1, 6), seed=st.integers(0, 999))
def test_rollout_gae_and_returns_match_a_loop(batch, steps, seed):
    steps_td = collect(batch, steps, seed)
    data = torch.stack([torch.stack(t, 0) for t in steps_td], 0)
    data.names = [None, "time"]
    assert data.batch_size == torch.Size([batch, steps])
    assert data["next"].names == [None, "time"]

    def plain(key):
        return torch.stack([torch.stack([s[key] for s in t]) for t in steps_td])

    reward, done = plain(("next", "reward")), plain(("next", "done"))
    value, next_value = plain("value"), plain(("next", "value"))
    assert torch.equal(data["next", "reward"], reward)

    # GAE with TensorDict arithmetic, one time step at a time
    running = torch.zeros(batch, 1)
    advantages = []
    for step in reversed(data.unbind(1)):
        alive = (~step["next", "done"]).float()
        delta = step["next", "reward"] + GAMMA * step["next", "value"] * alive - step["value"]
        running = delta + GAMMA * LAMBDA * alive * running
        advantages.insert(0, running)
    data["advantage"] = torch.stack(advantages, 1)
    torch.testing.assert_close(data["advantage"], gae_loop(reward, done, value, next_value))

    # reward-to-go on whole sub-TensorDicts
    to_go = torch.zeros_like(data[:, 0]["next"].select("reward"))
    returns = []
    for t in reversed(range(steps)):
        step = data[:, t]
        to_go = step["next"].select("reward") + GAMMA * to_go * (~step["next", "done"]).float()
        returns.insert(0, to_go)
    torch.testing.assert_close(torch.stack(returns, 1)["reward"], returns_loop(reward, done))

    # time is dim 1: split, unbind and cat keep the name
    cut = steps // 2
    if cut:
        first, second = data.split([cut, steps - cut], dim=1)
        assert first.names == [None, "time"] and second.batch_size == (batch, steps - cut)
        assert torch.equal(torch.cat([first, second], 1)["obs"], data["obs"])
    assert [s.batch_size for s in data.unbind(1)] == [torch.Size([batch])] * steps

    # minibatches: flatten, shuffle, split
    flat = data.reshape(-1)
    perm = torch.randperm(batch * steps, generator=torch.Generator().manual_seed(seed))
    shuffled = flat[perm]
    for key in ["obs", "advantage", ("next", "done")]:
        assert torch.equal(shuffled[key], data[key].reshape(batch * steps, -1)[perm])
    assert sum(m.batch_size[0] for m in shuffled.split(4)) == batch * steps
    finished = data[data["next", "done"].squeeze(-1)]
    assert torch.equal(finished["obs"], data["obs"][done.squeeze(-1)])


@pytest.mark.parametrize("method", ["unbind", "split", "chunk", "transpose", "squeeze"])
def test_a_dim_name_where_a_position_is_expected_is_a_clear_error(method):
    data = TensorDict({"obs": torch.zeros(2, 5, 3)}, [2, 5], names=[None, "time"])
    args = {"split": (2, "time"), "chunk": (2, "time"), "transpose": ("time", 0)}
    with pytest.raises(TypeError, match=rf"TensorDict.{method}: dim must be an int.*'time'"):
        getattr(data, method)(*args.get(method, ("time",)))
    # numpy and torch integers are positions too
    assert len(data.unbind(torch.tensor(1))) == 5 and len(data.split(2, dim=1)) == 3
