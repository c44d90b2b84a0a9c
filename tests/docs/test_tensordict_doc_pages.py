"""Examples of tensordict's documentation pages on non-tensor data and on printing.

Each example runs with only the import changed to tdfunc and prints what the page
shows. The rules behind them (a stack's values cut after 50 characters, the
``plain`` value summary, a callable ``sort_keys``) are also checked on their own,
and against tensordict itself, run in its own process by ``tensordict_peer`` (tensordict
patches torch).
"""

from __future__ import annotations

import json
import textwrap

import pytest
import tensordict_peer
import torch

from tdfunc import (
    NonTensorData,
    NonTensorStack,
    TensorDict,
    get_printoptions,
    parse_tensor_dict_string,
    set_printoptions,
)


def printed(capsys, value) -> str:
    print(value)
    return capsys.readouterr().out.rstrip("\n")


def page(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


# ---------------------------------------------------------------- non-tensor data page
def test_stacked_non_tensor_data_prints_as_the_page_shows(capsys):
    td = TensorDict(
        a=NonTensorStack("a string!", "another string!", "a third string!"),
        b=torch.zeros(3),
        batch_size=[3],
    )
    assert printed(capsys, td) == page(
        """
        TensorDict(
            fields={
                a: NonTensorStack(
                    ['a string!', 'another string!', 'a third string!'...,
                    batch_size=torch.Size([3]),
                    device=None),
                b: Tensor(shape=torch.Size([3]), device=cpu, dtype=torch.float32, is_shared=False)},
            batch_size=torch.Size([3]),
            device=None,
            is_shared=False)
        """
    )
    assert printed(capsys, td[0]) == page(
        """
        TensorDict(
            fields={
                a: NonTensorData(data=a string!, batch_size=torch.Size([]), device=None),
                b: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.float32, is_shared=False)},
            batch_size=torch.Size([]),
            device=None,
            is_shared=False)
        """
    )


def test_a_list_kept_whole_is_not_cut(capsys):
    td = TensorDict(
        a=NonTensorData(["a string!", "another string!", "a third string!"]),
        b=torch.zeros(3),
        batch_size=[3],
    )
    assert printed(capsys, td[0]) == page(
        """
        TensorDict(
            fields={
                a: NonTensorData(data=['a string!', 'another string!', 'a third string!'], batch_size=torch.Size([]), device=None),
                b: Tensor(shape=torch.Size([]), device=cpu, dtype=torch.float32, is_shared=False)},
            batch_size=torch.Size([]),
            device=None,
            is_shared=False)
        """  # noqa: E501
    )


@pytest.mark.parametrize("length", [1, 45, 46, 47, 48, 120])
def test_a_stack_shows_its_values_up_to_50_characters(length):
    values = ["x" * length, "y"]
    full = repr(values)
    shown = repr(NonTensorStack(*values)).splitlines()[1].strip()
    if len(full) <= 50:
        assert shown == full + ","
    else:
        assert shown == full[:50] + "...,"


def test_a_nested_stack_is_cut_as_one_text():
    stack = NonTensorStack(NonTensorStack("a" * 30, "b"), NonTensorStack("c", "d" * 30))
    line = repr(stack).splitlines()[1].strip()
    assert line == repr([["a" * 30, "b"], ["c", "d" * 30]])[:50] + "...,"
    assert stack[1, 1] == "d" * 30  # the values themselves are whole


# ---------------------------------------------------------------- printing page
def test_get_printoptions_holds_the_documented_options():
    options = get_printoptions()
    assert list(options)[:2] == ["show_batch_size", "show_device"]  # the page's first two
    documented = {
        "show_batch_size": True, "show_device": True, "show_is_shared": True,
        "show_shape": True, "show_field_device": True, "show_dtype": True,
        "show_field_is_shared": True, "show_grad": False, "show_is_contiguous": False,
        "show_is_view": False, "show_storage_size": False, "plain": False,
        "sort_keys": "alphabetical",
    }  # fmt: skip
    assert options == documented


@pytest.fixture
def td():
    return TensorDict(
        image=torch.randn(32, 3, 64, 64), label=torch.randint(10, (32,)), batch_size=[32]
    )


def test_the_printing_page_examples(capsys, td):
    default = page(
        """
        TensorDict(
            fields={
                image: Tensor(shape=torch.Size([32, 3, 64, 64]), device=cpu, dtype=torch.float32, is_shared=False),
                label: Tensor(shape=torch.Size([32]), device=cpu, dtype=torch.int64, is_shared=False)},
            batch_size=torch.Size([32]),
            device=None,
            is_shared=False)
        """  # noqa: E501
    )
    assert printed(capsys, td) == default
    before = get_printoptions()
    setting = set_printoptions(show_device=False, show_is_shared=False)
    setting.set()
    try:
        # The page's printed output for this call also drops the fields' device and
        # is_shared; its own option table (show_device: "the device= line",
        # show_field_device: the field's) and tensordict itself keep them: the table
        # is followed.
        assert printed(capsys, td) == page(
            """
            TensorDict(
                fields={
                    image: Tensor(shape=torch.Size([32, 3, 64, 64]), device=cpu, dtype=torch.float32, is_shared=False),
                    label: Tensor(shape=torch.Size([32]), device=cpu, dtype=torch.int64, is_shared=False)},
                batch_size=torch.Size([32]))
            """  # noqa: E501
        )
    finally:
        set_printoptions(**before).set()
    assert printed(capsys, td) == default
    with set_printoptions(verbose=False):
        shapes_only = printed(capsys, td)
    assert shapes_only == page(
        """
        TensorDict(
            fields={
                image: Tensor(shape=torch.Size([32, 3, 64, 64])),
                label: Tensor(shape=torch.Size([32]))},
            batch_size=torch.Size([32]))
        """
    )
    with set_printoptions(verbose=False, show_dtype=True):
        with_dtypes = printed(capsys, td)
    assert with_dtypes == page(
        """
        TensorDict(
            fields={
                image: Tensor(shape=torch.Size([32, 3, 64, 64]), dtype=torch.float32),
                label: Tensor(shape=torch.Size([32]), dtype=torch.int64)},
            batch_size=torch.Size([32]))
        """
    )


def test_plain_appends_a_value_summary_computed_without_tdfunc(capsys, td):
    with set_printoptions(plain=True):
        text = printed(capsys, td)
    image, label = td["image"].double(), td["label"]
    assert (
        f"is_shared=False, mean={image.mean().item():.4g}, std={image.std().item():.4g})"
    ) in text
    assert f"is_shared=False, min={label.min().item()}, max={label.max().item()})" in text
    assert get_printoptions()["plain"] is False


@pytest.mark.parametrize(
    ("value", "summary"),
    [
        (torch.ones(10), "mean=1, std=0"),
        (torch.tensor([2.5]), "mean=2.5, std=nan"),  # one value: no spread
        (torch.tensor([True, False]), "min=False, max=True"),
        (torch.tensor([-3, 7]), "min=-3, max=7"),
        (torch.zeros(0, 3), "[]"),
        (torch.tensor([1.0, 3.0], dtype=torch.bfloat16), "mean=2, std=1.414"),
        (torch.tensor([1 + 1j, 3 - 1j]), "mean=2+0j, std=2"),
    ],
)
def test_plain_summaries(value, summary):
    with set_printoptions(plain=True, verbose=False, show_shape=False):
        assert repr(TensorDict(v=value)).splitlines()[2].strip() == f"v: Tensor({summary})}},"


def test_plain_leaves_values_it_cannot_read_unsummarised():
    with set_printoptions(plain=True, verbose=False, show_shape=False):
        line = repr(TensorDict(v=torch.ones(3, device="meta"))).splitlines()[2].strip()
    assert line == "v: Tensor()},"


def test_sort_keys_takes_a_callable_and_refuses_other_values(capsys):
    with set_printoptions(sort_keys=lambda key: -ord(key[0]), verbose=False):
        text = printed(capsys, TensorDict(a=1, c=3, b=2))
    assert [line.strip()[0] for line in text.splitlines()[2:5]] == ["c", "b", "a"]
    with pytest.raises(ValueError, match="sort_keys must be 'alphabetical', 'insertion' or a"):
        set_printoptions(sort_keys="reverse")


# ---------------------------------------------------------------- against tensordict
PROBE = """
import json, torch
from {lib} import NonTensorStack, TensorDict, set_printoptions
out = [repr(NonTensorStack(*["x" * n, "y"])) for n in (40, 45, 46, 47, 60)]
out.append(repr(NonTensorStack(NonTensorStack("a" * 30, "b"), NonTensorStack("c", "d" * 30))))
values = dict(
    f=torch.linspace(-2, 5, 7), h=torch.linspace(0, 1, 5).half(), i=torch.arange(-4, 9),
    b=torch.tensor([True, True]), e=torch.zeros(0), one=torch.tensor([0.25]),
    z=torch.tensor([1 + 2j, -3 + 0.5j]),
)
with set_printoptions(plain=True):
    out.append(repr(TensorDict(values)))
print(json.dumps(out))
"""


def test_printed_forms_match_tensordict():
    done = tensordict_peer.run(PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    namespace: dict = {}
    exec(PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    assert namespace["out"] == json.loads(done.stdout.strip().splitlines()[-1])


EMPTY_PROBE = """
import json, torch
import {lib}
from {lib} import TensorClass, TensorDict
if "{lib}" == "tensordict":
    {lib}.set_printoptions(compact=False).set()  # the long form tdfunc prints
class Pair(TensorClass):
    inner: TensorDict
    x: torch.Tensor
out = [
    repr(TensorDict(batch_size=[2])),
    repr(TensorDict(a={{}}, batch_size=[2])),
    repr(TensorDict(a=TensorDict(b={{}}, c=torch.zeros(2, 3), batch_size=[2, 3]), batch_size=[2])),
    repr(TensorDict(a={{}}, batch_size=[2]).lock_()),
    repr(TensorDict(batch_size=[0])),
    repr(TensorDict(a="text", b={{}}, batch_size=[])),
    repr(TensorDict(b={{}}, batch_size=[3])[0]),
    repr(Pair(inner=TensorDict(batch_size=[2]), x=torch.zeros(2), batch_size=[2])),
]
print(json.dumps(out))
"""


def test_empty_containers_print_as_tensordict_prints_them():
    done = tensordict_peer.run(EMPTY_PROBE.format(lib="tensordict"))
    assert done.returncode == 0, done.stderr[-2000:]
    namespace: dict = {}
    exec(EMPTY_PROBE.format(lib="tdfunc").replace("print(json.dumps(out))", ""), namespace)
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    assert namespace["out"] == expected
    # the printed form reads back
    nested = TensorDict(a=TensorDict(b={}, batch_size=[2, 3]), batch_size=[2])
    again = parse_tensor_dict_string(repr(nested))
    assert again["a"].batch_size == (2, 3) and again["a", "b"].batch_size == (2, 3)
    assert list(again["a", "b"].keys()) == []
