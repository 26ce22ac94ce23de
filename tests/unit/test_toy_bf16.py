"""The toy recipe trains in bf16 (fp32 master weights) at every stage where the CPU has AMX, and in
fp32 on a CPU without it, where bf16 runs tens of times slower (benchmarks/cpu_bf16.py)."""

from __future__ import annotations

import io

import pytest
import torch

import recipes.toy.recipe as recipe
from recipes.toy.recipe import CONFIGS, ToyPlan, precision_flags
from vepo_mcore.config.base import load_config
from vepo_mcore.config.job import JobConfig


@pytest.mark.parametrize("stage", ["base", "cpt", "sft", "rl"])
def test_every_stage_trains_in_bf16(stage):
    assert load_config(JobConfig, CONFIGS / f"{stage}.yaml").training.bf16


@pytest.fixture
def cpu(monkeypatch):
    """Set whether the (GPU-less) CPU has AMX."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return lambda amx: monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


def test_a_cpu_without_amx_trains_in_fp32_unless_the_run_says(tmp_path, cpu):
    cpu(False)
    assert precision_flags(ToyPlan(out=tmp_path)) == ["--training.bf16", "false"]
    for value in ("true", "false"):
        assert precision_flags(ToyPlan(out=tmp_path, overrides={"sft": ["--training.bf16", value]})) == []
    cpu(True)
    assert precision_flags(ToyPlan(out=tmp_path)) == []


def test_run_toy_puts_the_fp32_flags_before_the_runs_own_and_says_so(tmp_path, cpu, monkeypatch):
    seen = []
    monkeypatch.setattr(recipe, "build_shared", lambda plan: seen.append(plan) or {})
    monkeypatch.setattr(recipe, "run_seed", lambda plan, seed, paths: tmp_path / f"seed{seed}")
    cpu(False)
    log = io.StringIO()
    recipe.run_toy(ToyPlan(out=tmp_path, overrides={"all": ["--training.seed", "3"]}, log=log))
    assert seen[-1].overrides["all"] == ["--training.bf16", "false", "--training.seed", "3"]
    assert "no AMX" in log.getvalue() and "--set all.training.bf16=true" in log.getvalue()
    cpu(True)
    recipe.run_toy(ToyPlan(out=tmp_path, log=io.StringIO()))
    assert seen[-1].overrides == {}
