"""Imports sit at module top unless a dependency is optional or heavy, and then the module says so.

Every import inside a function of vepo_mcore names what it imports in its module's one comment

    # Imported where used: megatron.core (heavy: ...), matplotlib (heavy; plots only).

placed after the module's top-level imports: the top-level package for anything outside vepo_mcore
(the standard library included, so a cheap stdlib import never hides in a function), the module
path for vepo_mcore's own modules (`vepo_mcore.models.gpt (pulls megatron.core)`). And the modules
that promise a cheap import (their docstrings: the config, evaluation of files, the reward
registry, the tokenising tool; the trainers, whose save folder's lock comes before megatron)
import without the heavy packages, checked in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "vepo_mcore"
MARKER = "# Imported where used:"
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def where_used_names(source: str) -> set[str] | None:
    """The dotted names in the module's '# Imported where used:' comment (its continuation lines are
    the comment lines right below it); None without one."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(MARKER):
            text = [line[len(MARKER) :]]
            for more in lines[i + 1 :]:
                if not more.startswith("#") or more.startswith(MARKER):
                    break
                text.append(more[1:])
            return set(_NAME.findall(" ".join(text)))
    return None


def _function_imports(tree: ast.Module):
    """Import statements inside a function (at any depth), in source order."""
    found = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return sorted(found, key=lambda n: n.lineno)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[tuple[str, set[str]]]:
    """(what the statement imports, the names any one of which the comment must hold) per target."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
        return [(t, {t} if t.split(".")[0] == "vepo_mcore" else {t.split(".")[0]}) for t in targets]
    base = node.module or ""
    if node.level:  # relative: resolved against this module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    if base.split(".")[0] != "vepo_mcore":
        return [(base, {base.split(".")[0]})]
    # `from vepo_mcore.checkpoint import mapping`: the package or the submodule may be named
    return [(base, {base} | {f"{base}.{alias.name}" for alias in node.names})]


def lazy_import_problems(source: str, path: str, module: str, is_package: bool = False) -> list[str]:
    """One line per function-level import its module's comment does not name (file:line: what to do)."""
    tree = ast.parse(source)
    imports = _function_imports(tree)
    named = where_used_names(source)
    problems = []
    if named is not None and not imports:
        problems.append(f"{path}: '{MARKER}' comment but no import inside a function: remove the comment")
    for node in imports:
        statement = ast.get_source_segment(source, node) or ast.unparse(node)
        for target, accepted in _imported(node, module, is_package):
            top = target.split(".")[0]
            named_here = set(named or ())
            if top != "vepo_mcore":  # `megatron.core` in the comment names megatron
                named_here = {name.split(".")[0] for name in named_here}
            if accepted & named_here:
                continue
            want = " or ".join(sorted(accepted))
            if top in sys.stdlib_module_names:
                fix = f"{top} is in the standard library: import it at the module's top"
            else:
                fix = (
                    "import it at the module's top; if it must stay lazy (an optional extra, a heavy "
                    f"import, lock order, an import cycle), name {want} and why in the module's "
                    f"'{MARKER} ...' comment after its top-level imports"
                )
            problems.append(f"{path}:{node.lineno}: `{statement.strip()}` inside a function: {fix}")
    return problems


def test_every_function_level_import_is_named_in_its_modules_comment():
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "assets" in path.relative_to(PACKAGE).parts:
            continue
        problems += lazy_import_problems(
            path.read_text(encoding="utf-8"),
            str(path.relative_to(ROOT)),
            _module_name(path),
            is_package=path.name == "__init__.py",
        )
    assert not problems, "\n".join(problems)


def test_the_check_sees_unnamed_and_stdlib_lazy_imports():
    source = (
        "import os\n\n"
        "# Imported where used: megatron.core (heavy), vepo_mcore.models.gpt (pulls megatron.core).\n\n\n"
        "def f():\n"
        "    import json\n"
        "    from megatron.core import parallel_state\n"
        "    from vepo_mcore.models.gpt import QwenGPTModel\n"
        "    from vepo_mcore.models.builder import build_model\n"
        "    import torch\n"
        "    from . import vocab\n"
    )
    problems = lazy_import_problems(source, "m.py", "vepo_mcore.models.m")
    assert [p.split(": ")[0] for p in problems] == ["m.py:7", "m.py:10", "m.py:11", "m.py:12"]
    assert "json is in the standard library" in problems[0]
    assert "name vepo_mcore.models.builder" in problems[1]
    assert "name torch" in problems[2]
    assert "vepo_mcore.models or vepo_mcore.models.vocab" in problems[3]
    stale = lazy_import_problems(
        "import os\n\n# Imported where used: torch (heavy).\n", "s.py", "vepo_mcore.s"
    )
    assert stale == [
        "s.py: '# Imported where used:' comment but no import inside a function: remove the comment"
    ]


HEAVY = ("torch", "megatron", "matplotlib", "transformers", "sglang")

# Modules whose docstrings (or whose users) promise a cheap import: no torch, no megatron.
TORCH_FREE = (
    "vepo_mcore.config",
    "vepo_mcore.languages",
    "vepo_mcore.translation.prompts",
    "vepo_mcore.data",  # imported by each of its submodules, the tokenising tool's included
    "vepo_mcore.data.indexed",
    "vepo_mcore.data.preprocess",
    "vepo_mcore.tokenizer",
    "vepo_mcore.tokenizer.report",
    "vepo_mcore.training",
    "vepo_mcore.training.curves",
    "vepo_mcore.training.logging",
    "vepo_mcore.rewards",  # the reward registry
    "vepo_mcore.rewards.constraints",
    "vepo_mcore.rewards.mt",
    "vepo_mcore.rm.reward",  # registering the `rm` term costs nothing
    "vepo_mcore.eval.comet",
    "vepo_mcore.eval.heldout",  # reading and summarising records (the recipes' reports)
    "vepo_mcore.eval.runner",  # scoring hypothesis files
    "vepo_mcore.eval.systems",
)
# torch is fine here, megatron is not: the trainers (and the runner that takes the save folder's
# lock) load it only once the lock is held; conversion's and resize's CLI checks come before it; the
# engine registry imports the embedded engine.
MEGATRON_FREE = (
    "vepo_mcore.training.runner",
    "vepo_mcore.training.trainer",
    "vepo_mcore.rl.trainer",
    "vepo_mcore.rm.train",
    "vepo_mcore.checkpoint.convert",
    "vepo_mcore.checkpoint.resize",
    "vepo_mcore.rollout",
    "vepo_mcore.models.main_grad",
)

_PROBE = """
import importlib, json, sys
forbidden, first = sys.argv[1].split(","), {}
for name in sys.argv[2:]:
    importlib.import_module(name)
    first.update({m: name for m in forbidden if m in sys.modules and m not in first})
print(json.dumps(first))
"""


@pytest.mark.parametrize(
    "modules, forbidden",
    [(TORCH_FREE, HEAVY), (MEGATRON_FREE, tuple(m for m in HEAVY if m != "torch"))],
    ids=["torch-free", "megatron-free"],
)
def test_cheap_modules_import_without_heavy_packages(modules, forbidden):
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(forbidden), *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not loaded, "\n".join(
        f"importing {module} loads {package}: move that import into the function that needs it and "
        f"name it in the module's '{MARKER}' comment"
        for package, module in loaded.items()
    )
