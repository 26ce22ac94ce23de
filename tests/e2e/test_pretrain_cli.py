"""`torchrun --nproc-per-node 2 tools/pretrain_cpt.py --config examples/configs/cpt_tiny.yaml` on CPU
(on the FLORES-dev corpus the quickstart builds), then SFT mode of the same tool fine-tuning from
that checkpoint, as the tool's --help writes them. Shapes are shrunk by dotted overrides to keep the
runs short."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shlex
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
    """Run `cmd` with its stdout redirected to a file, as a user's `> log` does; returns that file's text."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    log = cwd / "stdout.log"
    with log.open("w") as stdout:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600
        )
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return log.read_text()


def help_commands(tool: Path) -> list[list[str]]:
    """The example commands of a tool's docstring (its --help): the indented lines, continuations
    joined, one argv each, with this checkout's tools/ and examples/ and this interpreter."""
    doc = ast.get_docstring(ast.parse(tool.read_text()))
    code = "\n".join(line.strip() for line in doc.splitlines() if line.startswith("    "))
    argvs = []
    for text in code.replace("\\\n", " ").splitlines():
        argv = shlex.split(text)
        argv[0] = sys.executable if argv[0] == "python" else str(Path(sys.executable).with_name(argv[0]))
        argvs.append([str(ROOT / a) if a.startswith(("tools/", "examples/")) else a for a in argv])
    return argvs


LINE = re.compile(
    r"^\[[\d: -]+\] iteration (\d+)/2 \| consumed samples (\d+) \| consumed tokens ([\d,]+) \| elapsed time per "
    r"iteration \(ms\) [\d.]+ \| tokens/s [\d,]+ \| TFLOP/s per device [\d.e+-]+ \| lr [\d.E+-]+ \| loss [\d.]+ \| "
    r"grad norm [\d.]+ \| skipped 0 \| nan 0 \| peak memory [\d.]+ GiB \((RSS|GPU)\) \| eta [\d:]+$"
)


@pytest.mark.e2e
def test_the_help_example_chain_cpt_then_sft_from_its_checkpoint(tmp_path):
    """pretrain_cpt's --help chain as written (corpus, CPT on 2 ranks, SFT data, SFT loading the CPT
    checkpoint), each run kept tiny by dotted flags appended; stdout holds one line per interval."""
    build_cpt, cpt, build_sft, sft = help_commands(ROOT / "tools/pretrain_cpt.py")
    _run(build_cpt, tmp_path)
    log = _run(
        [*cpt, *SMALL, "--training.train_iters", "2", "--training.eval_interval", "2", "--training.eval_iters", "1",
         "--training.logging.progress_bar", "false"],
        tmp_path,
    )  # fmt: skip
    assert "TP=1 PP=1 DP=2" in log and "realised language share" in log
    lines = [line for line in log.splitlines() if " iteration " in line and "validation" not in line]
    assert [LINE.match(line).groups()[:3] for line in lines] == [("1", "4", "128"), ("2", "8", "256")], lines
    assert re.search(r"\] iteration 2/2 \| validation loss [\d.]+$", log, re.M)
    assert re.search(
        r"^saved checkpoint iter_0000002 to ckpt/cpt_tiny \([\d.]+ MiB\) in [\d.]+ s$", log, re.M
    )
    ckpt = tmp_path / "ckpt/cpt_tiny"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert (ckpt / "iter_0000002/config.yaml").is_file()
    assert (ckpt / "iter_0000002/tokenizer/tokenizer.json").is_file()
    rows = [json.loads(line) for line in (ckpt / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    # A freshly initialised model predicts ~uniformly over the 151,665-token vocabulary.
    assert abs(train[0]["train/loss"] - math.log(151665)) < 0.5
    assert any("valid/loss" in r for r in rows)

    _run(build_sft, tmp_path)
    assert "--training.checkpoint.load" in sft and "ckpt/cpt_tiny" in sft
    _run([*sft, *SMALL, "--training.train_iters", "1"], tmp_path)
    sft_rows = [
        json.loads(line) for line in (tmp_path / "ckpt/sft_tiny/metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in sft_rows] == [1] and math.isfinite(sft_rows[0]["train/loss"])
    assert (tmp_path / "ckpt/sft_tiny/latest_checkpointed_iteration.txt").read_text() == "1"


@pytest.mark.e2e
def test_cpt_without_validation_builds_no_validation_set(tmp_path):
    """training.eval_interval 0 on cpt_tiny.yaml as it is (seq_length 128): megatron built a validation
    blend anyway and failed with an IndexError; data.split 100,0,0 with eval_interval set runs too."""
    _run([sys.executable, str(ROOT / "tools/build_cpt_corpus.py"), "--output-dir", "data/cpt_tiny"], tmp_path)
    cpt = [sys.executable, str(ROOT / "tools/pretrain_cpt.py"), "--config", str(ROOT / "examples/configs/cpt_tiny.yaml"),
           "--training.train_iters", "1", "--training.global_batch_size", "4"]  # fmt: skip
    log = _run([*cpt, "--training.eval_interval", "0", "--training.checkpoint.save", "a"], tmp_path)
    assert "iteration 1/1 | consumed samples 4 |" in log and "validation" not in log
    log = _run([*cpt, "--training.eval_interval", "1", "--data.split", "100,0,0", "--training.checkpoint.save", "b"],
               tmp_path)  # fmt: skip
    assert "no validation set" in log and "validation loss" not in log


def test_cpt_7b_launcher_dry_run_documents_the_200b_token_schedule():
    env = {**os.environ, "NNODES": "8", "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "examples/cpt_7b.sh"), "--dry-run"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TP=4 PP=1" in proc.stdout
    assert "tokens/step 4,194,304 x 47,684 steps = 200.0B tokens" in proc.stdout
    assert "world 64 -> DP=16, gradient accumulation 64" in proc.stdout
