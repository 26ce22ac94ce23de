"""`torchrun --nproc-per-node 2 tools/pretrain_cpt.py --config examples/configs/cpt_tiny.yaml` on CPU
(on the FLORES-dev corpus the quickstart builds), then SFT mode of the same tool fine-tuning from
that checkpoint. Shapes are shrunk by dotted overrides to keep the run short."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "--training.seq_length",
    "32",
    "--training.micro_batch_size",
    "2",
    "--training.global_batch_size",
    "4",
]


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stderr


@pytest.mark.e2e
def test_cpt_with_torchrun_then_sft_from_its_checkpoint(tmp_path):
    py = sys.executable
    torchrun = str(Path(py).with_name("torchrun"))
    _run([py, str(ROOT / "tools/build_cpt_corpus.py"), "--output-dir", "data/cpt_tiny"], tmp_path)
    log = _run(
        [torchrun, "--nproc-per-node", "2", str(ROOT / "tools/pretrain_cpt.py"),
         "--config", str(ROOT / "examples/configs/cpt_tiny.yaml"), *SMALL,
         "--training.train_iters", "2", "--training.eval_interval", "2", "--training.eval_iters", "1",
         "--training.checkpoint.save", "ckpt/cpt", "--training.logging.progress_bar", "false"],
        tmp_path,
    )  # fmt: skip
    assert "TP=1 PP=1 DP=2" in log and "realised language share" in log
    ckpt = tmp_path / "ckpt/cpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (ckpt / "iter_0000002/config.yaml").is_file()
    assert (ckpt / "iter_0000002/tokenizer/tokenizer.json").is_file()
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    # A freshly initialised model predicts ~uniformly over the 151,665-token vocabulary.
    assert abs(train[0]["train/loss"] - math.log(151665)) < 0.5
    assert any("valid/loss" in r for r in rows)

    _run([py, str(ROOT / "tools/build_sft_data.py"), "--output-dir", "data/sft_tiny"], tmp_path)
    _run(
        [py, str(ROOT / "tools/pretrain_cpt.py"), "--config", str(ROOT / "examples/configs/sft_tiny.yaml"),
         *SMALL, "--training.train_iters", "1", "--training.checkpoint.save", "ckpt/sft",
         "--training.checkpoint.load", "ckpt/cpt", "--training.checkpoint.finetune", "true"],
        tmp_path,
    )  # fmt: skip
    sft_rows = [json.loads(line) for line in (tmp_path / "ckpt/sft/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft_rows] == [1] and math.isfinite(sft_rows[0]["train/loss"])
    assert (tmp_path / "ckpt/sft/latest_checkpointed_iteration.txt").read_text() == "1"


def test_cpt_7b_launcher_dry_run_documents_the_200b_token_schedule():
    env = {**os.environ, "NNODES": "8", "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "examples/cpt_7b.sh"), "--dry-run"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TP=4 PP=1" in proc.stdout
    assert "tokens/step 4,194,304 x 47,684 steps = 200.0B tokens" in proc.stdout
    assert "world 64 -> DP=16, gradient accumulation 64" in proc.stdout
