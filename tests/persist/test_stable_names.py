"""Class names on disk and in treespecs are stable public names, and old ones still load.

``tests/data`` holds a checkpoint and a treespec written by tdfunc 0.1.0, when the
container lived in the private module ``tdfunc._container``.
``pickle_nontensor_old_paths.pkl`` holds containers with non-tensor leaves pickled
while those lived in ``tdfunc._core.nontensor``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.utils._pytree as pytree

import tdfunc
from tdfunc import TensorClass, TensorDict, TensorDictBase
from tdfunc._core.helpers.class_names import class_name, lookup_class

DATA = Path(__file__).resolve().parents[1] / "data"


class Pair(TensorClass):
    a: torch.Tensor


def test_tdfunc_classes_have_public_names():
    assert class_name(TensorDict) == "tdfunc.TensorDict"
    assert class_name(Pair) == f"{__name__}.Pair"
    assert lookup_class("tdfunc.TensorDict") is TensorDict
    assert lookup_class("tdfunc._container.TensorDict") is TensorDict


def test_saved_meta_names_the_public_class(tmp_path):
    TensorDict({"a": torch.zeros(2), "b": {"c": torch.ones(2)}}, [2]).memmap(tmp_path / "x")
    meta = json.loads((tmp_path / "x" / "meta.json").read_text())
    assert meta["class"] == "tdfunc.TensorDict"
    inner = meta["entries"]["b"]["meta"]
    assert inner["class"] == "tdfunc.TensorDict"


def test_checkpoint_written_by_0_1_0_loads(tmp_path):
    prefix = tmp_path / "ckpt"
    shutil.copytree(DATA / "checkpoint_v0_1_0", prefix)
    loaded = TensorDictBase.load_memmap(prefix)
    assert type(loaded) is TensorDict
    assert loaded.batch_size == torch.Size([2])
    torch.testing.assert_close(loaded["a"], torch.arange(6, dtype=torch.float32).view(2, 3))
    torch.testing.assert_close(loaded["nested", "b"], torch.tensor([1, 2]))
    assert loaded["note"] == "written by tdfunc 0.1.0 (flat layout)"
    again = TensorDict.load_memmap(prefix)
    assert (again == loaded).all()


def test_treespec_names_public_class_and_old_spec_loads():
    td = TensorDict({"x": torch.zeros(2), "y": {"z": torch.zeros(2, 1)}}, [2])
    _, spec = pytree.tree_flatten(td)
    dumped = pytree.treespec_dumps(spec)
    assert "tdfunc.TensorDict" in dumped and "_core" not in dumped
    assert pytree.treespec_loads(dumped) == spec
    old = pytree.treespec_loads((DATA / "treespec_v0_1_0.json").read_text())
    assert old == spec
    rebuilt = pytree.tree_unflatten([torch.ones(2), torch.ones(2, 1)], old)
    assert type(rebuilt) is TensorDict and rebuilt.batch_size == torch.Size([2])
    torch.testing.assert_close(rebuilt["y", "z"], torch.ones(2, 1))


def _pickled_modules(payload: bytes) -> set[str]:
    """The module paths a pickle names (the arguments of its global lookups)."""
    import pickletools

    found: set[str] = set()
    strings: list[str] = []
    for opcode, argument, _ in pickletools.genops(payload):
        if opcode.name in ("GLOBAL", "INST"):
            found.add(argument.split(" ")[0])
        elif opcode.name == "STACK_GLOBAL":
            found.add(strings[-2])
        if isinstance(argument, str):
            strings.append(argument)
    return found


def test_pickles_of_non_tensor_leaves_name_only_public_paths():
    import pickle

    td = TensorDict({"a": torch.zeros(2), "s": "text"}, [2])
    stacked = torch.stack([TensorDict({"s": "a"}, []), TensorDict({"s": "b"}, [])])
    payload = pickle.dumps((td, stacked))
    tdfunc_modules = {m for m in _pickled_modules(payload) if m.startswith("tdfunc")}
    assert tdfunc_modules == {"tdfunc"}, tdfunc_modules


def test_a_pickle_naming_the_old_module_paths_still_loads():
    """Written by tdfunc before the non-tensor leaves moved (``tdfunc._core.nontensor``)."""
    import pickle

    payload = (DATA / "pickle_nontensor_old_paths.pkl").read_bytes()
    assert "tdfunc._core.nontensor.leaves" in _pickled_modules(payload)
    td, stacked, stack_leaf, leaf = pickle.loads(payload)
    assert td["s"] == "text" and torch.equal(td["a"], torch.zeros(2))
    assert stacked["s"] == ["a", "b"] and stacked.batch_size == torch.Size([2])
    assert type(leaf) is tdfunc.NonTensorData and type(stack_leaf) is tdfunc.NonTensorStack
