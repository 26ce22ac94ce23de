"""The toy recipe trains in bf16 (fp32 master weights) at every stage, and says so where that is
slower than fp32: a CPU without AMX."""

from __future__ import annotations

import pytest
import torch

from recipes.toy.recipe import CONFIGS, ToyPlan, slow_bf16_note
from vepo_mcore.config.base import load_config
from vepo_mcore.config.job import JobConfig


@pytest.mark.parametrize("stage", ["base", "cpt", "sft", "rl"])
def test_every_stage_trains_in_bf16(stage):
    assert load_config(JobConfig, CONFIGS / f"{stage}.yaml").training.bf16


def test_a_cpu_without_amx_is_told_how_to_train_in_fp32(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    note = slow_bf16_note(ToyPlan(out=tmp_path))
    assert "no AMX" in note and "--set all.training.bf16=false" in note
    assert slow_bf16_note(ToyPlan(out=tmp_path, overrides={"all": ["--training.bf16", "false"]})) is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert slow_bf16_note(ToyPlan(out=tmp_path)) is None
