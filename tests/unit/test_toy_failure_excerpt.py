"""A failing stage of the toy recipe names its cause: the worker's traceback, not torchrun's
ChildFailedError summary that follows it in the log."""

from __future__ import annotations

import sys

import pytest

from recipes.toy.recipe import failure_excerpt, run_logged


def test_a_failing_torchrun_worker_reports_its_own_exception(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text("def build():\n    raise LookupError('no wordlist for ms')\n\nbuild()\n")
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script)]
    with pytest.raises(RuntimeError) as err:
        run_logged(args, tmp_path / "logs" / "stage.log", threads=1)
    message = str(err.value)
    assert "LookupError: no wordlist for ms" in message
    assert "in build" in message
    assert "ChildFailedError" not in message


def test_without_a_traceback_the_tail_is_shown():
    log = "".join(f"line {i}\n" for i in range(40))
    assert failure_excerpt(log, lines=3) == "line 37\nline 38\nline 39\n"


def test_a_worker_refusing_its_config_reports_the_refusal(tmp_path):
    """A tools/ script that refuses a setting prints one "error: ..." line and exits 2 (config.cli):
    that line, not torchrun's summary, is the message."""
    script = tmp_path / "stage.py"
    script.write_text(
        "import sys\n"
        "print('error: training.optimizer.min_lr must not exceed training.optimizer.lr', file=sys.stderr)\n"
        "sys.exit(2)\n"
    )
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script)]
    with pytest.raises(RuntimeError) as err:
        run_logged(args, tmp_path / "logs" / "stage.log", threads=1)
    message = str(err.value)
    assert "error: training.optimizer.min_lr must not exceed training.optimizer.lr" in message
    assert "ChildFailedError" not in message and "Root Cause" not in message
