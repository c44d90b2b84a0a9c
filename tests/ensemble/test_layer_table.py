"""The published table of batched layers (docs/ensemble-layers.md) agrees with the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from tdfunc._ensemble.layer_table import BEGIN, END, generated_part, layer_table
from tdfunc._ensemble.registry import _PLANNERS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "ensemble-layers.md"


def _rows(text: str) -> dict:
    """``{layer name: route}`` from the layer table of ``text``."""
    return dict(re.findall(r"^\| `nn\.(\w+)` \| (batched|`vmap`|chain|traced)", text, re.M))


def _generated_with(text: str) -> str:
    found = re.search(r"Generated with torch ([\w.]+)\.", text)
    assert found, "the generated table names the torch version it was made with"
    return found.group(1)


def test_page_holds_the_generated_table():
    page = generated_part(PAGE.read_text())
    assert page.startswith(BEGIN) and page.endswith(END)
    if _generated_with(page) != torch.__version__.split("+")[0]:
        pytest.skip("another torch version: its nn layers differ (see the registry test below)")
    assert page == layer_table(), (
        "docs/ensemble-layers.md is out of date with the registry: run "
        "`python -m tdfunc._ensemble.layer_table docs/ensemble-layers.md`"
    )


def test_page_says_batched_exactly_for_the_registered_layers():
    rows = _rows(PAGE.read_text())
    assert len(rows) > 100
    for name, route in rows.items():
        layer = getattr(nn, name, None)
        if layer is None:  # a layer of a newer torch than this one
            continue
        registered = layer in _PLANNERS
        assert registered == (route == "batched"), f"nn.{name}: the page says {route}"
    for name in dir(nn):
        layer = getattr(nn, name)
        if isinstance(layer, type) and issubclass(layer, nn.Module) and layer in _PLANNERS:
            assert rows.get(name) == "batched", f"nn.{name} is registered but not on the page"


def test_table_follows_the_registry(monkeypatch):
    """A planner registered or removed changes the generated table (it is not a copy)."""
    from tdfunc._ensemble import registry

    before = _rows(layer_table())
    assert before["MultiLabelMarginLoss"] == "`vmap`" and before["Linear"] == "batched"
    monkeypatch.setitem(registry._PLANNERS, nn.MultiLabelMarginLoss, lambda *a: None)
    monkeypatch.delitem(registry._PLANNERS, nn.Linear)
    after = _rows(layer_table())
    assert after["MultiLabelMarginLoss"] == "batched" and after["Linear"] == "`vmap`"


def test_notes_name_the_configurations_that_fall_back():
    table = layer_table()
    line = next(row for row in table.splitlines() if row.startswith("| `nn.EmbeddingBag`"))
    assert "`padding_idx`" in line and "`include_last_offset=True`" in line


def test_page_is_in_the_site_navigation():
    assert "ensemble-layers.md" in (ROOT / "mkdocs.yml").read_text()
