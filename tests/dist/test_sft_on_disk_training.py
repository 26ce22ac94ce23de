"""SFT from on-disk data (tools/preprocess_sft.py's format) through the real training loop on gloo DP=2:
the validation split is evaluated at every eval_interval, and a run resumed from its step-2
checkpoint trains steps 3-4 bitwise like the uninterrupted run (same samples, same losses)."""

from __future__ import annotations

import json

from vepo_mcore.config import JobConfig
from vepo_mcore.parallel.launch import run_processes


def _cfg(tmp: str, save: str, iters: int, prefixes: dict[str, str]) -> JobConfig:
    from vepo_mcore.data.sft_flores import default_sft_phases

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_attention_heads, m.num_query_groups = (
        2,
        32,
        64,
        4,
        2,
    )
    m.vocab_size, m.max_position_embeddings = 151665, 256  # the shipped Qwen2.5 tokenizer's ids
    t = cfg.training
    t.micro_batch_size, t.global_batch_size, t.seq_length, t.train_iters = 1, 4, 64, iters
    t.optimizer.lr, t.optimizer.min_lr = 3e-3, 3e-4
    t.scheduler.warmup_iters, t.scheduler.decay_iters = 1, 4
    t.eval_interval, t.eval_iters = 2, 1
    t.checkpoint.save, t.checkpoint.save_interval = f"{tmp}/{save}", 2
    t.logging.progress_bar = False
    d = cfg.data
    d.mode, d.sft_phases, d.sft_valid_fraction, d.cache_dir = (
        "sft",
        default_sft_phases(prefixes, 16),
        0.15,
        tmp,
    )
    return cfg


def _train(tmp: str, save: str, iters: int, prefixes: dict[str, str], out: str | None) -> None:
    import torch

    from vepo_mcore.training.trainer import pretrain

    history = pretrain(_cfg(tmp, save, iters, prefixes))
    if out and torch.distributed.get_rank() == 0:
        with open(f"{tmp}/{out}", "w") as f:
            json.dump(history, f)


def _first(rank, world, tmp, prefixes):
    _train(tmp, "full", 4, prefixes, "full.json")
    _train(tmp, "half", 2, prefixes, None)


def _resume(rank, world, tmp, prefixes):
    _train(tmp, "half", 4, prefixes, "resumed.json")


def test_on_disk_sft_trains_evaluates_and_resumes_exactly(tmp_path):
    from vepo_mcore.data.sft_flores import build_flores_sft_set
    from vepo_mcore.data.sft_indexed import preprocess_sft

    tmp = str(tmp_path)
    jsonl = build_flores_sft_set(tmp_path / "jsonl", per_source=20, seed=2)
    prefixes = {name: f"{tmp}/disk/{name}" for name in jsonl}
    for name, path in jsonl.items():
        preprocess_sft([path], prefixes[name])
    run_processes(_first, 2, args=(tmp, prefixes))
    run_processes(
        _resume, 2, args=(tmp, prefixes)
    )  # a fresh process group: data position from the checkpoint
    full = json.loads((tmp_path / "full.json").read_text())
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert [r["step"] for r in resumed] == [3, 4]
    for a, b in zip(full[2:], resumed):
        for key in ("train/loss", "train/grad_norm", "train/lr", "valid/loss"):
            assert a.get(key) == b.get(key), (key, a["step"], a.get(key), b.get(key))
    # The validation set is evaluated at steps 2 and 4 and is not the training loss.
    assert "valid/loss" in full[1] and "valid/loss" in full[3] and "valid/loss" in resumed[1]
    assert full[3]["valid/loss"] != full[3]["train/loss"]
    assert full[0]["train/loss"] != full[3]["train/loss"]  # it trains, so equality is not trivial
