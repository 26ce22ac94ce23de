"""Entry scripts stay short (issue 21): the work lives in the package, tools/ only parses and calls."""

from __future__ import annotations

from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def test_every_entry_script_is_under_80_lines():
    lengths = {path.name: len(path.read_text().splitlines()) for path in TOOLS.glob("*.py")}
    assert len(lengths) >= 15
    assert {name: n for name, n in lengths.items() if n >= 80} == {}
