"""How long the training loop blocks per checkpoint: asynchronous vs synchronous saves, same model.

    .venv/bin/python benchmarks/async_save.py [--layers 4] [--hidden 384] [--vocab 16000] [--saves 3]
                                              [--steps-between 4] [--repeats 2] [--nproc 1]

Builds a GPTModel with megatron's optimizer (gloo processes on CPU; run_processes hides GPUs),
then alternates phases (sync, async, sync, async, ... --repeats times each): per phase, --saves
rounds of --steps-between training steps followed by save_checkpoint into the phase's folder, as
training/runner.py's loop does. Blocked time per save = the time save_checkpoint takes, plus, with
async_save, the time the loop spends in finalize_async_saves polled after each step (the last
save's finalisation at the end of the phase, reported apart: once per run). One warm-up save of
each kind comes first (the first save starts megatron's result-queue manager process). Also prints
the step time inside each phase: a background writer shares the CPU with training.
Ends with {"bench": "async_save", "ratio": blocked_async / blocked_sync, "goal": 0.2, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _body(rank: int, world: int, args, out: str) -> None:
    import torch.distributed as dist

    from vepo_mcore.config import JobConfig
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training import checkpointing
    from vepo_mcore.training.forward import forward_step
    from vepo_mcore.training.optimizer import build_optimizer, build_scheduler, wrap_model
    from vepo_mcore.training.sampler import micro_batches
    from vepo_mcore.training.synthetic import SyntheticTokens
    from vepo_mcore.training.trainer import train_step

    torch.set_num_threads(args.threads)
    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = args.layers, args.hidden, args.hidden * 3
    m.num_attention_heads, m.num_query_groups, m.vocab_size = 8, 2, args.vocab
    t = cfg.training
    t.micro_batch_size, t.global_batch_size, t.seq_length = 2, 2 * world, args.seq
    init_model_parallel(cfg.parallel, seed=1)
    model = wrap_model(build_model(cfg), cfg)
    optimizer = build_optimizer(model, cfg)
    scheduler = build_scheduler(optimizer, cfg)
    data = micro_batches(SyntheticTokens(1 << 16, args.seq, args.vocab), 0, 2, rank, world)
    params = sum(p.numel() for p in model.parameters())

    def step() -> float:
        start = time.perf_counter()
        train_step(forward_step, data, model, optimizer, scheduler, 1, args.seq, 2)
        return time.perf_counter() - start

    iteration = 0

    def phase(folder: str, async_save: bool, saves: int) -> dict[str, float]:
        nonlocal iteration
        in_save, in_finalize, steps = 0.0, 0.0, []
        for _ in range(saves):
            for _ in range(args.steps_between):
                steps.append(step())
                start = time.perf_counter()
                checkpointing.finalize_async_saves(blocking=False)
                in_finalize += time.perf_counter() - start
            iteration += 1
            start = time.perf_counter()
            checkpointing.save_checkpoint(folder, iteration, model, optimizer, scheduler, config=cfg,
                                          keep_last=2, async_save=async_save)  # fmt: skip
            in_save += time.perf_counter() - start
        start = time.perf_counter()
        checkpointing.finalize_async_saves()  # the phase's last save, as at the end of a run
        end_wait = time.perf_counter() - start
        return {
            "blocked_per_save": (in_save + in_finalize) / saves,
            "in_save_per_save": in_save / saves,  # async: staging, plus waiting for the previous save
            "in_finalize_per_save": in_finalize / saves,  # async: the polls after each step
            "end_wait": end_wait,  # async: the run's last save, waited for at its end (once per run)
            "step_s": sum(steps) / len(steps),
        }

    phase(f"{args.workdir}/warmup_sync", False, 1)
    phase(f"{args.workdir}/warmup_async", True, 1)
    rows = []
    for repeat in range(args.repeats):
        for label, async_save in (("sync", False), ("async", True)):
            row = phase(f"{args.workdir}/{label}", async_save, args.saves)
            rows.append({"mode": label, "repeat": repeat, **row})
            if rank == 0:
                print(f"{label:5s} repeat {repeat}: blocked {row['blocked_per_save']:.3f} s/save "
                      f"(in save_checkpoint {row['in_save_per_save']:.3f}, finalising "
                      f"{row['in_finalize_per_save']:.3f}), end of phase {row['end_wait']:.3f} s once, step {row['step_s']:.3f} s",
                      flush=True)  # fmt: skip
    checkpointing.close_async_saves()
    size = sum(f.stat().st_size for f in Path(f"{args.workdir}/sync").rglob("*.distcp"))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {"rows": rows, "params": params, "shard_bytes": size, "world": dist.get_world_size()}, f
            )


def _mean(rows: list[dict], mode: str, key: str) -> float:
    values = [r[key] for r in rows if r["mode"] == mode]
    return sum(values) / len(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--saves", type=int, default=3, help="saves per phase")
    parser.add_argument("--steps-between", type=int, default=4, help="training steps before each save")
    parser.add_argument("--repeats", type=int, default=2, help="sync/async phase pairs")
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel gloo processes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", default=None, help="checkpoint folder (default: a temporary one)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from vepo_mcore.parallel.launch import run_processes

    with tempfile.TemporaryDirectory(prefix="async_save_") as tmp:
        args.workdir = args.workdir or tmp
        out = os.path.join(tmp, "result.json")
        run_processes(_body, args.nproc, args=(args, out))
        result = json.loads(Path(out).read_text())
    rows = result["rows"]
    sync, asyn = _mean(rows, "sync", "blocked_per_save"), _mean(rows, "async", "blocked_per_save")
    step_sync, step_async = _mean(rows, "sync", "step_s"), _mean(rows, "async", "step_s")
    print(f"model {result['params'] / 1e6:.1f}M parameters, {result['shard_bytes'] / 2**20:.0f} MiB of shards "
          f"per checkpoint (weights + Adam), {result['world']} rank(s), load {os.getloadavg()[0]:.1f}")  # fmt: skip
    staging, finalising = (
        _mean(rows, "async", "in_save_per_save"),
        _mean(rows, "async", "in_finalize_per_save"),
    )
    end_wait = _mean(rows, "async", "end_wait")
    print(f"blocked per save: sync {sync:.3f} s, async {asyn:.3f} s (in save_checkpoint {staging:.3f}, "
          f"polls/finalising {finalising:.3f}) -> ratio {asyn / sync:.3f}")  # fmt: skip
    print(f"async, once per run: the last save's wait at the end {end_wait:.3f} s (sync saves: none)")
    print(f"step time in the phase: sync {step_sync:.3f} s, async {step_async:.3f} s "
          f"({step_async / step_sync:.2f}x: the background writer shares the CPU)")  # fmt: skip
    print(json.dumps({
        "bench": "async_save", "ratio": round(asyn / sync, 4), "goal": 0.2, "higher_is_better": False,
        "blocked_sync_s": round(sync, 4), "blocked_async_s": round(asyn, 4),
        "async_staging_s": round(staging, 4), "async_polls_s": round(finalising, 4),
        "async_end_wait_s": round(end_wait, 4),
        "step_slowdown": round(step_async / step_sync, 3), "params": result["params"],
        "shard_bytes": result["shard_bytes"], "world": result["world"],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
