"""Asynchronous checkpoints (training.checkpoint.async_save, megatron.core's async save request):
the same state as a synchronous save, visible only once finalised, atomic when the trainer is killed
while its writer runs, and finalised by the end of run_training. One gloo process each (the
two-rank cases, errors on some ranks included, are in tests/dist/test_async_checkpoint.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vepo_mcore.parallel.launch import run_processes
from vepo_mcore.training.checkpointing import INTEGRITY_FILE, read_latest

VOCAB, SEQ = 300, 16


def _cfg(save: str | None = None, iters: int = 6, async_save: bool = False):
    from vepo_mcore.config import JobConfig

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = 2, 64, 128
    m.num_attention_heads, m.num_query_groups, m.vocab_size, m.make_vocab_size_divisible_by = 4, 2, VOCAB, 64
    t = cfg.training
    t.micro_batch_size, t.global_batch_size, t.seq_length, t.train_iters = 2, 2, SEQ, iters
    t.optimizer.lr, t.scheduler.warmup_iters, t.scheduler.decay_iters = 1e-2, 1, 6
    t.checkpoint.save, t.checkpoint.save_interval, t.checkpoint.async_save = save, 2, async_save
    t.logging.progress_bar = False
    return cfg


def _build(cfg):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.training.optimizer import build_optimizer, build_scheduler, wrap_model

    model = wrap_model(build_model(cfg), cfg)
    optimizer = build_optimizer(model, cfg)
    return model, optimizer, build_scheduler(optimizer, cfg)


def _data():
    from vepo_mcore.training.synthetic import SyntheticTokens

    return SyntheticTokens(64, SEQ, VOCAB, seed=3, masked_prefix=True)


def _loaded(path: str) -> dict:
    """Everything a checkpoint restores, loaded into a fresh model/optimizer/scheduler."""
    from vepo_mcore.training import checkpointing
    from vepo_mcore.training.checkpointing import rng_state

    cfg = _cfg()
    model, optimizer, scheduler = _build(cfg)
    state = checkpointing.load_checkpoint(path, model, optimizer, scheduler)
    adam = optimizer.optimizer.state
    return {
        "iteration": state.iteration,
        "consumed": state.consumed_samples,
        "weights": {k: v.detach().clone() for k, v in model.named_parameters()},
        "adam": [
            {k: v.clone() for k, v in adam[p].items()} for p in optimizer.optimizer.param_groups[0]["params"]
        ],
        "scheduler": scheduler.num_steps,
        "rng": rng_state(),
    }


def _assert_same(a: dict, b: dict) -> None:
    assert (a["iteration"], a["consumed"], a["scheduler"]) == (b["iteration"], b["consumed"], b["scheduler"])
    assert a["weights"].keys() == b["weights"].keys()
    for k in a["weights"]:
        assert torch.equal(a["weights"][k], b["weights"][k]), k
    assert len(a["adam"]) == len(b["adam"]) > 0
    for x, y in zip(a["adam"], b["adam"]):
        assert x.keys() == y.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for k in x:
            assert torch.equal(x[k], y[k]), k
    ra, rb = a["rng"], b["rng"]
    assert ra["random"] == rb["random"] and torch.equal(ra["torch"], rb["torch"])
    assert np.array_equal(ra["numpy"][1], rb["numpy"][1]) and ra["numpy"][2:] == rb["numpy"][2:]
    assert ra["tracker"].keys() == rb["tracker"].keys()
    assert all(torch.equal(ra["tracker"][k], rb["tracker"][k]) for k in ra["tracker"])


def _same_state_body(rank, world, tmp):
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training import checkpointing
    from vepo_mcore.training.forward import forward_step
    from vepo_mcore.training.sampler import micro_batches
    from vepo_mcore.training.trainer import train_step

    cfg = _cfg()
    init_model_parallel(cfg.parallel, seed=5)
    model, optimizer, scheduler = _build(cfg)
    data = micro_batches(_data(), 0, 2, 0, 1)
    for _ in range(2):
        train_step(forward_step, data, model, optimizer, scheduler, 1, SEQ, 2)
    kwargs = dict(consumed_samples=4, config=cfg, keep_last=2)
    checkpointing.save_checkpoint(f"{tmp}/sync", 2, model, optimizer, scheduler, **kwargs)
    rng_after_sync = checkpointing.rng_state()
    checkpointing.save_checkpoint(f"{tmp}/async", 2, model, optimizer, scheduler, async_save=True, **kwargs)
    # Saving left the RNG streams where they were: training continues as from a resume.
    assert checkpointing.rng_state()["random"] == rng_after_sync["random"]
    assert torch.equal(checkpointing.rng_state()["torch"], rng_after_sync["torch"])
    # In flight: nothing visible yet.
    assert checkpointing.async_saves_in_flight() == 1
    assert read_latest(f"{tmp}/async") is None and not Path(f"{tmp}/async/iter_0000002").exists()
    # Training goes on while the writer writes: the checkpoint must hold the state at the save.
    for _ in range(2):
        train_step(forward_step, data, model, optimizer, scheduler, 1, SEQ, 2)
    while not checkpointing.finalize_async_saves(blocking=False):
        time.sleep(0.2)  # finalised by a poll once the writer has finished, as the loop does
    assert checkpointing.async_saves_in_flight() == 0
    assert read_latest(f"{tmp}/async") == 2 and not Path(f"{tmp}/async/iter_0000002.tmp").exists()
    final = Path(f"{tmp}/async/iter_0000002")
    assert not list(final.glob(".shards-*"))  # the writer's hash record is folded into integrity.json
    recorded = json.loads((final / INTEGRITY_FILE).read_text())["files"]
    on_disk = {
        str(f.relative_to(final)) for f in final.rglob("*") if f.is_file() and f.name != INTEGRITY_FILE
    }
    assert set(recorded) == on_disk and any(name.endswith(".distcp") for name in recorded)
    # The shard files are byte for byte those of the synchronous save (same plan, same writer).
    sync_recorded = json.loads(Path(f"{tmp}/sync/iter_0000002/{INTEGRITY_FILE}").read_text())["files"]
    shards = sorted(n for n in recorded if n.endswith(".distcp"))
    assert [recorded[n]["sha256"] for n in shards] == [sync_recorded[n]["sha256"] for n in shards]
    _assert_same(_loaded(f"{tmp}/sync"), _loaded(f"{tmp}/async"))
    # A second async save into the folder first finalises nothing (none in flight) and then retains 2.
    for it in (4, 6):
        checkpointing.save_checkpoint(
            f"{tmp}/async", it, model, optimizer, scheduler, async_save=True, **kwargs
        )
    assert checkpointing.async_saves_in_flight() == 1 and read_latest(f"{tmp}/async") == 4
    checkpointing.close_async_saves()
    assert read_latest(f"{tmp}/async") == 6
    assert sorted(p.name for p in Path(f"{tmp}/async").glob("iter_*")) == ["iter_0000004", "iter_0000006"]


def test_async_save_holds_the_same_state_as_sync(tmp_path):
    run_processes(_same_state_body, 1, args=(str(tmp_path),))


# -- a trainer killed while its checkpoint is written in the background --------------------------


def _train(save: str, async_save: bool, out: str) -> None:
    from vepo_mcore.training.trainer import pretrain

    history = pretrain(_cfg(save, async_save=async_save), _data())
    with open(out, "w") as f:
        json.dump(history, f)


def _reference_body(rank, world, tmp):
    _train(f"{tmp}/sync", False, f"{tmp}/sync.json")


def _killed_body(rank, world, tmp):
    """Async run whose background writer of iteration 4 SIGKILLs the trainer before writing a byte."""
    import signal

    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync

    trainer = os.getpid()
    write = FileSystemWriterAsync.write_preloaded_data_multiproc

    def kill_trainer_then_write(*args):
        buckets = args[3]
        if os.getpid() != trainer and "iter_0000004.tmp" in str(buckets[0][0]):
            Path(f"{tmp}/writer.pid").write_text(str(os.getpid()))
            os.kill(trainer, signal.SIGKILL)
            time.sleep(20)  # the writer dies with the trainer (PR_SET_PDEATHSIG) long before this ends
        write(*args)

    FileSystemWriterAsync.write_preloaded_data_multiproc = staticmethod(kill_trainer_then_write)
    _train(f"{tmp}/async", True, f"{tmp}/killed.json")


def _resume_body(rank, world, tmp):
    from vepo_mcore.training import checkpointing

    _train(f"{tmp}/async", True, f"{tmp}/resumed.json")
    # run_training finalised the last save before returning.
    assert checkpointing.async_saves_in_flight() == 0
    assert read_latest(f"{tmp}/async") == 6 and Path(f"{tmp}/async/iter_0000006/metadata.json").is_file()
    assert not list(Path(f"{tmp}/async").glob("iter_*.tmp"))
    _assert_same(_loaded(f"{tmp}/sync"), _loaded(f"{tmp}/async"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").is_file() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_kill_during_async_save_keeps_previous_checkpoint_and_resume_matches_sync(tmp_path):
    tmp = str(tmp_path)
    run_processes(_reference_body, 1, args=(tmp,))
    with pytest.raises(RuntimeError, match="distributed worker failed"):
        run_processes(_killed_body, 1, args=(tmp,))
    # The writer of iteration 4 was running when the trainer died, and died with it.
    writer = int(Path(f"{tmp}/writer.pid").read_text())
    deadline = time.time() + 30
    while _alive(writer) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(writer), "the background writer outlived the killed trainer"
    save = Path(f"{tmp}/async")
    assert read_latest(save) == 2  # iteration 4 was never finalised
    assert not (save / "iter_0000004").exists() and not list((save / "iter_0000004.tmp").glob("*.distcp"))

    run_processes(_resume_body, 1, args=(tmp,))
    sync, resumed = (json.loads(Path(f"{tmp}/{n}.json").read_text()) for n in ("sync", "resumed"))
    assert [r["step"] for r in resumed] == [3, 4, 5, 6]
    assert resumed == sync[2:]  # every metric of the resumed async run equals the uninterrupted sync run
    assert sync[0]["train/loss"] != sync[-1]["train/loss"]
