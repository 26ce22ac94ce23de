"""Pure pieces of the training loop: token-averaged loss, the DP sampler, the LR schedule, the
FLOPs estimate behind MFU, and the metrics writers (JSONL + tensorboard)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vepo_mcore.config import JobConfig
from vepo_mcore.training.forward import batch_to_device, masked_token_loss
from vepo_mcore.training.logging import MetricsLogger, model_flops_per_token
from vepo_mcore.training.sampler import micro_batches
from vepo_mcore.training.synthetic import SyntheticTokens


def test_masked_token_loss_is_sum_and_count():
    g = torch.Generator().manual_seed(0)
    per_token = torch.rand(3, 7, generator=g)
    mask = (torch.rand(3, 7, generator=g) > 0.4).float()
    loss_sum, num_tokens, report = masked_token_loss(mask, per_token)
    naive = sum(float(per_token[i, j]) for i in range(3) for j in range(7) if mask[i, j] > 0)
    assert math.isclose(loss_sum.item(), naive, rel_tol=1e-6)
    assert num_tokens.item() == int(mask.sum()) and num_tokens.dtype == torch.int
    assert report["loss"].tolist() == pytest.approx([naive, float(mask.sum())], rel=1e-6)


def test_batch_to_device_fills_positions_and_mask_and_names_missing_fields():
    batch = batch_to_device({"tokens": torch.zeros(2, 5, dtype=torch.long), "labels": torch.zeros(2, 5)})
    assert batch["position_ids"].tolist() == [list(range(5))] * 2
    assert batch["loss_mask"].sum().item() == 10
    with pytest.raises(ValueError, match="'tokens' and 'labels'"):
        batch_to_device({"tokens": torch.zeros(1, 2)})


def _sample_ids(dataset, consumed, mbs, rank, dp, steps):
    it = micro_batches(dataset, consumed, mbs, rank, dp)
    return [tuple(row.tolist()) for _ in range(steps) for row in next(it)["tokens"][:, :2]]


def test_sampler_reads_the_same_global_batches_for_any_dp_size_and_resume_point():
    data = SyntheticTokens(40, 8, 1000, seed=1)
    gbs = 8
    one = _sample_ids(data, 0, 2, 0, 1, steps=12)  # 3 global batches with DP=1
    for g in range(3):
        two = _sample_ids(data, g * gbs, 2, 0, 2, 2) + _sample_ids(data, g * gbs, 2, 1, 2, 2)
        assert sorted(two) == sorted(one[g * gbs : (g + 1) * gbs])
    # Resuming at global batch 1 continues exactly where an uninterrupted reader is.
    assert _sample_ids(data, gbs, 2, 0, 1, 8) == one[gbs : 3 * gbs]
    # Past the end the order wraps around (a new epoch over the same samples).
    assert _sample_ids(data, 40, 2, 0, 1, 1) == one[:2]


def test_lr_schedule_matches_warmup_then_cosine():
    from vepo_mcore.training.optimizer import build_scheduler

    cfg = JobConfig()
    o, s = cfg.training.optimizer, cfg.training.scheduler
    o.lr, o.min_lr, s.warmup_iters, s.decay_iters = 1e-3, 1e-4, 3, 10
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    scheduler = build_scheduler(opt, cfg)
    for k in range(14):
        if k <= 3:
            expect = 1e-3 * k / 3
        elif k <= 10:
            expect = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * (k - 3) / 7))
        else:
            expect = 1e-4
        assert math.isclose(opt.param_groups[0]["lr"], expect, rel_tol=1e-9, abs_tol=1e-15), k
        scheduler.step(increment=1)


def test_flops_per_token_matches_qwen25_7b_parameter_count():
    # Qwen2.5-7B: 28 layers, hidden 3584, FFN 18944, 28 heads / 4 KV heads, vocab 152064.
    # Qwen2.5 report: 6.53B non-embedding parameters; the output layer adds 3584 * 152064.
    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = 28, 3584, 18944
    m.num_attention_heads, m.num_query_groups, m.vocab_size = 28, 4, 152064
    cfg.training.seq_length = 1
    reference = 6 * (6.53e9 + 3584 * 152064)
    assert abs(model_flops_per_token(cfg) - reference) / reference < 0.01
    cfg.training.seq_length = 4096  # causal attention adds 6 * L * s * h per token
    extra = model_flops_per_token(cfg) - model_flops_per_token(cfg_with_seq(cfg, 1))
    assert math.isclose(extra, 6 * 28 * (4096 - 1) * 3584, rel_tol=1e-9)


def cfg_with_seq(cfg: JobConfig, seq: int) -> JobConfig:
    import copy

    out = copy.deepcopy(cfg)
    out.training.seq_length = seq
    return out


def test_metrics_logger_writes_jsonl_and_tensorboard(tmp_path, capsys):
    cfg = JobConfig()
    cfg.training.train_iters = 4
    cfg.training.checkpoint.save = str(tmp_path)
    cfg.training.logging.progress_bar = False
    logger = MetricsLogger(cfg, start_iteration=0, peak_flops=1e12)
    for step in (1, 2):
        row = logger.log(step, {"train/loss": 3.0 - step, "train/lr": 1e-4}, tokens=1000)
        assert row["perf/tokens_per_s"] > 0 and row["perf/mfu"] > 0 and row["perf/eta_s"] >= 0
    logger.log(2, {"valid/loss": 2.5}, tokens=None)
    logger.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 2]
    assert rows[1]["train/loss"] == 1.0 and "perf/tokens_per_s" not in rows[2]
    assert "| loss 1.0000 |" in capsys.readouterr().out  # the console line, on stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("train/loss")] == [2.0, 1.0]
    assert "valid/loss" in events.Tags()["scalars"]

    quiet = MetricsLogger(cfg, is_writer=False)
    quiet.log(3, {"train/loss": 0.5}, tokens=10)
    quiet.close()
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
