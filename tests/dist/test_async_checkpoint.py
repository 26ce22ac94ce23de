"""Asynchronous checkpoints on two gloo ranks when a step raises while a save is being written: raised
on every rank, run_training finalises the save before the error propagates; raised on one rank only,
the other cannot join the finalisation, so the save is abandoned on both and `latest` stays on the
previous checkpoint (no rank hangs: the ranks meet at a barrier on the store that gives up after a timeout)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vepo_mcore.parallel.launch import run_processes
from vepo_mcore.training.checkpointing import read_latest

VOCAB, SEQ = 300, 16


def _cfg(save: str):
    from vepo_mcore.config import JobConfig

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = 2, 64, 128
    m.num_attention_heads, m.num_query_groups, m.vocab_size, m.make_vocab_size_divisible_by = 4, 2, VOCAB, 64
    t = cfg.training
    t.micro_batch_size, t.global_batch_size, t.seq_length, t.train_iters = 1, 2, SEQ, 6
    t.checkpoint.save, t.checkpoint.save_interval, t.checkpoint.async_save = save, 2, True
    t.logging.progress_bar = False
    return cfg


def _failing_run(rank, world, save: str, failing_ranks: tuple[int, ...]):
    """Step 5 raises on `failing_ranks` while the save of iteration 4 is still being written (its
    writer sleeps 5 s first)."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    from vepo_mcore.training import checkpointing
    from vepo_mcore.training.forward import forward_step
    from vepo_mcore.training.trainer import pretrain
    from vepo_mcore.training.synthetic import SyntheticTokens

    checkpointing.ERROR_FINALIZE_TIMEOUT_S = 5.0
    trainer, write = os.getpid(), FileSystemWriterAsync.write_preloaded_data_multiproc

    def slow_write(*args):
        if os.getpid() != trainer and "iter_0000004.tmp" in str(args[3][0][0]):
            time.sleep(5)
        write(*args)

    FileSystemWriterAsync.write_preloaded_data_multiproc = staticmethod(slow_write)
    calls = 0

    def forward_step_failing_at_step_5(data_iterator, model):
        nonlocal calls
        calls += 1  # one micro-batch per step and rank
        if calls == 5 and rank in failing_ranks:
            raise RuntimeError(f"simulated failure on rank {rank}")
        return forward_step(data_iterator, model)

    try:
        pretrain(
            _cfg(save),
            SyntheticTokens(32, SEQ, VOCAB, seed=1),
            forward_step_func=forward_step_failing_at_step_5,
        )
    finally:
        assert checkpointing.async_saves_in_flight() == 0  # finalised or abandoned, never left running


def test_error_on_every_rank_finalises_the_save_in_flight(tmp_path):
    save = tmp_path / "all"
    with pytest.raises(RuntimeError, match="simulated failure on rank"):
        run_processes(_failing_run, 2, args=(str(save), (0, 1)))
    assert read_latest(save) == 4 and (save / "iter_0000004" / "metadata.json").is_file()
    assert not list(save.glob("iter_*.tmp"))


def test_error_on_one_rank_abandons_the_save_in_flight(tmp_path):
    save = tmp_path / "one"
    with pytest.raises(RuntimeError, match="simulated failure on rank 1"):
        run_processes(_failing_run, 2, args=(str(save), (1,)))
    assert read_latest(save) == 2 and (save / "iter_0000002" / "metadata.json").is_file()
    assert not (save / "iter_0000004").exists()
    assert not list(Path(save / "iter_0000004.tmp").glob("metadata.json"))
