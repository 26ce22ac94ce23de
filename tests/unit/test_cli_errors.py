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


CPT = ["--config", str(ROOT / "examples/configs/cpt_tiny.yaml")]
RL = ["--config", str(ROOT / "examples/configs/vepo_tiny.yaml")]
COPY = ["--eval.system.kind", "copy-source", "--eval.directions", "en-th", "--eval.max_sentences", "2"]


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (tool and arguments, what the one error line must say)."""
    (tmp / "bad.yaml").write_text("training:\n  train_iters: 3\n  seq_length: [1, 2\nmodel: {}\n")
    (tmp / "a_file").write_text("")
    (tmp / "full").mkdir()
    (tmp / "full" / "x").write_text("")
    (tmp / "not_a_checkpoint").mkdir()
    return {
        "yaml syntax": (["pretrain_cpt.py", "--config", str(tmp / "bad.yaml")], "bad.yaml: line 4, column 6: YAML syntax"),
        "megatron flag": (["pretrain_cpt.py", *CPT, "--tensor-model-parallel-size", "2"],
                          "did you mean --parallel.tensor_model_parallel_size?"),
        "save folder is a file": (["pretrain_cpt.py", *CPT, "--training.checkpoint.save", str(tmp / "a_file")],
                                  "training.checkpoint.save"),
        "save folder under a file": (["pretrain_cpt.py", *CPT, "--training.checkpoint.save", str(tmp / "a_file/ckpt")],
                                     "cannot create the folder"),
        "reward weight typo": (["train_vepo.py", *RL, "--rl.rewards.weights.repetiton", "0.5", "--dry-run"],
                               "unknown reward term(s) ['repetiton']; registered: "),
        "TP*PP before batch shape": (["train_vepo.py", "--config", str(ROOT / "examples/configs/vepo_7b.yaml"),
                                      "--dry-run", "--world-size", "30"], "world size 30 is not divisible by TP*PP*CP"),
        "convert a folder that is no checkpoint": (["convert_hf.py", "megatron-to-hf", "--ckpt",
                                                    str(tmp / "not_a_checkpoint"), "--out", str(tmp / "hf")],
                                                   "no config.yaml in"),
        "convert into a non-empty folder": (["convert_hf.py", "megatron-to-hf", "--ckpt", str(tmp / "not_a_checkpoint"),
                                             "--out", str(tmp / "full")], "is not empty; pass --overwrite"),
        "evaluate comet as a metric": (["evaluate.py", *COPY, "--eval.metrics", "bleu,comet", "--eval.out_dir",
                                        str(tmp / "ev")], "eval.metrics: 'comet' is not a string metric"),
        "evaluate a missing comet checkpoint": (["evaluate.py", *COPY, "--eval.comet_checkpoint", str(tmp / "no.ckpt"),
                                                 "--eval.out_dir", str(tmp / "ev")], "eval.comet_checkpoint"),
    }  # fmt: skip


def _without_rendezvous(env) -> dict[str, str]:
    """The environment less a MASTER_PORT an earlier test in this process may have left behind."""
    return {k: v for k, v in env.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")}


def test_each_bad_input_is_one_line_and_exit_2(tmp_path):
    for name, (command, says) in _bad_inputs(tmp_path).items():
        tool, *args = command
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / tool), *args], capture_output=True, text=True, cwd=tmp_path,
            env={**_without_rendezvous(os.environ), "VEPO_DEBUG": "", "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == EXIT_USER_ERROR, (name, proc.stderr[-2000:])
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], (name, lines)
    assert not (tmp_path / "hf").exists()  # nothing written before the inputs were checked


def test_print_config_and_help_list_the_effective_fields():
    import yaml

    proc = _tool(*CPT, "--training.train_iters", "7", "--print-config")
    assert proc.returncode == 0, proc.stderr
    tree = yaml.safe_load(proc.stdout)
    assert tree["training"]["train_iters"] == 7 and tree["training"]["checkpoint"]["save"] == "ckpt/cpt_tiny"
    assert tree["rl"]["rewards"]["weights"]["mt"] == 1.0
    help_text = _tool("--help").stdout
    assert "training: Training loop" in help_text
    assert "  --training.train_iters 10  # Optimizer steps" in help_text
    assert "  --parallel.tensor_model_parallel_size 1  # TP" in help_text


def test_a_close_typo_gets_a_did_you_mean():
    proc = _tool(*TYPO)
    assert "; did you mean 'train_iters'?" in proc.stderr
