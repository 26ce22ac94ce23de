"""Virtual (interleaved) pipeline stages are refused when the config is validated (issue 23 item 6),
with a message naming the setting and what to set instead, for every job and rollout engine: the
training loop, the embedded engine and its weight sync run one model chunk per pipeline stage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.config.cli import EXIT_USER_ERROR

ROOT = Path(__file__).resolve().parents[2]
VPP = ["--parallel.pipeline_model_parallel_size", "2", "--parallel.virtual_pipeline_model_parallel_size", "2"]


@pytest.mark.parametrize("engine", ["embedded", "sglang"])
def test_vpp_is_a_config_error_naming_the_setting(engine):
    with pytest.raises(ValueError) as err:
        load_config(JobConfig, ROOT / "examples/configs/tiny.yaml", [*VPP, "--rl.rollout.engine", engine])
    text = str(err.value)
    assert text.startswith("parallel.virtual_pipeline_model_parallel_size=2: ")
    assert "Set parallel.virtual_pipeline_model_parallel_size to null" in text
    assert "parallel.pipeline_model_parallel_size alone" in text


def test_vpp_null_and_plain_pipeline_still_validate():
    cfg = load_config(JobConfig, ROOT / "examples/configs/tiny.yaml", VPP[:2])
    assert cfg.parallel.virtual_pipeline_model_parallel_size is None
    cfg.validate(world_size=2)


def test_vpp_dry_run_ends_with_the_setting_to_change():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools/train_vepo.py"), "--config", str(ROOT / "examples/configs/tiny.yaml"),
         "--dry-run", *VPP],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    assert "parallel.virtual_pipeline_model_parallel_size=2" in proc.stderr
    assert "Traceback" not in proc.stderr
