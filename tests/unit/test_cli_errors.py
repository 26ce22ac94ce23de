"""Entry scripts end a user's mistake with one line on rank 0 and exit 2; --debug or VEPO_DEBUG=1
shows the traceback; an error raised inside a library (an internal failure) keeps its traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.config.cli import EXIT_USER_ERROR, is_user_error, run_cli

ROOT = Path(__file__).resolve().parents[2]
TYPO = ["--config", str(ROOT / "examples/configs/cpt_tiny.yaml"), "--training.train_itres", "3"]


def _tool(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools/pretrain_cpt.py"), *args],
        capture_output=True, text=True, env={**os.environ, "VEPO_DEBUG": "", **env},
    )  # fmt: skip


def test_config_typo_is_one_line_and_exit_2():
    proc = _tool(*TYPO)
    assert proc.returncode == EXIT_USER_ERROR
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training: unknown key(s) ['train_itres']")
    assert "Traceback" not in proc.stderr and "--debug" in lines[0]


@pytest.mark.parametrize(("flag", "env"), [("--debug", ""), (None, "1")])
def test_debug_shows_the_traceback(flag, env):
    proc = _tool(*TYPO, *([flag] if flag else []), VEPO_DEBUG=env)
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    assert "unknown key(s) ['train_itres']" in proc.stderr


def _ours():
    from vepo_mcore.config.base import parse_overrides

    parse_overrides(["--model"])  # a flag without a value: a ValueError raised by vepo_mcore


def test_only_rank_0_prints_and_library_errors_keep_their_traceback(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["tool"])
    monkeypatch.setenv("VEPO_DEBUG", "0")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as exit_:
        run_cli(_ours)
    assert exit_.value.code == EXIT_USER_ERROR and capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        run_cli(_ours)
    assert capsys.readouterr().err.startswith("error: ")
    # json's own ValueError is not one of ours: it propagates with its traceback.
    with pytest.raises(json.JSONDecodeError) as raised:
        run_cli(lambda: json.loads("{oops"))
    assert not is_user_error(raised.value)
