"""examples/configs/cpt_tiny.yaml and sft_tiny.yaml: they load, validate and build datasets from the tools' output."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.data import build_datasets
from vepo_mcore.data.blend import language_blend, realised_language_share
from vepo_mcore.data.sft import SFTCurriculum
from vepo_mcore.data.sft_flores import default_sft_phases
from vepo_mcore.languages import LANGS

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"


def test_cpt_tiny_blend_is_english_half_and_builds(tmp_path, monkeypatch):
    cfg = load_config(JobConfig, CONFIGS / "cpt_tiny.yaml")
    cfg.validate(world_size=2)
    assert list(cfg.data.paths) == list(LANGS)
    blend = language_blend(cfg.data)
    assert blend["en"] == pytest.approx(0.5)
    assert all(blend[lang] == pytest.approx(0.5 / 9) for lang in LANGS if lang != "en")
    # The config's relative paths are exactly what tools/build_cpt_corpus.py writes.
    sys.path.insert(0, str(ROOT / "tools"))
    import build_cpt_corpus

    monkeypatch.chdir(tmp_path)
    assert build_cpt_corpus.main(["--output-dir", "data/cpt_tiny"]) == 0
    samples = cfg.training.global_batch_size * cfg.training.train_iters
    train, valid = build_datasets(cfg, samples, valid_samples=16)
    assert len(train) >= samples and valid is not None
    share = realised_language_share(train, cfg.data, samples)
    assert share["en"] == pytest.approx(0.5, abs=0.02)
    assert all(os.path.isfile(f"{p}.bin") for p in cfg.data.paths.values())


def test_sft_tiny_is_the_default_curriculum_and_builds(tmp_path, monkeypatch):
    cfg = load_config(JobConfig, CONFIGS / "sft_tiny.yaml")
    cfg.validate(world_size=2)
    sources = {s: f"data/sft_tiny/{s}.jsonl" for s in ("general", "multilingual", "translation", "reasoning")}
    assert cfg.data.sft_phases == default_sft_phases(sources, 120)
    sys.path.insert(0, str(ROOT / "tools"))
    import build_sft_data

    monkeypatch.chdir(tmp_path)
    assert build_sft_data.main(["--output-dir", "data/sft_tiny", "--per-source", "60"]) == 0
    curriculum, valid = build_datasets(cfg, train_samples=0)
    assert isinstance(curriculum, SFTCurriculum) and valid is None
    # The configured run consumes (about) the whole curriculum once.
    steps = len(curriculum) / cfg.training.global_batch_size
    assert 0.7 * cfg.training.train_iters <= steps <= 1.5 * cfg.training.train_iters
