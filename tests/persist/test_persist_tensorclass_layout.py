"""The on-disk layout of TensorClass instances (format 2) and reading the flat format 1.

A TensorClass is saved as tensordict's documentation shows (004, "nested types")::

    tc/
        _tensordict/        <- a plain TensorDict: the tensor and collection fields
            data.memmap
            meta.json
        meta.json           <- the class, the non-tensor fields, the order of all fields

Format 1 (tdfunc before this layout) saved a TensorClass flat, like a TensorDict;
those directories are written here by hand, from the format as it was specified,
and must keep loading.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
import torch

from tdfunc import MemoryMappedTensor, TensorClass, TensorDict
from tdfunc._core.helpers.class_names import class_name
from tdfunc._persist.directory import wait_for_cleanup


class Point(TensorClass):
    x: torch.Tensor
    label: str
    extra: Any = None


class Pair(TensorClass):
    left: Point
    right: torch.Tensor
    sub: TensorDict
    name: str


def _files(root) -> set[str]:
    """Every file under ``root``; ``x.<token>.memmap`` (a re-save's new file) shown as
    ``x.memmap``."""
    return {
        re.sub(r"\.[0-9a-f]{8}\.(memmap|pt)$", r".\1", os.path.relpath(os.path.join(d, n), root))
        for d, _, names in os.walk(root)
        for n in names
    }


def _meta(path) -> dict:
    with open(os.path.join(path, "meta.json")) as file:
        return json.load(file)


def _pair(seed: int = 0) -> Pair:
    g = torch.Generator().manual_seed(seed)
    left = Point(x=torch.randn(2, 3, generator=g), label="left", batch_size=[2])
    sub = TensorDict({"w": torch.randn(2, generator=g), "note": "n"}, [2])
    return Pair(left=left, right=torch.randn(2, 4, generator=g), sub=sub, name="p", batch_size=[2])


# ---------------------------------------------------------------------------- layout
def test_top_level_tensorclass_layout_and_metadata(tmp_path):
    x = torch.arange(6.0).view(3, 2)
    Point(x=x, label="top", batch_size=[3]).memmap(tmp_path)
    assert _files(tmp_path) == {"meta.json", "_tensordict/meta.json", "_tensordict/x.memmap"}
    top = _meta(tmp_path)
    assert top["version"] == 2 and top["class"] == class_name(Point)
    assert top["batch_size"] == [3] and top["keys"] == ["x", "label"]
    assert top["entries"] == {
        "label": {"kind": "non_tensor", "batch_size": [3], "stack": False, "value": "top"}
    }
    inner = _meta(tmp_path / "_tensordict")
    assert top["tensordict"] == {"dir": "_tensordict", "meta": inner}
    assert inner["class"] == class_name(TensorDict) and list(inner["entries"]) == ["x"]
    raw = (tmp_path / "_tensordict" / "x.memmap").read_bytes()
    assert raw == x.numpy().tobytes()


def test_nested_tensorclasses_each_get_a_tensordict_directory(tmp_path):
    pair = _pair()
    TensorDict({"pair": pair, "a": torch.zeros(2)}, [2]).memmap(tmp_path)
    assert _files(tmp_path) == {
        "meta.json",
        "a.memmap",
        "pair/meta.json",
        "pair/_tensordict/meta.json",
        "pair/_tensordict/right.memmap",
        "pair/_tensordict/left/meta.json",
        "pair/_tensordict/left/_tensordict/meta.json",
        "pair/_tensordict/left/_tensordict/x.memmap",
        "pair/_tensordict/sub/meta.json",
        "pair/_tensordict/sub/w.memmap",
    }
    loaded = TensorDict.load_memmap(tmp_path)["pair"]
    assert type(loaded) is Pair and type(loaded.left) is Point and type(loaded.sub) is TensorDict
    assert torch.equal(loaded.left.x, pair.left.x) and torch.equal(loaded.right, pair.right)
    assert torch.equal(loaded.sub["w"], pair.sub["w"]) and loaded.sub["note"] == "n"
    assert loaded.name == "p" and loaded.left.label == "left"
    # every level loads alone; a TensorClass's _tensordict is a plain TensorDict
    assert type(TensorDict.load_memmap(tmp_path / "pair")) is Pair
    alone = TensorDict.load_memmap(tmp_path / "pair" / "_tensordict")
    assert type(alone) is TensorDict and sorted(alone.keys()) == ["left", "right", "sub"]
    assert type(TensorDict.load_memmap(tmp_path / "pair/_tensordict/left")) is Point


def test_non_json_fields_are_stored_next_to_the_tensorclass_meta(tmp_path):
    point = Point(x=torch.ones(2), label="l", extra=(1, b"\x00"), batch_size=[2])
    point.memmap(tmp_path)
    assert _files(tmp_path) == {
        "meta.json",
        "extra.pt",
        "_tensordict/meta.json",
        "_tensordict/x.memmap",
    }
    loaded = Point.load_memmap(tmp_path)
    assert loaded.extra == (1, b"\x00") and loaded.label == "l"


def test_field_order_round_trips(tmp_path):
    point = Point(x=torch.zeros(2), label="a", batch_size=[2])
    point.extra = torch.ones(2)  # set after construction: stored after label
    order = list(point._td._data)
    point.memmap(tmp_path)
    loaded = Point.load_memmap(tmp_path)
    assert list(loaded._td._data) == order
    assert torch.equal(loaded.extra, torch.ones(2))


def test_memmap_in_place_like_and_refresh_use_the_layout(tmp_path):
    point = Point(x=torch.arange(3.0), label="a", batch_size=[3])
    like = point.memmap_like(tmp_path / "like")
    assert _files(tmp_path / "like") == {
        "meta.json",
        "_tensordict/meta.json",
        "_tensordict/x.memmap",
    }
    assert like.x.tolist() == [0.0, 0.0, 0.0] and like.label == "a"
    assert point.memmap_(tmp_path / "inplace") is point
    assert isinstance(point.x, MemoryMappedTensor)
    assert os.path.dirname(point.x.filename) == str(tmp_path / "inplace" / "_tensordict")
    assert point.saved_path == str(tmp_path / "inplace")
    Point(x=torch.full((3,), 5.0), label="b", batch_size=[3]).memmap(tmp_path / "inplace")
    point.memmap_refresh_()
    assert point.x.tolist() == [5.0, 5.0, 5.0] and point.label == "b"


def test_resaving_replaces_files_inside_the_tensordict_directory(tmp_path):
    for step in range(6):
        Point(x=torch.full((4,), float(step)), label=str(step), batch_size=[4]).memmap(tmp_path)
    wait_for_cleanup()
    loaded = Point.load_memmap(tmp_path)
    assert loaded.x.tolist() == [5.0] * 4 and loaded.label == "5"
    memmaps = [n for n in os.listdir(tmp_path / "_tensordict") if n.endswith(".memmap")]
    assert len(memmaps) == 1  # the files of earlier generations are removed


def test_replacing_a_tensorclass_by_a_tensordict_and_back(tmp_path):
    Point(x=torch.ones(2), label="a", batch_size=[2]).memmap(tmp_path)
    TensorDict({"y": torch.zeros(2)}, [2]).memmap(tmp_path)
    wait_for_cleanup()
    assert _files(tmp_path) == {"meta.json", "y.memmap"}
    Point(x=torch.ones(2), label="b", batch_size=[2]).memmap(tmp_path)
    wait_for_cleanup()
    assert _files(tmp_path) == {"meta.json", "_tensordict/meta.json", "_tensordict/x.memmap"}
    assert Point.load_memmap(tmp_path).label == "b"


def test_symbolic_link_tensordict_directory_is_refused(tmp_path, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    os.symlink(outside, tmp_path / "_tensordict")
    with pytest.raises(FileExistsError, match="_tensordict"):
        Point(x=torch.ones(2), label="a", batch_size=[2]).memmap(tmp_path)
    assert os.listdir(outside) == []


# ---------------------------------------------------------------------------- format 1
def _write_flat_point(directory, x: torch.Tensor, label: str) -> dict:
    """A Point saved flat, as format 1 wrote it; returns its metadata node."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "x.memmap"), "wb") as file:
        file.write(x.numpy().tobytes())
    node = {
        "format": "tdfunc.memmap",
        "version": 1,
        "class": class_name(Point),
        "batch_size": [x.shape[0]],
        "names": None,
        "device": "cpu",
        "entries": {
            "x": {"kind": "tensor", "file": "x.memmap", "dtype": "float32", "shape": list(x.shape)},
            "label": {"kind": "non_tensor", "batch_size": [x.shape[0]], "stack": False},
        },
    }
    node["entries"]["label"]["value"] = label
    with open(os.path.join(directory, "meta.json"), "w") as file:
        json.dump(node, file)
    return node


def test_format_1_top_level_tensorclass_still_loads(tmp_path):
    x = torch.arange(4.0)
    _write_flat_point(tmp_path, x, "old")
    for loaded in (Point.load_memmap(tmp_path), TensorDict.load_memmap(tmp_path)):
        assert type(loaded) is Point and loaded.label == "old" and loaded.extra is None
        assert isinstance(loaded.x, MemoryMappedTensor) and torch.equal(loaded.x, x)


def test_format_1_nested_tensorclass_still_loads(tmp_path):
    x = torch.arange(3.0)
    node = _write_flat_point(tmp_path / "p", x, "nested")
    with open(tmp_path / "a.memmap", "wb") as file:
        file.write(torch.ones(3).numpy().tobytes())
    top = {
        "format": "tdfunc.memmap",
        "version": 1,
        "class": class_name(TensorDict),
        "batch_size": [3],
        "names": None,
        "device": "cpu",
        "entries": {
            "a": {"kind": "tensor", "file": "a.memmap", "dtype": "float32", "shape": [3]},
            "p": {"kind": "collection", "dir": "p", "meta": node},
        },
    }
    (tmp_path / "meta.json").write_text(json.dumps(top))
    loaded = TensorDict.load_memmap(tmp_path)
    assert type(loaded["p"]) is Point and loaded["p"].label == "nested"
    assert torch.equal(loaded["p"].x, x) and torch.equal(loaded["a"], torch.ones(3))


def test_saving_over_format_1_migrates_and_keeps_old_mappings(tmp_path):
    _write_flat_point(tmp_path, torch.arange(3.0), "old")
    old = Point.load_memmap(tmp_path)
    Point(x=torch.full((3,), 9.0), label="new", batch_size=[3]).memmap(tmp_path)
    wait_for_cleanup()
    assert _files(tmp_path) == {"meta.json", "_tensordict/meta.json", "_tensordict/x.memmap"}
    assert _meta(tmp_path)["version"] == 2
    new = Point.load_memmap(tmp_path)
    assert new.label == "new" and new.x.tolist() == [9.0] * 3
    assert old.x.tolist() == [0.0, 1.0, 2.0]  # the removed file stays mapped


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["tensordict"].update(dir=".."), "'tensordict'"),
        (lambda m: m["tensordict"].update(dir="x"), "'tensordict'"),
        (lambda m: m.update(tensordict=[]), "'tensordict'"),
        (lambda m: m.update(keys=["x"]), "'keys'"),
        (lambda m: m.update(keys=["x", "label", "label"]), "'keys'"),
        (lambda m: m.update(keys=["x", ["label"]]), "'keys'"),
        (lambda m: m.pop("keys"), "'keys'"),
        (lambda m: m["tensordict"]["meta"].update(batch_size=[3, 1]), "batch size"),
        (lambda m: m["entries"].update(x=m["tensordict"]["meta"]["entries"]["x"]), "non_tensor"),
        (
            lambda m: m["tensordict"]["meta"]["entries"].update(label=m["entries"]["label"]),
            "both",
        ),
        (
            lambda m: m["tensordict"]["meta"].update(tensordict=json.loads(json.dumps(m))),
            "cannot be",
        ),
    ],
)
def test_corrupt_tensorclass_metadata_is_rejected(tmp_path, edit, message):
    Point(x=torch.zeros(3), label="a", batch_size=[3]).memmap(tmp_path)
    meta = _meta(tmp_path)
    edit(meta)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        Point.load_memmap(tmp_path)
