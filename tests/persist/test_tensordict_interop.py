"""tdfunc and tensordict read each other's checkpoints in tensordict's layout.

Without tensordict: tdfunc reads the committed checkpoints tensordict 0.15.3 wrote
(tests/data/tensordict_0_15_3, made by tests/data/make_tensordict_checkpoints.py)
and writes the same files, names and metadata for the same content. With tensordict
(``TDFUNC_TENSORDICT_PYTHON``, run in its own process): random containers with keys
holding spaces, ``:``, ``%``, unicode and metadata-like names go both ways.
"""

from __future__ import annotations

import json
import os
import random
import shutil

import pytest
import torch

from tdfunc import TensorDict
from tests import tensordict_peer

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "tensordict_0_15_3")


def _keys_content() -> TensorDict:
    """What tests/data/make_tensordict_checkpoints.py saved as ``keys``, rebuilt."""
    return TensorDict(
        {
            "next obs": torch.arange(2, dtype=torch.float32),
            "a:b": torch.arange(4, dtype=torch.int32).view(2, 2),
            "100%": torch.tensor([True, False]),
            "p%q": {"x y": torch.arange(2, dtype=torch.float64)},
            "lab el": "written by tensordict",
            "format": torch.zeros(2, dtype=torch.uint8),
            "é": torch.ones(2, dtype=torch.float16),
        },
        [2],
    )


def _files(root) -> dict:
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                data = f.read()
            out[os.path.relpath(path, root)] = json.loads(data) if name == "meta.json" else data
    return out


def test_reads_tensordicts_percent_encoded_names():
    loaded = TensorDict.load_memmap(os.path.join(DATA, "keys"))
    expected = _keys_content()
    assert set(loaded.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        if isinstance(expected[key], torch.Tensor):
            assert loaded[key].dtype == expected[key].dtype
            assert torch.equal(loaded[key], expected[key])
        else:
            assert loaded[key] == expected[key]


def test_writes_the_files_tensordict_writes(tmp_path):
    _keys_content().memmap(tmp_path / "ck", format="tensordict")
    assert _files(tmp_path / "ck") == _files(os.path.join(DATA, "keys"))
    plain = TensorDict(
        {
            "a": torch.arange(6, dtype=torch.float32).view(2, 3),
            "b": {"c": torch.arange(2, dtype=torch.int64), "flag": torch.tensor([True, False])},
            "note": "written by tensordict",
        },
        [2],
    )
    plain.memmap(tmp_path / "plain", format="tensordict")
    assert _files(tmp_path / "plain") == _files(os.path.join(DATA, "plain"))
    named = TensorDict({"a": torch.arange(6.0).view(2, 3)}, [2, 3], names=["rows", "cols"])
    named.memmap(tmp_path / "named", format="tensordict")
    assert _files(tmp_path / "named") == _files(os.path.join(DATA, "named"))


def test_random_checkpoints_round_trip_within_tdfunc(tmp_path):
    rng = random.Random(1)
    for i in range(40):
        tree = _random_tree(rng)
        _build(tree).memmap(tmp_path / f"ck{i}", format="tensordict")
        assert _dump(TensorDict.load_memmap(tmp_path / f"ck{i}")) == _as_json(tree), tree


def test_a_legacy_checkpoint_with_plain_names_loads(tmp_path):
    # older tensordict versions named files after the keys themselves
    shutil.copytree(os.path.join(DATA, "keys"), tmp_path / "ck")
    os.rename(tmp_path / "ck" / "next%20obs.memmap", tmp_path / "ck" / "next obs.memmap")
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    assert torch.equal(loaded["next obs"], torch.arange(2.0))


# ------------------------------------------------------------------ against tensordict
_ALPHABET = ["a", "Z", "0", " ", ":", "%", "é", "中", "_", "-", ".", "|", "?", "*", "\t", "%2"]
_META_LIKE = ["format", "data", "type", "dtype", "is_nested", "entries", "version", "meta.json"]


def _percent(key: str) -> str:
    """tensordict's file name for ``key`` (written from its documentation, independently)."""
    if key in ("", ".", ".."):
        return {"": "%", ".": "%2E", "..": "%2E%2E"}[key]
    unsafe = set('/<>:"|?*\\ \0%') | {chr(i) for i in range(32)} | {chr(127)}
    return "".join(f"%{ord(c):02X}" if c in unsafe else c for c in key)


def _random_tree(rng: random.Random, depth: int = 0) -> dict:
    """Keys and values as plain Python: ``{key: ("t", dtype, values) | ("s", text) | {...}}``."""
    tree: dict = {}
    used_names: set[str] = {"meta.json"}
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.3:
            key = rng.choice(_META_LIKE)
        else:
            key = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 6)))
        if key in tree or key in ("meta.json",):
            continue
        roll = rng.random()
        if roll < 0.5:
            kind = rng.choice(["float32", "int64", "bool", "float64"])
            numbers = [rng.randint(-5, 5) for _ in range(2)]
            value = ("t", kind, [n > 0 for n in numbers] if kind == "bool" else numbers)
            name = key + ".memmap"
        elif roll < 0.75 or depth >= 2:
            value = ("s", "".join(rng.choice(_ALPHABET) for _ in range(4)))
            name = key
        else:
            value = _random_tree(rng, depth + 1)
            name = key
        encoded = _percent(key) + (
            ".memmap" if isinstance(value, tuple) and value[0] == "t" else ""
        )
        if encoded in used_names or name in used_names:
            continue
        used_names.add(encoded)
        tree[key] = value
    return tree


def _build(tree: dict) -> TensorDict:
    data: dict = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            data[key] = _build(value)
        elif value[0] == "t":
            data[key] = torch.tensor(value[2], dtype=getattr(torch, value[1]))
        else:
            data[key] = value[1]
    return TensorDict(data, [2])


# one tensordict process for all the trees: it reads what tdfunc wrote, then writes them
_TENSORDICT_SIDE = """
import json, sys, torch
from tensordict import TensorDict, NonTensorData
def dump(td):
    out = {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            out[key] = ["t", str(value.dtype)[6:], value.tolist()]
        elif isinstance(value, NonTensorData):
            out[key] = ["s", value.data]
        else:
            out[key] = dump(value)
    return out
def build(tree):
    data = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            data[key] = build(value)
        elif value[0] == "t":
            data[key] = torch.tensor(value[2], dtype=getattr(torch, value[1]))
        else:
            data[key] = value[1]
    return TensorDict(data, [2])
with open(sys.argv[1]) as f:
    jobs = json.load(f)
read = [dump(TensorDict.load_memmap(job["read"])) for job in jobs]
for job in jobs:
    build(job["tree"]).memmap(job["write"])
print(json.dumps(read))
"""


def _as_json(tree: dict) -> dict:
    return json.loads(json.dumps(tree))


def _dump(td: TensorDict) -> dict:
    out: dict = {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            out[key] = ["t", str(value.dtype)[6:], value.tolist()]
        elif isinstance(value, TensorDict):
            out[key] = _dump(value)
        else:
            out[key] = ["s", value]
    return out


def test_random_checkpoints_both_ways(tmp_path):
    rng = random.Random(0)
    trees = [_random_tree(rng) for _ in range(16)]
    jobs = []
    for i, tree in enumerate(trees):
        _build(tree).memmap(tmp_path / f"by-tdfunc-{i}", format="tensordict")
        jobs.append(
            {
                "tree": tree,
                "read": str(tmp_path / f"by-tdfunc-{i}"),
                "write": str(tmp_path / f"by-tensordict-{i}"),
            }
        )
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    out = tensordict_peer.run(_TENSORDICT_SIDE, str(tmp_path / "jobs.json"))
    assert out.returncode == 0, out.stderr[-2000:]
    read_by_tensordict = json.loads(out.stdout)
    for i, tree in enumerate(trees):
        assert read_by_tensordict[i] == _as_json(tree), (i, tree)  # tdfunc -> tensordict
        loaded = TensorDict.load_memmap(tmp_path / f"by-tensordict-{i}")
        assert _dump(loaded) == _as_json(tree), (i, tree)  # tensordict -> tdfunc


def test_tensordict_loads_locked_and_unlocked_as_tdfunc_does(tmp_path):
    TensorDict({"a": torch.zeros(2)}, [2]).lock_().memmap(tmp_path / "ck", format="tensordict")
    out = tensordict_peer.run(
        "import sys; from tensordict import TensorDict;"
        "print(TensorDict.load_memmap(sys.argv[1]).is_locked)",
        str(tmp_path / "ck"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(TensorDict.load_memmap(tmp_path / "ck").is_locked)


def test_in_place_writes_reach_what_tensordict_loads(tmp_path):
    TensorDict({"x": torch.zeros(2), "label": "cat"}, [2]).memmap(
        tmp_path / "ck", format="tensordict"
    )
    loaded = TensorDict.load_memmap(tmp_path / "ck")
    loaded[1] = TensorDict({"x": torch.tensor(5.0), "label": "emu"}, [])
    out = tensordict_peer.run(
        "import sys, json; from tensordict import TensorDict;"
        "t = TensorDict.load_memmap(sys.argv[1]);"
        "print(json.dumps([t['x'].tolist(), t[0]['label'], t[1]['label']]))",
        str(tmp_path / "ck"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [[0.0, 5.0], "cat", "emu"]


def test_subpath_finds_percent_encoded_levels():
    sub = TensorDict.load_memmap(os.path.join(DATA, "keys"), subpath="p%q")
    assert torch.equal(sub["x y"], torch.arange(2, dtype=torch.float64))
    with pytest.raises(KeyError, match=r"nested containers at that level are \['p%q'\]"):
        TensorDict.load_memmap(os.path.join(DATA, "keys"), subpath="lab el")
