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
