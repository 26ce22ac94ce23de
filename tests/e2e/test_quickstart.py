"""The README's main job, end to end with tiny step counts: every stage runs and the summary
reports reward, constraint pass rates, the reward model's accuracy, chrF before/after RL and the plots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_runs_the_whole_pipeline(tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PY": sys.executable,
        "TORCHRUN": str(bin_dir / "torchrun"),
        "OUT": str(tmp_path / "qs"),
        "CPT_ITERS": "2",
        "SFT_ITERS": "2",
        "RM_ITERS": "2",
        "RL_ITERS": "1",
        "EVAL_SENTENCES": "2",
        "DIRECTIONS": "en-th,th-en",
    }
    proc = subprocess.run(
        ["bash", "examples/quickstart_cpu.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = proc.stdout
    for stage in range(1, 9):
        assert f"[{stage}/8]" in out
    assert "quickstart summary" in out
    assert "R_mt (chrF++/100)" in out and "constraint pass rates" in out
    assert "chrf++" in out  # before -> after RL
    assert "RM   pairwise accuracy" in out
    qs = tmp_path / "qs"
    for path in ("cpt/latest_checkpointed_iteration.txt", "sft/latest_checkpointed_iteration.txt",
                 "rl/rl_curves.png", "rm_eval/eval.md", "eval_sft/table3.md", "eval_rl/bootstrap.md", "eval_rl/hyps/en-th.txt"):  # fmt: skip
        assert (qs / path).is_file(), path
    assert "rl_curves.png" in out
