"""Bad input: clear errors (type, message), and nothing half-written after a failure."""

from __future__ import annotations

import re

import pytest
import torch

from tdfunc import TensorDict


def _td() -> TensorDict:
    return TensorDict(
        {
            "obs": torch.zeros(3, 2),
            "action": torch.zeros(3),
            "n": {"x": torch.zeros(3, 4), "deep": {"y": torch.zeros(3)}},
            "s": "text",
        },
        batch_size=[3],
    )


def snapshot(td: TensorDict) -> dict:
    """Every leaf by path: the stored object and a copy of its value; plus the structure."""
    out = {}
    for key in td.keys(include_nested=True):
        value = td._get_leaf(key)
        copy = value.clone() if isinstance(value, torch.Tensor) else None
        out[key] = (value, copy, getattr(value, "batch_size", None))
    return out


def assert_unchanged(td: TensorDict, before: dict) -> None:
    after = snapshot(td)
    assert list(after) == list(before), "keys changed"
    for key, (value, copy, batch) in before.items():
        now, _, now_batch = after[key]
        assert now is value or (now == value if not isinstance(value, torch.Tensor) else False), key
        if copy is not None:
            assert torch.equal(now, copy), f"value at {key!r} changed"
        assert now_batch == batch


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


# ---------------------------------------------------------------- batch size
def test_batch_size_mismatch_names_key_shape_and_batch_size():
    with pytest.raises(ValueError) as info:
        TensorDict({"a": torch.zeros(3, 2), "b": torch.zeros(4, 2)}, batch_size=[3])
    assert str(info.value) == (
        "TensorDict.__init__: the value at key 'b' has shape [4, 2], which does not start with "
        "the batch size [3]. The leading dims of every value must equal the batch size."
    )


def test_batch_size_mismatch_in_nested_dict_names_full_path():
    with pytest.raises(ValueError, match=re.escape("key ('n', 'x') has shape [2]")):
        TensorDict({"n": {"x": torch.zeros(2)}}, batch_size=[3])


def test_nested_tensordict_with_shorter_batch():
    inner = TensorDict({"x": torch.zeros(2)}, [])  # its leaves do not fit [3]
    with pytest.raises(ValueError, match="TensorDict at key 'inner' has batch size \\[\\]"):
        TensorDict({"inner": inner}, [3])
    fits = TensorDict({"x": torch.zeros(3)}, [])  # they do: the batch size is extended
    assert TensorDict({"inner": fits}, [3])["inner"].batch_size == torch.Size([3])


def test_scalar_into_batched_tensordict_has_a_hint():
    td = TensorDict({}, [3])
    with pytest.raises(ValueError, match="Python scalars are stored as 0-dim tensors"):
        td["x"] = 1.0
    assert "x" not in td


@pytest.mark.parametrize("batch_size", [[-1], [3, -2], -4])
def test_negative_batch_size(batch_size):
    with pytest.raises(ValueError, match="batch_size must not be negative"):
        TensorDict({}, batch_size=batch_size)


@pytest.mark.parametrize("batch_size", ["3", [3.5], object()])
def test_batch_size_of_wrong_type(batch_size):
    with pytest.raises(TypeError, match="batch_size must be a sequence of ints"):
        TensorDict({}, batch_size=batch_size)


def test_batch_size_setter_checks_values():
    td = _td()
    before = snapshot(td)
    with pytest.raises(ValueError, match="key 'action' has shape \\[3\\]"):
        td.batch_size = [3, 2]
    assert td.batch_size == torch.Size([3])
    assert_unchanged(td, before)


def test_source_must_be_a_mapping():
    with pytest.raises(
        TypeError,
        match=exact("TensorDict: source must be a mapping (dict, TensorDict, ...), got list."),
    ):
        TensorDict([("a", torch.zeros(1))])


def test_names_errors():
    with pytest.raises(ValueError, match="expected 1 names"):
        TensorDict({}, [3], names=["a", "b"])
    with pytest.raises(TypeError, match="names must be str or None"):
        TensorDict({}, [3], names=[1])
    with pytest.raises(ValueError, match="names must be unique"):
        TensorDict({}, [3, 3], names=["a", "a"])


# ---------------------------------------------------------------- keys
def test_missing_key_suggests_close_matches():
    td = _td()
    with pytest.raises(KeyError) as info:
        td["obz"]
    assert info.value.args[0] == "TensorDict.__getitem__: key 'obz' not found. Did you mean 'obs'?"
    with pytest.raises(KeyError) as info:
        td["n", "deep", "z"]
    assert info.value.args[0] == (
        "TensorDict.__getitem__: key 'z' not found under ('n', 'deep'). Available keys: 'y'."
    )
    with pytest.raises(KeyError, match="Did you mean 'x'"):
        td["n", "xx"]


def test_missing_key_through_a_tensor():
    td = _td()
    with pytest.raises(KeyError, match=re.escape("('obs',) holds a Tensor, not a TensorDict")):
        td["obs", "x"]


@pytest.mark.parametrize(
    "action",
    [
        lambda td: td.get(1),
        lambda td: td.set(1, torch.zeros(3)),
        lambda td: td.set(("n", 2), torch.zeros(3)),
        lambda td: td[("n", 1)],
        lambda td: td.__setitem__(("n", 0.5), torch.zeros(3)),
        lambda td: td.del_(2),
        lambda td: td.select(3),
        lambda td: td.rename_key_("obs", 5),
        lambda td: TensorDict({1: torch.zeros(3)}, [3]),
    ],
)
def test_key_of_wrong_type_is_a_type_error(action):
    td = _td()
    before = snapshot(td)
    with pytest.raises(TypeError, match="a key must be a str or a \\(nested\\) tuple of str"):
        action(td)
    assert_unchanged(td, before)


def test_key_type_error_message():
    with pytest.raises(TypeError) as info:
        _td().get(("n", 3))
    assert str(info.value) == (
        "TensorDict.get: a key must be a str or a (nested) tuple of str, got int 3 inside ('n', 3)."
    )


# ---------------------------------------------------------------- indices
@pytest.mark.parametrize(
    "index",
    [3, -4, (0, 0), (slice(None), 1), torch.tensor([5]), (0, Ellipsis, 0), 1.5],
    ids=repr,
)
def test_index_out_of_range_or_invalid(index):
    with pytest.raises(IndexError):
        _td()[index]


def test_index_error_messages():
    with pytest.raises(IndexError) as info:
        _td()[3]
    assert str(info.value) == "TensorDict: index 3 is out of range for batch dim 0 of size 3."
    with pytest.raises(IndexError, match="too many indices for a TensorDict with 1 batch dim"):
        _td()[0, 1]
    with pytest.raises(IndexError, match="batch_size=\\[\\]"):
        TensorDict({"a": torch.zeros(2)}, [])[0]


def test_negative_slice_step():
    with pytest.raises(ValueError, match="slice step must be positive"):
        _td()[::-1]


# ---------------------------------------------------------------- locked
def test_locked_refuses_structural_writes_and_stays_intact():
    td = _td().lock_()
    before = snapshot(td)
    actions = [
        lambda: td.set("new", torch.zeros(3)),
        lambda: td.__setitem__(("n", "new"), torch.zeros(3)),
        lambda: td.__setitem__(("brand", "new"), torch.zeros(3)),
        lambda: td.__delitem__("obs"),
        lambda: td.del_(("n", "x")),
        lambda: td.rename_key_("obs", "o"),
        lambda: td.update({"obs": torch.ones(3, 2), "new": torch.zeros(3)}),
        lambda: td.__setitem__(0, TensorDict({"zz": torch.tensor(1.0)}, [])),
        lambda: td.exclude("obs", inplace=True),
        lambda: td.select("obs", inplace=True),
        lambda: td.flatten_keys(inplace=True),
        lambda: td.clear(),
    ]
    for action in actions:
        with pytest.raises(RuntimeError, match="is locked"):
            action()
        assert_unchanged(td, before)


def test_locked_error_message():
    td = TensorDict({}, []).lock_()
    with pytest.raises(RuntimeError) as info:
        td["a"] = torch.zeros(1)
    assert str(info.value) == (
        "TensorDict.set: cannot add, replace, delete or rename key 'a': it is locked. "
        "Cannot modify locked TensorDict. For in-place modification, consider using the "
        "`set_()` method and make sure the key is present. Or call td.unlock_() first."
    )


def test_locked_nested_replacement_by_a_tensor_is_refused():
    td = _td().lock_()
    with pytest.raises(RuntimeError, match="cannot add, replace, delete or rename key 'n'"):
        td["n"] = torch.zeros(3)
    with pytest.raises(TypeError, match="cannot write a Tensor in place into the TensorDict"):
        td.set("n", torch.zeros(3), inplace=True)


# ---------------------------------------------------------------- atomic writes
def test_failed_set_leaves_tensordict_as_it_was():
    td = _td()
    before = snapshot(td)
    with pytest.raises(ValueError):
        td.set(("fresh", "path", "leaf"), torch.zeros(4))  # no intermediate left behind
    assert_unchanged(td, before)
    with pytest.raises(ValueError):
        td["obs"] = torch.zeros(2, 2)
    assert_unchanged(td, before)
    with pytest.raises(KeyError, match="holds a Tensor"):
        td.set(("obs", "inner"), torch.zeros(3))
    assert_unchanged(td, before)
    with pytest.raises(ValueError):
        td["new"] = {"ok": torch.zeros(3), "bad": torch.zeros(5)}
    assert_unchanged(td, before)


def test_failed_update_after_good_entries_writes_nothing():
    td = _td()
    before = snapshot(td)
    with pytest.raises(ValueError, match="key 'bad'"):
        td.update(
            {
                "obs": torch.ones(3, 2),  # replaces
                "new": torch.ones(3),  # adds
                "n": {"x": torch.ones(3, 4), "z": torch.ones(3)},  # nested merge
                ("n", "deep", "y"): torch.ones(3),
                "bad": torch.ones(7),
            }
        )
    assert_unchanged(td, before)


def test_failed_nested_update_writes_nothing():
    td = _td()
    before = snapshot(td)
    with pytest.raises(ValueError, match=re.escape("key ('n', 'deep', 'w')")):
        td.update({"action": torch.ones(3), "n": {"deep": {"y": torch.ones(3), "w": 0.5}}})
    assert_unchanged(td, before)


def test_failed_inplace_update_writes_nothing():
    td = _td()
    before = snapshot(td)
    with pytest.raises(KeyError, match="'missing' not found"):
        td.update_({"obs": torch.ones(3, 2), "n": {"x": torch.ones(3, 4)}, "missing": 1})
    assert_unchanged(td, before)
    with pytest.raises(ValueError, match="shape \\[5\\], which does not start with the batch"):
        td.update_({"action": torch.ones(3), ("n", "deep", "y"): torch.ones(5)})
    assert_unchanged(td, before)
    with pytest.raises(TypeError, match="cannot write a Tensor in place into the TensorDict"):
        td.update({"obs": torch.ones(3, 2), "n": torch.ones(3, 9)}, inplace=True)
    assert_unchanged(td, before)


def test_failed_set_underscore():
    td = _td()
    before = snapshot(td)
    with pytest.raises(KeyError, match="'nope' not found"):
        td.set_("nope", torch.zeros(3))
    with pytest.raises(ValueError, match=re.escape("into key 'obs' of shape [3, 2]")):
        td.set_("obs", torch.zeros(3, 3))
    with pytest.raises(TypeError, match="cannot write a TensorDict in place into the tensor"):
        td.set_("obs", TensorDict({}, [3]))
    assert_unchanged(td, before)


def test_failed_setitem_at_index_writes_nothing():
    td = _td()
    before = snapshot(td)
    value = TensorDict(
        {"obs": torch.ones(2), "action": torch.ones(()), "n": {"x": torch.ones(9)}}, []
    )
    with pytest.raises(ValueError, match=re.escape("key ('n', 'x')")):
        td[0] = value
    assert_unchanged(td, before)
    with pytest.raises(ValueError, match="batch size \\[2\\] at an index that selects"):
        td[0] = TensorDict({"obs": torch.ones(2, 2)}, [2])
    assert_unchanged(td, before)
    with pytest.raises(ValueError):
        td[1:] = torch.ones(5)
    assert_unchanged(td, before)


def test_failed_lazy_preallocation_writes_nothing():
    td = TensorDict({"a": torch.zeros(3)}, [3])
    before = snapshot(td)
    with pytest.raises(ValueError):
        td[0] = TensorDict({"new": torch.ones(2), "a": torch.ones(4)}, [])
    assert_unchanged(td, before)


def test_failed_rename_writes_nothing():
    td = _td()
    before = snapshot(td)
    with pytest.raises(KeyError, match="holds a Tensor"):
        td.rename_key_("n", ("obs", "n"))
    assert_unchanged(td, before)
    with pytest.raises(ValueError, match="inside itself"):
        td.rename_key_("n", ("n", "m"))
    with pytest.raises(KeyError):
        td.rename_key_("missing", "x")
    assert_unchanged(td, before)


def test_rename_refused_at_a_locked_destination_keeps_the_key_order():
    # the key was put back at the end: a refused rename reordered keys()
    td = TensorDict({"a": torch.zeros(3), "b": torch.zeros(3), "n": {"q": torch.zeros(3)}}, [3])
    td["n"].lock_()
    with pytest.raises(RuntimeError, match="locked"):
        td.rename_key_("a", ("n", "z"))
    assert list(td.keys(True)) == ["a", "b", "n", ("n", "q")]


# ---------------------------------------------------------------- operations
def test_apply_result_checks():
    td = _td()
    with pytest.raises(ValueError, match=re.escape("Pass batch_size=... to apply")):
        td.apply(lambda x: x.reshape(-1)[:1])
    with pytest.raises(TypeError, match="it must return a tensor"):
        td.apply(lambda x: 1.0)
    other = TensorDict({"obs": torch.zeros(3, 2)}, [3])
    with pytest.raises(KeyError, match="'action' is missing from the TensorDict passed"):
        td.apply(lambda x, y: x, other)


def test_stack_and_cat_errors():
    a = TensorDict({"x": torch.zeros(3)}, [3])
    with pytest.raises(ValueError, match="same batch size"):
        torch.stack([a, TensorDict({"x": torch.zeros(4)}, [4])])
    with pytest.raises(KeyError, match="different keys"):
        torch.stack([a, TensorDict({"y": torch.zeros(3)}, [3])])
    with pytest.raises(ValueError, match="non-empty"):
        TensorDict.__torch_function__(torch.stack, (), ([],))
    with pytest.raises(ValueError, match="must match except in dim 0"):
        torch.cat([TensorDict({}, [3, 2]), TensorDict({}, [3, 1])])
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        torch.stack([a, a], 2)


@pytest.mark.parametrize(
    ("action", "error", "pattern"),
    [
        (lambda td: td.reshape(4), ValueError, "invalid for a batch of size \\[3\\]"),
        (lambda td: td.view(-1, -1), ValueError, "only one dimension can be inferred"),
        (lambda td: td.permute(1), IndexError, "out of range"),
        (lambda td: td.unsqueeze(3), IndexError, "out of range"),
        (lambda td: td.transpose(0, 1), IndexError, "must be within the range"),
        (lambda td: td.split([1, 1]), ValueError, "do not add up to 3"),
        (lambda td: td.split(0), ValueError, "split_size must be positive"),
        (lambda td: td.chunk(0), ValueError, "chunks must be positive"),
        (lambda td: td.expand(2), ValueError, "cannot expand batch size \\[3\\]"),
        (lambda td: td.unbind(1), IndexError, "dim 1 is out of range"),
        (lambda td: td + TensorDict({"obs": torch.zeros(3, 2)}, [3]), KeyError, "same keys"),
        (lambda td: td + {"obs": 1}, TypeError, "convert it to a TensorDict"),
    ],
)
def test_operation_errors(action, error, pattern):
    td = _td()
    with pytest.raises(error, match=pattern):
        action(td)


def test_writes_through_a_parent_into_a_frozen_tensorclass_are_refused():
    from tdfunc import TensorClass

    class Params(TensorClass["frozen"]):
        w: torch.Tensor

    td = TensorDict({"p": Params(w=torch.zeros(3), batch_size=[3]), "x": torch.zeros(3)}, [3])
    before = snapshot(td)
    for action in [
        lambda: td.__setitem__(("p", "w"), torch.ones(3)),
        lambda: td.update({"x": torch.ones(3), "p": {"w": torch.ones(3)}}),
        lambda: td.__setitem__(0, TensorDict({"x": 1.0, "p": {"w": torch.tensor(1.0)}}, [])),
        lambda: td.__setitem__(slice(None), 2.0),
    ]:
        with pytest.raises(RuntimeError, match="inside a frozen Params"):
            action()
        assert_unchanged(td, before)


@pytest.mark.parametrize("join", [torch.stack, torch.cat])
def test_a_join_torch_refuses_names_the_entry(join):
    first = TensorDict({"a": torch.zeros(3), "x": torch.zeros(3)}, [3])
    second = TensorDict({"a": torch.zeros(3), "x": torch.zeros(3, 1)}, [3])
    shapes = re.escape("'x' (leaf shapes [[3], [3, 1]])")
    with pytest.raises(RuntimeError, match=f"cannot join the entry {shapes}"):
        join([first, second])
