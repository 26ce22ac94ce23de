"""Entry scripts stay short (the work lives in the package, tools/ only parses and calls), and
nothing outside tests/ imports it: benchmarks and tools share stand-ins through harness/."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"


def test_every_entry_script_is_under_80_lines():
    lengths = {path.name: len(path.read_text().splitlines()) for path in TOOLS.glob("*.py")}
    assert len(lengths) >= 15
    assert {name: n for name, n in lengths.items() if n >= 80} == {}


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_script_outside_tests_imports_tests():
    scripts = [
        p for folder in ("benchmarks", "tools", "recipes", "harness") for p in (ROOT / folder).rglob("*.py")
    ]
    assert len(scripts) >= 30
    offenders = {
        str(p.relative_to(ROOT)): sorted(
            m for m in _imported_modules(p) if m == "tests" or m.startswith("tests.")
        )
        for p in scripts
    }
    assert {name: mods for name, mods in offenders.items() if mods} == {}
