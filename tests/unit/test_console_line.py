"""The console line of a log interval: Megatron-LM's fields (timestamp, iteration/total, consumed samples
and tokens, ms per iteration, tokens/s, TFLOP/s per device, lr, loss, grad norm, skipped and nan counts,
peak memory), RL's reward terms, length, entropy, KL, clip fraction and time split; printed on stdout
whether or not a progress bar is drawn; the curves a person reads at a glance."""

from __future__ import annotations

import math
import re

import pytest

from vepo_mcore.config import JobConfig
from vepo_mcore.training.logging import MetricsLogger, format_line, model_flops_per_token, rl_flops_per_token

CPT_LINE = re.compile(
    r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] iteration 2/4 \| consumed samples 16 \| consumed tokens 2,048 \| "
    r"elapsed time per iteration \(ms\) [\d.]+ \| tokens/s [\d,]+ \| TFLOP/s per device [\d.e+-]+ \| "
    r"lr 1\.000E-04 \| loss 2\.5000 \| grad norm 0\.500 \| skipped 1 \| nan 1 \| "
    r"peak memory [\d.]+ GiB \((RSS|GPU)\) \| eta \d\d:\d\d$"
)


def test_a_cpt_interval_prints_megatrons_fields_on_stdout(capsys):
    cfg = JobConfig()
    cfg.training.train_iters = 4
    logger = MetricsLogger(cfg, 0)
    step = {"train/loss": 2.5, "train/lr": 1e-4, "train/grad_norm": 0.5, "train/skipped": 0.0}
    interval = [{**step, "train/skipped": 1.0}, {**step, "train/loss": math.nan}]
    row = logger.log(2, step, tokens=2048, steps=2, consumed_samples=16, interval=interval)
    logger.close()
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and CPT_LINE.match(out[0]), out
    assert row["train/skipped_iters"] == 1 and row["train/nan_iters"] == 1
    expected = row["perf/tokens_per_s"] * model_flops_per_token(cfg) / 1e12
    assert row["perf/tflops_per_device"] == pytest.approx(expected)
    assert row["perf/peak_memory_gib"] > 0.01  # this process's peak RSS on CPU


def test_an_rl_interval_adds_rewards_length_entropy_kl_clip_and_time_split():
    row = {
        "train/loss": 0.01, "train/lr": 1e-5, "train/grad_norm": 0.3, "perf/step_time_s": 2.0,
        "reward/total": 0.7, "reward/mt": 0.2, "reward/mt_raw": 20.0, "reward/length": 1.0,
        "rollout/len_mean": 12.5, "rollout/entropy": 2.25, "rl/kl_k3": 1e-3, "rl/clip_frac": 0.125,
        "perf/rollout_s": 1.3, "perf/sync_s": 0.2, "perf/experience_s": 0.5, "perf/train_s": 0.8,
    }  # fmt: skip
    line = format_line(3, 10, row)
    for field in ("iteration 3/10", "elapsed time per iteration (ms) 2000.0", "reward 0.700 (mt 0.200 length 1.000)",
                  "response length 12.5", "entropy 2.250", "kl 1.00e-03", "clip frac 0.125",
                  "time rollout/sync/logprobs/train (s) 1.3/0.2/0.5/0.8"):  # fmt: skip
        assert f"| {field}" in line or line.endswith(field) or f"] {field}" in line, (field, line)
    assert "mt_raw" not in line


def test_rl_flops_count_the_steps_passes():
    cfg = JobConfig()
    cfg.rl.filtering.num_candidates, cfg.rl.filtering.group_size, cfg.rl.ppo_epochs = 8, 4, 1
    forward = model_flops_per_token(cfg, seq_length=2 * cfg.rl.rollout.sampling.max_new_tokens) / 3
    # generation of K/G = 2 candidates per kept one, the old log-probs, 3 for one epoch of training
    assert rl_flops_per_token(cfg) == pytest.approx(forward * (2 + 1 + 3))


def test_curves_have_a_legend_integer_steps_and_no_offset(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    from vepo_mcore.training.curves import plot_curves

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    history = [{"step": i, "rollout/entropy": 11.9166 + 1e-7 * (i % 2)} for i in range(1, 4)]
    plot_curves(history, tmp_path / "c.png", panels=(("rollout/entropy", "entropy"),), smooth=0.8)
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["raw", "smoothed (EMA 0.8)"]
    figures[0].canvas.draw()
    assert all(float(t).is_integer() for t in ax.get_xticks() if 1 <= t <= 3)
    formatter = ax.yaxis.get_major_formatter()
    assert isinstance(formatter, ScalarFormatter) and not formatter.get_useOffset()
    assert formatter.get_offset() == ""


class _FakeWandb:
    """The few calls of the wandb package the logger makes (wandb is optional, not installed here)."""

    def __init__(self):
        self.inits, self.rows, self.finished = [], [], 0
        self.util = type("util", (), {"generate_id": staticmethod(lambda: "run123")})

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, row, step):
        self.rows.append((step, row))

    def finish(self):
        self.finished += 1


def test_wandb_logs_every_row_when_configured_and_resumes_its_run(tmp_path, monkeypatch):
    import sys

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = JobConfig()
    cfg.training.checkpoint.save = str(tmp_path)
    cfg.training.logging.wandb_project = "vepo"
    for start in (0, 1):  # a run, then its relaunch from step 1
        logger = MetricsLogger(cfg, start)
        logger.log(start + 1, {"train/loss": 1.0}, tokens=10)
        logger.close()
    assert [i["id"] for i in fake.inits] == ["run123", "run123"] and fake.inits[0]["mode"] == "offline"
    assert fake.inits[0]["project"] == "vepo" and fake.inits[0]["config"]["training"]["train_iters"] == 10
    assert [step for step, _ in fake.rows] == [1, 2] and fake.rows[0][1]["train/loss"] == 1.0
    assert fake.finished == 2


def test_without_the_wandb_package_the_field_is_named(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    cfg = JobConfig()
    cfg.training.logging.wandb_project = "vepo"
    with pytest.raises(ValueError, match=r"training.logging.wandb_project 'vepo' needs the wandb package"):
        MetricsLogger(cfg)
    MetricsLogger(JobConfig()).close()  # off unless configured


def test_megatrons_no_cache_warning_prints_once(caplog, monkeypatch):
    import logging

    from vepo_mcore.data import blend

    monkeypatch.setattr(blend._NO_CACHE_FILTER, "seen", False)  # as in a fresh process
    blend._warn_once_about_no_cache()
    blend._warn_once_about_no_cache()  # a second dataset build adds no second filter
    megatron = logging.getLogger("megatron.core.datasets.blended_dataset")
    with caplog.at_level(logging.WARNING, logger=megatron.name):
        for split in ("train", "valid"):
            megatron.warning("Cannot save the BlendedDataset indexes because path_to_cache is None")
            megatron.warning(f"another warning ({split})")
    assert [r.getMessage().startswith("Cannot save") for r in caplog.records] == [True, False, False]
