"""docs/CLUSTER.md is true to the recipes: every command of the guide runs on a laptop.

Training, evaluation and reward-model commands run as their `--dry-run` for the guide's 16 ranks
(the launch scripts' own dry-run branch, torchrun replaced by python): config, layout and memory
plan. The other tools run with `--help`, and every flag the guide gives them must be one they
take. The memory column of the guide's table must be the peaks the dry runs print.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "CLUSTER.md"
WORLD = 16
DRY_RUN_TOOLS = {"pretrain_cpt", "train_vepo", "train_rm", "evaluate"}
TRAINING_TOOLS = {"pretrain_cpt", "train_vepo", "train_rm"}
ENV = {"VOCAB_SIZE": "151665", "PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}


def _steps() -> dict[str, list[str]]:
    """Heading of each numbered section -> the commands of its ```bash blocks."""
    steps, heading, block = {}, None, None
    for line in GUIDE.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("```bash"):
            block = []
        elif line.startswith("```") and block is not None:
            steps.setdefault(heading, []).extend(c for c in block if not c.startswith(("#", "export ")))
            block = None
        elif block is not None and line.strip():
            block.append(line.strip())
    return steps


def _table_row(step_number: str) -> str:
    return next(line for line in GUIDE.read_text().splitlines() if line.startswith(f"| {step_number}. "))


def _run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300
    )


def _as_laptop_check(command: str) -> tuple[str, list[str]]:
    """(the command to run here, flags to find in its output: --help's, for tools without a dry run)."""
    words = shlex.split(re.sub(r"\$(\w+)", lambda m: ENV.get(m.group(1), m.group(0)), command))
    env = [w for w in words if re.fullmatch(r"[A-Z_]+=\S*", w)]
    words = words[len(env) :]
    if words[0] == "bash" and words[1].startswith("examples/"):
        return shlex.join(env + words) + " --dry-run", []
    script = next(w for w in words if w.startswith("tools/") and w.endswith(".py"))
    args = words[words.index(script) + 1 :]
    tool = Path(script).stem
    python = shlex.quote(sys.executable)
    if tool in DRY_RUN_TOOLS:
        extra = f" --dry-run --world-size {WORLD}" if tool in TRAINING_TOOLS else " --dry-run"
        return f"{python} {script} {shlex.join(args)}{extra}", []
    sub = [args[0]] if args and not args[0].startswith("-") else []  # convert_hf's direction
    flags = sorted({a for a in args if a.startswith("--") and "." not in a})
    return f"{python} {script} {shlex.join(sub)} --help", flags


def test_the_guide_walks_the_ten_steps_in_order():
    headings = [h for h in _steps() if h and h[0].isdigit()]
    assert [int(h.split(".")[0]) for h in headings] == list(range(1, 11)), headings


@pytest.mark.parametrize("heading", [h for h in _steps() if h and h[0].isdigit()])
def test_every_command_of_the_guide_runs_here(heading):
    number = heading.split(".")[0]
    peaks = []
    for command in _steps()[heading]:
        check, flags = _as_laptop_check(command)
        done = _run(check)
        assert done.returncode == 0, f"{check}\n{done.stderr[-2000:]}"
        for flag in flags:
            assert re.search(rf"{re.escape(flag)}\b", done.stdout), (
                f"{command}: {flag} is not a flag of its tool"
            )
        peaks += re.findall(r"peak, (\w+)\s+([\d.]+) GiB", done.stdout)
    row = _table_row(number)
    for phase, gib in peaks:
        assert f"{phase} {gib} GiB" in row, f"step {number}: the plan says {phase} {gib} GiB, the table {row}"


def test_the_recipes_share_one_checkpoint_root_and_chain_their_checkpoints():
    """Each 7B recipe reads what the one before writes, all under runs/ (the folder docker/README.md
    mounts), and docker/README.md names the RL recipe's engine placement."""
    import yaml

    configs = ROOT / "examples" / "configs"
    sft, rm, rl = (
        yaml.safe_load((configs / f"{n}.yaml").read_text()) for n in ("sft_7b", "rm_7b", "vepo_7b")
    )
    cpt_save = re.search(r"^SAVE=\$\{SAVE:-(\S+)\}$", (ROOT / "examples/cpt_7b.sh").read_text(), re.M).group(
        1
    )
    runs = re.search(r"^RUNS=\$\{RUNS:-(\S+)\}", (ROOT / "examples/cpt_7b.sh").read_text(), re.M).group(1)
    assert runs == "runs" and cpt_save.replace("$RUNS", runs) == sft["training"]["checkpoint"]["load"]
    sft_save = sft["training"]["checkpoint"]["save"]
    assert rm["rm"]["init_from"] == rl["training"]["checkpoint"]["load"] == sft_save
    for path in (sft_save, rm["training"]["checkpoint"]["save"], rl["training"]["checkpoint"]["save"]):
        assert path.startswith("runs/"), path
    readme = (ROOT / "docker" / "README.md").read_text()
    assert "/workspace/vepo_mcore/runs" in readme and "/workspace/vepo_mcore/data" in readme
    per_engine = rl["rl"]["rollout"]["ranks_per_engine"]
    assert re.findall(r"ranks_per_engine (\d+)", readme) == [str(per_engine)]
