"""Run a function in N local processes on one gloo/NCCL group (multi-process tests, CPU tools).

    def body(rank, world_size, x): ...
    run_processes(body, world_size=2, args=(x,))

Each worker joins a fresh process group on 127.0.0.1 with a free port and tears it down at
the end; an exception in any worker fails the call with that worker's traceback.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from vepo_mcore.parallel.init import destroy, free_port, init_distributed


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, errors) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    # One thread per process: the workers share a small machine and gloo tests stay fast.
    import torch

    torch.set_num_threads(1)
    try:
        init_distributed("gloo", rank=rank, world_size=world_size)
        fn(rank, world_size, *args)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        destroy()


def run_processes(fn: Callable[..., Any], world_size: int, args: tuple = ()) -> None:
    """Spawn `world_size` processes running `fn(rank, world_size, *args)` on a gloo group."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = free_port()
    try:
        mp.start_processes(
            _worker,
            args=(world_size, port, fn, args, errors),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
    except Exception as exc:
        details = []
        while not errors.empty():
            rank, tb = errors.get()
            details.append(f"--- rank {rank} ---\n{tb}")
        raise RuntimeError("distributed worker failed:\n" + "\n".join(details)) from exc
