"""Joining containers that hold different kinds of value at one key: a clear error.

A tensor in one container and a container (or non-tensor data) in another at the
same key cannot be stacked; the refusal names the API, the key path and both kinds,
whichever container comes first, through every door that joins (``torch.stack``,
``torch.cat``, the class methods, ``DataLoader``'s default collate).
"""

from __future__ import annotations

import re

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from tdfunc import TensorClass, TensorDict


class Pair(TensorClass):
    left: torch.Tensor
    right: torch.Tensor


def nested() -> TensorDict:
    return TensorDict({"obs": torch.zeros(3), "x": {"y": torch.zeros(3, 2)}}, [3])


def flat() -> TensorDict:
    return TensorDict({"obs": torch.zeros(3), "x": torch.zeros(3)}, [3])


def labelled() -> TensorDict:
    return TensorDict({"obs": torch.zeros(3), "x": "a label"}, [3])


def classed() -> TensorDict:
    return TensorDict(
        {"obs": torch.zeros(3), "x": Pair(torch.zeros(3), torch.ones(3), batch_size=[3])}, [3]
    )


JOINS = {
    "torch.stack": (torch.stack, "torch.stack"),
    "torch.cat": (torch.cat, "torch.cat"),
    "TensorDict.stack": (TensorDict.stack, "torch.stack"),
    "TensorDict.maybe_dense_stack": (TensorDict.maybe_dense_stack, "torch.stack"),
    "TensorDict.cat": (TensorDict.cat, "torch.cat"),
    "default_collate": (lambda items: default_collate([i[0] for i in items]), "torch.stack"),
}
KINDS = {nested: "TensorDict", flat: "Tensor", labelled: "non-tensor value", classed: "Pair"}


@pytest.mark.parametrize("join", list(JOINS))
@pytest.mark.parametrize(
    ("first", "second"),
    [(nested, flat), (flat, nested), (labelled, flat), (flat, labelled), (nested, labelled),
     (classed, flat), (flat, classed), (classed, nested)],
)  # fmt: skip
def test_different_kinds_at_a_key_are_refused_by_name(join, first, second):
    fn, api = JOINS[join]
    with pytest.raises(TypeError) as info:
        fn([first(), first(), second()])
    message = str(info.value)
    expected = (
        f"{api}: cannot join the entry 'x': the container at position 0 holds a "
        f"{KINDS[first]} there and the one at position 2 a {KINDS[second]}."
    )
    assert message.startswith(expected), message


def test_a_deeper_key_is_named_by_its_path():
    one = TensorDict({"n": nested()}, [3])
    two = TensorDict({"n": flat()}, [3])
    with pytest.raises(TypeError, match=re.escape("entry ('n', 'x'): the container at position 0 "
                                                  "holds a TensorDict there and the one at "
                                                  "position 1 a Tensor")):  # fmt: skip
        torch.stack([one, two])


def test_a_dataloader_batch_of_mixed_samples_is_refused_by_name():
    samples = [nested()[0], flat()[0]]
    with pytest.raises(TypeError, match=r"entry 'x': the container at position 0 holds a Tensor"
                       r"Dict there and the one at position 1 a Tensor"):  # fmt: skip
        next(iter(DataLoader(samples, batch_size=2)))


@pytest.mark.parametrize("items", [[flat(), torch.zeros(3)], [torch.zeros(3), flat()]])
def test_a_tensor_among_the_containers_is_refused_by_position(items):
    position = 0 if isinstance(items[0], torch.Tensor) else 1
    with pytest.raises(TypeError, match=rf"torch.stack: expected TensorDicts or TensorClass "
                       rf"instances to join, got a Tensor at position {position}\."):  # fmt: skip
        torch.stack(items)


def test_same_kinds_still_join_like_plain_tensors():
    # The check looks at kinds only when torch fails, or for a non-tensor entry:
    # what joined before still joins to the same values.
    items = [nested(), nested()]
    items[1]["x", "y"] += 1
    items[1]["obs"] += 2
    out = torch.stack(items)
    assert torch.equal(out["x", "y"], torch.stack([i["x", "y"] for i in items]))
    assert torch.equal(out["obs"], torch.stack([i["obs"] for i in items]))
    labels = torch.cat([labelled(), labelled()])
    assert labels["x"] == "a label" and labels.batch_size == (6,)


def test_a_parameter_and_a_tensor_that_torch_refuses_get_torch_s_reason():
    # Both are tensors: a failed join is about shapes, not about kinds.
    one = TensorDict({"w": torch.nn.Parameter(torch.zeros(3, 2))}, [3])
    two = TensorDict({"w": torch.zeros(3, 4)}, [3])
    with pytest.raises(RuntimeError, match=re.escape("entry 'w' (leaf shapes [[3, 2], [3, 4]])")):
        torch.stack([one, two])
