"""Metrics resume with the run: a logger starting at iteration N drops the JSONL records and the
tensorboard events after N (a run killed after its last checkpoint), so each step appears once;
the logger prints one plain line per log interval on stdout."""

from __future__ import annotations

import json

import pytest

from vepo_mcore.config import JobConfig
from vepo_mcore.training.logging import MetricsLogger, drop_records_after, read_metrics


def _cfg(tmp_path) -> JobConfig:
    cfg = JobConfig()
    cfg.training.train_iters = 6
    cfg.training.checkpoint.save = str(tmp_path)
    return cfg


def _run(cfg, start: int, stop: int, offset: float) -> None:
    logger = MetricsLogger(cfg, start)
    for step in range(start + 1, stop + 1):
        logger.log(step, {"train/loss": step + offset}, tokens=100)
    logger.close()


def test_resume_drops_the_steps_after_the_checkpoint(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    _run(cfg, 0, 5, offset=0.0)  # killed after step 5, last checkpoint at step 2
    _run(cfg, 2, 6, offset=0.5)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["train/loss"] for r in rows] == [1, 2, 3.5, 4.5, 5.5, 6.5]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [e.step for e in scalars] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in scalars] == [1, 2, 3.5, 4.5, 5.5, 6.5]

    # stderr is not a terminal here: no progress bar redrawn with carriage returns, one line a step.
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "\r" not in captured.out
    assert "] iteration 6/6 | " in captured.out and "| loss 6.5000 |" in captured.out


def test_a_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    assert drop_records_after(path, 2) == 1
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
    assert drop_records_after(path, 2) == 0 and drop_records_after(tmp_path / "absent.jsonl", 0) == 0


def test_read_metrics_merges_the_records_of_a_step(tmp_path):
    cfg = _cfg(tmp_path)
    logger = MetricsLogger(cfg, 0)
    for step in (1, 2):
        logger.log(step, {"train/loss": float(step)}, tokens=100)
    logger.log(2, {"valid/chrf": 15.0}, tokens=None)  # an evaluation row at the same step
    logger.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["train/loss"] == 2.0 and rows[1]["valid/chrf"] == 15.0 and "valid/chrf" not in rows[0]
    assert read_metrics(tmp_path / "absent.jsonl") == []


def test_read_metrics_skips_a_torn_last_line_and_names_a_bad_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 2, "a": 1}\n{"step": 1, "a": 2}\n\n{"step": 3, "a"')
    assert read_metrics(path) == [{"step": 1, "a": 2}, {"step": 2, "a": 1}]
    path.write_text('{"step": 1, "a": 1}\n\nnot json\n{"step": 2, "a": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not JSON"):
        read_metrics(path)
