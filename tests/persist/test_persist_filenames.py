"""Any key round-trips and stays inside the prefix; names never collide, even ignoring case."""

from __future__ import annotations

import os
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tdfunc import TensorDict
from tdfunc._persist.filenames import encode_key, is_valid_name

TRICKY_KEYS = [
    "a",
    "A",
    "/",
    "a/b",
    "..",
    ".",
    "../escape",
    "/etc/passwd",
    "\\windows\\path",
    "%2e%2e",
    "%",
    "meta.json",
    "meta",
    "x.memmap",
    "x",
    "CON",
    "con",
    "nul",
    "NUL.txt",
    "COM1",
    "lpt9",
    "aux",
    "",
    " ",
    "trailing.",
    "trailing ",
    "clé",
    "ключ",
    "键",
    "emoji😀",
    "e\u0301",  # decomposed é: macOS would normalise a raw name
    "\u00e9",
    "x" * 300,
    "X" * 300,
    "tab\tnewline\n",
    "nul\x00byte",
    "~",
    "a~0123456789abcdef",
]


def _windows_reserved(name: str) -> bool:
    stem = name.split(".")[0].lower()
    return stem in {"con", "prn", "aux", "nul"} or re.fullmatch(r"(com|lpt)[0-9]", stem) is not None


@given(st.text(max_size=80))
@settings(max_examples=300, deadline=None)
def test_encoded_names_are_portable(key):
    name = encode_key(key)
    assert is_valid_name(name)
    assert 0 < len(name) <= 64
    assert re.fullmatch(r"[a-z0-9_~-]+", name)  # lowercase ASCII, no '.', '/', '\\'
    assert not _windows_reserved(name)


@given(st.lists(st.text(max_size=12), unique=True, max_size=30))
@settings(max_examples=200, deadline=None)
def test_distinct_keys_never_collide_even_ignoring_case(keys):
    names = [encode_key(k).lower() for k in keys]
    assert len(set(names)) == len(keys)


def test_case_variants_get_different_names():
    variants = ["weight", "Weight", "WEIGHT", "wEiGhT"]
    names = {encode_key(k).casefold() for k in variants}
    assert len(names) == len(variants)
    assert encode_key("weight") == "weight"  # simple keys stay readable


def _walk(root):
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            yield os.path.join(directory, name)


def test_tricky_keys_round_trip_and_stay_inside_the_prefix(tmp_path):
    sandbox = tmp_path / "sandbox"
    prefix = sandbox / "saved"
    plain = {key: torch.full((2,), float(i)) for i, key in enumerate(TRICKY_KEYS)}
    nested = {key: {"leaf": torch.full((2,), -float(i))} for i, key in enumerate(TRICKY_KEYS)}
    td = TensorDict({"flat": plain, "nested": nested}, [2])
    td.memmap(prefix)
    assert os.listdir(sandbox) == ["saved"]  # nothing was written next to the prefix
    real_prefix = os.path.realpath(prefix)
    for path in _walk(prefix):
        assert os.path.realpath(path).startswith(real_prefix + os.sep)
        assert not os.path.islink(path)
    # names are unique case-insensitively in every directory
    for directory, dirs, files in os.walk(prefix):
        lowered = [n.lower() for n in dirs + files]
        assert len(lowered) == len(set(lowered)), directory
    loaded = TensorDict.load_memmap(prefix)
    assert list(loaded["flat"].keys()) == TRICKY_KEYS
    for i, key in enumerate(TRICKY_KEYS):
        assert loaded["flat", key].tolist() == [float(i)] * 2
        assert loaded["nested", key, "leaf"].tolist() == [-float(i)] * 2


def test_nested_directory_of_a_simple_key_is_the_key(tmp_path):
    TensorDict({"nested": {"e": torch.zeros(())}}, []).memmap(tmp_path)
    assert TensorDict.load_memmap(tmp_path / "nested")["e"].item() == 0


@pytest.mark.parametrize("key", ["Upper", "with space", "ключ"])
def test_nested_directory_of_other_keys_loads_through_its_encoded_name(tmp_path, key):
    TensorDict({key: {"e": torch.ones(())}}, []).memmap(tmp_path)
    assert TensorDict.load_memmap(tmp_path / encode_key(key))["e"].item() == 1
