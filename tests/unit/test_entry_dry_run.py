"""The 7B recipes validate on CPU through the entry scripts' --dry-run (config, layout, batch shape),
and a layout the world size cannot hold is refused naming it."""

from __future__ import annotations

import pytest

CONFIGS = "examples/configs"


def test_pretrain_dry_run_reports_the_token_budget(capsys):
    from tools.pretrain_cpt import main

    main(
        [
            "--config",
            f"{CONFIGS}/qwen2.5-7b.yaml",
            "--dry-run",
            "--world-size",
            "64",
            "--training.train_iters",
            "10",
        ]
    )
    out = capsys.readouterr().out
    # 1024 x 4096 tokens per step; 64 ranks at TP=4 -> DP=16 -> 1024 / (1 x 16) = 64 accumulation steps.
    assert "tokens/step 4,194,304" in out and "DP=16, gradient accumulation 64" in out


def test_rl_and_rm_dry_runs_accept_the_7b_recipes(capsys):
    from tools.train_rm import main as train_rm
    from tools.train_vepo import main as train_vepo

    train_vepo(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--world-size", "16"])
    assert "rl:" in capsys.readouterr().out
    assert train_rm(["--config", f"{CONFIGS}/rm_7b.yaml", "--dry-run", "--world-size", "16"]) == {}
    assert "config OK" in capsys.readouterr().out


@pytest.mark.parametrize("tool", ["pretrain_cpt", "train_vepo", "train_rm"])
def test_dry_run_refuses_a_world_size_the_layout_cannot_hold(tool):
    import importlib

    main = importlib.import_module(f"tools.{tool}").main
    config = {"pretrain_cpt": "qwen2.5-7b", "train_vepo": "vepo_7b", "train_rm": "rm_7b"}[tool]
    with pytest.raises(ValueError, match="world size 6"):
        main(["--config", f"{CONFIGS}/{config}.yaml", "--dry-run", "--world-size", "6"])


def _checkpoint(folder):
    folder.mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("1")
    return str(folder)


def test_missing_inputs_are_warnings_and_errors_with_check_paths(tmp_path, capsys):
    """A dry run on a laptop plans a chain whose inputs later steps write: it names each missing one
    as a warning; --check-paths (on the cluster, before the launch) makes them one error."""
    from tools.train_rm import main as train_rm
    from tools.train_vepo import main as train_vepo

    absent = ["--tokenizer.path", str(tmp_path / "tok"), "--training.checkpoint.load", str(tmp_path / "sft")]
    train_vepo(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--world-size", "16", *absent])
    err = capsys.readouterr().err
    assert f"warning: tokenizer.path {tmp_path / 'tok'} has no tokenizer.json" in err
    assert f"warning: training.checkpoint.load {tmp_path / 'sft'} holds no checkpoint" in err
    with pytest.raises(
        ValueError, match=r"tokenizer.path .* has no tokenizer.json; training.checkpoint.load"
    ):
        train_vepo(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--check-paths", *absent])
    with pytest.raises(ValueError, match=r"^rm.init_from \S+ holds no checkpoint$"):
        train_rm(["--config", f"{CONFIGS}/rm_7b.yaml", "--dry-run", "--check-paths",
                  "--rm.init_from", str(tmp_path / "none")])  # fmt: skip
    assert train_rm(["--config", f"{CONFIGS}/rm_7b.yaml", "--dry-run", "--check-paths",
                     "--rm.init_from", _checkpoint(tmp_path / "sft_7b")]) == {}  # fmt: skip


def test_pretrain_dry_run_checks_cpt_prefixes_and_sft_sources(tmp_path):
    from tools.pretrain_cpt import main

    (tmp_path / "en.bin").write_bytes(b"")
    (tmp_path / "en.idx").write_bytes(b"")
    (tmp_path / "th.bin").write_bytes(b"")
    cpt = ["--config", f"{CONFIGS}/qwen2.5-7b.yaml", "--dry-run", "--check-paths",
           "--data.paths.en", str(tmp_path / "en"), "--data.paths.th", str(tmp_path / "th")]  # fmt: skip
    with pytest.raises(ValueError, match=rf"^data.paths.th {tmp_path / 'th'}: no {tmp_path / 'th'}.idx$"):
        main(cpt)
    (tmp_path / "th.idx").write_bytes(b"")
    main(cpt)
    with pytest.raises(ValueError, match=r"data.sft_phases\[0\].paths.general \S+: no \S+general_sft.json"):
        main(["--config", f"{CONFIGS}/sft_7b.yaml", "--dry-run", "--check-paths",
              "--tokenizer.path", "vepo_mcore/assets/qwen2.5-tokenizer",
              "--training.checkpoint.load", _checkpoint(tmp_path / "cpt")])  # fmt: skip


@pytest.mark.parametrize(
    "vocab_size, message",
    [
        ("152064", r"model.vocab_size \(152,064\) is the tokenizer at \S+ \(151,665 ids\) padded to a multiple "
                   r"of 512: set model.vocab_size to 151665"),
        ("151000", r"model.vocab_size \(151,000\) does not match the tokenizer at \S+ \(151,665 ids\): set "
                   r"model.vocab_size to 151665 \(after tools/resize_embeddings.py"),
        ("151800", r"model.vocab_size \(151,800\) does not match .*: set model.vocab_size to 151665$"),
    ],
)  # fmt: skip
def test_a_vocab_size_the_tokenizer_does_not_have_is_an_error_without_check_paths(vocab_size, message):
    from tools.train_vepo import main

    with pytest.raises(ValueError, match=message):
        main(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--model.vocab_size", vocab_size])


def test_the_user_sees_one_line_and_exit_code_2(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "tools/train_rm.py", "--config", f"{CONFIGS}/rm_7b.yaml", "--dry-run", "--check-paths",
         "--rm.init_from", str(tmp_path / "sft_7b")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: rm.init_from {tmp_path / 'sft_7b'} holds no checkpoint  (--debug or VEPO_DEBUG=1 for the traceback)"
    ]
