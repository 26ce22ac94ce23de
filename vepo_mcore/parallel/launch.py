"""Run a function in N local processes on one gloo/NCCL group (multi-process tests, CPU tools).

    def body(rank, world_size, x): ...
    run_processes(body, world_size=2, args=(x,))

Each worker joins a fresh process group on 127.0.0.1 with a free port and tears it down at
the end; an exception in any worker fails the call with that worker's traceback. The workers are
CPU processes on gloo: on a CUDA host they start with CUDA_VISIBLE_DEVICES="" so that N of them do
not all build their models on GPU 0 (the GPU paths have their own tests, tests/gpu).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.multiprocessing as mp

from vepo_mcore.parallel.init import destroy, free_port, init_distributed


def _worker(rank: int, world_size: int, port: int, fn: Callable, args: tuple, errors) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    # One thread per process: the workers share a small machine and gloo tests stay fast.
    torch.set_num_threads(1)
    try:
        init_distributed("gloo", rank=rank, world_size=world_size)
        fn(rank, world_size, *args)
    except BaseException:
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        destroy()


@contextlib.contextmanager
def hidden_gpus() -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES="" for processes spawned inside the block (children read the parent's
    environment when they start; CUDA reads the variable once, at its first use), restored after."""
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


def run_processes(fn: Callable[..., Any], world_size: int, args: tuple = ()) -> None:
    """Spawn `world_size` CPU processes running `fn(rank, world_size, *args)` on a gloo group."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    port = free_port()
    try:
        with hidden_gpus():
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
