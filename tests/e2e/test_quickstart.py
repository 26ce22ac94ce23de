"""The README's main job, end to end with tiny step counts: every stage runs (tokenizer expansion and
trimming, base, resize, CPT, SFT, RL, held-out evaluation, reward model, FLORES scores) and the
summary reports each stage's held-out change with its interval, the RM's accuracy and the plots."""

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
        "BASE_ITERS": "2",
        "CPT_ITERS": "2",
        "SFT_ITERS": "2",
        "RM_ITERS": "2",
        "RL_ITERS": "1",
        "EVAL_SENTENCES": "2",
        "DIRECTIONS": "en-vi,vi-en",
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
    for stage in range(1, 5):
        assert f"[{stage}/4]" in out
    for stage in ("tokenizer_expand", "data_and_trim", "base", "resize", "cpt", "sft", "rl", "eval_rl"):
        assert f"seed0/{stage}:" in out or f"shared/{stage}:" in out, stage
    assert "quickstart summary" in out
    assert "TOK  expanded Qwen2.5 trimmed" in out
    assert "before SFT -> SFT" in out and "SFT -> RL" in out and "paired-bootstrap interval" in out
    assert "RM   pairwise accuracy" in out
    qs = tmp_path / "qs"
    seed = qs / "toy" / "seed0"
    for path in ("cpt/latest_checkpointed_iteration.txt", "sft/latest_checkpointed_iteration.txt",
                 "rl/rl_curves.png", "heldout_rl.jsonl", "hyps_rl/en-vi.txt"):  # fmt: skip
        assert (seed / path).is_file(), path
    for path in ("rm_eval/eval.md", "eval_rl/bootstrap.md"):
        assert (qs / path).is_file(), path
    assert "rl_curves.png" in out
