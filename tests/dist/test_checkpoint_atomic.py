"""Checkpoint files: a crash during save never moves `latest` off the last complete checkpoint,
keep-last-k retention, weights-only checkpoints, and clear errors for broken pointers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vepo_mcore.parallel.launch import run_processes
from vepo_mcore.training.checkpointing import LATEST_FILE, read_latest, resolve_checkpoint


def _cfg():
    from vepo_mcore.config import JobConfig

    cfg = JobConfig()
    cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by = 300, 64
    cfg.training.micro_batch_size, cfg.training.global_batch_size, cfg.training.seq_length = 2, 2, 16
    cfg.training.optimizer.lr = 1e-2
    return cfg


def _build(cfg):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.training.optimizer import build_optimizer, build_scheduler, wrap_model

    model = wrap_model(build_model(cfg), cfg)
    optimizer = build_optimizer(model, cfg)
    return model, optimizer, build_scheduler(optimizer, cfg)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _crash_body(rank, world, save: str):
    from megatron.core import dist_checkpointing

    from vepo_mcore.languages import default_tokenizer_dir
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training import checkpointing
    from vepo_mcore.training.forward import forward_step
    from vepo_mcore.training.trainer import train_step
    from vepo_mcore.training.optimizer import unwrap
    from vepo_mcore.training.sampler import micro_batches
    from vepo_mcore.training.synthetic import SyntheticTokens

    cfg = _cfg()
    init_model_parallel(cfg.parallel, seed=5)
    model, optimizer, scheduler = _build(cfg)
    data = micro_batches(SyntheticTokens(16, 16, 300), 0, 2, 0, 1)
    tok = default_tokenizer_dir()
    for it in (1, 2, 3):
        train_step(forward_step, data, model, optimizer, scheduler, 1, 16, 2)
        checkpointing.save_checkpoint(save, it, model, optimizer, scheduler, consumed_samples=2 * it,
                                      config=cfg, tokenizer_dir=tok, keep_last=2)  # fmt: skip
    saved = _weights(model)
    train_step(forward_step, data, model, optimizer, scheduler, 1, 16, 2)
    assert any(not torch.equal(saved[k], v) for k, v in _weights(model).items())

    # Crash 1: every shard written, then the process dies before the checkpoint is finalised.
    real_save = dist_checkpointing.save

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        raise RuntimeError("simulated crash after writing shards")

    dist_checkpointing.save = save_then_die
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            checkpointing.save_checkpoint(save, 4, model, optimizer, scheduler, config=cfg, keep_last=2)
    finally:
        dist_checkpointing.save = real_save
    assert read_latest(save) == 3
    assert not (Path(save) / "iter_0000004").exists() and (Path(save) / "iter_0000004.tmp").is_dir()

    # Crash 2: while copying the tokenizer beside the shards (after dist_checkpointing finished).
    real_copy = checkpointing.copy_tokenizer
    checkpointing.copy_tokenizer = lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    try:
        with pytest.raises(OSError, match="disk full"):
            checkpointing.save_checkpoint(
                save, 4, model, optimizer, scheduler, tokenizer_dir=tok, keep_last=2
            )
    finally:
        checkpointing.copy_tokenizer = real_copy
    assert read_latest(save) == 3

    # A fresh model resumes from the last complete checkpoint, bit for bit.
    model2, optimizer2, scheduler2 = _build(cfg)
    state = checkpointing.load_checkpoint(save, model2, optimizer2, scheduler2)
    assert state.iteration == 3 and state.consumed_samples == 6
    for k, v in _weights(model2).items():
        assert torch.equal(v, saved[k]), k
    assert scheduler2.num_steps == 3

    # The next save cleans the stale .tmp; retention keeps the newest two.
    checkpointing.save_checkpoint(save, 4, model2, optimizer2, scheduler2, keep_last=2)
    names = sorted(p.name for p in Path(save).iterdir() if p.name.startswith("iter_"))
    assert names == ["iter_0000003", "iter_0000004"]
    assert read_latest(save) == 4
    assert (Path(save) / "iter_0000003" / "config.yaml").is_file()
    assert (Path(save) / "iter_0000003" / "tokenizer" / "tokenizer.json").is_file()

    assert (Path(save) / "config.yaml").is_file() and (Path(save) / "tokenizer" / "tokenizer.json").is_file()

    # Weights-only checkpoints load the model and start at iteration 0: ours with optimizer=None,
    # and the layout HF conversion writes (vepo_mcore.checkpoint.convert).
    from vepo_mcore.checkpoint.convert import save_megatron_checkpoint

    checkpointing.save_checkpoint(f"{save}/weights", 0, model2)
    save_megatron_checkpoint(unwrap(model2), f"{save}/converted/iter_0000000")
    for path in (f"{save}/weights/iter_0000000", f"{save}/converted/iter_0000000"):
        model3, optimizer3, scheduler3 = _build(cfg)
        state = checkpointing.load_checkpoint(path, model3, optimizer3, scheduler3)
        assert state.iteration == 0 and state.consumed_samples == 0
        for k, v in _weights(model3).items():
            assert torch.equal(v, saved[k]), (path, k)


def test_crash_during_save_keeps_latest_and_resume_works(tmp_path):
    run_processes(_crash_body, 1, args=(str(tmp_path / "ckpt"),))


def test_latest_pointer_errors(tmp_path):
    assert read_latest(tmp_path) is None
    assert resolve_checkpoint(tmp_path) is None
    (tmp_path / LATEST_FILE).write_text("12\n")
    with pytest.raises(ValueError, match="iteration 12 is not a whole checkpoint"):
        resolve_checkpoint(tmp_path)
    (tmp_path / LATEST_FILE).write_text("iter_12")
    with pytest.raises(ValueError, match="expected an iteration number"):
        read_latest(tmp_path)
