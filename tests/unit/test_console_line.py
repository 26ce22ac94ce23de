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
