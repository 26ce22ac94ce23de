"""Process-group and model-parallel initialisation: NCCL on GPU, gloo on CPU.

rank, world = init_distributed()               # torchrun env vars, or a 1-process group
init_model_parallel(cfg.parallel, seed=1234)   # megatron.core parallel_state + RNG tracker
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import warnings
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from vepo_mcore.config.parallel import ParallelConfig
from vepo_mcore.parallel.device import has_cuda, install_cpu_shim

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for single-node tests and the CPU quickstart)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(
    backend: str = "auto",
    rank: int | None = None,
    world_size: int | None = None,
    timeout_minutes: int = 30,
    in_memory: bool = False,
) -> tuple[int, int]:
    """Join (or create) the default process group and return (rank, world_size).

    Rank and world size come from the arguments, else torchrun's RANK/WORLD_SIZE, else a
    single process. On CPU the megatron CPU shim is installed first. `in_memory`: a 1-process
    group rendezvouses through an in-memory store even when MASTER_PORT is set.
    """
    if not has_cuda():
        install_cpu_shim()
    # megatron's torch_dist checkpoints still use torch's ShardedTensor/load_state_dict APIs.
    warnings.filterwarnings(
        "ignore", category=FutureWarning, message=".*(DTensor instead|load_state_dict.*deprecated).*"
    )
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # One process launched without torchrun rendezvouses with itself: an in-memory store, no port to
    # pick (a port picked free can be taken by another process before the store binds it).
    local = world_size == 1 and (in_memory or "MASTER_PORT" not in os.environ)
    store = dist.HashStore() if local else None
    if store is None:
        os.environ.setdefault("MASTER_PORT", "29500")
    if backend == "auto":
        backend = "nccl" if has_cuda() else "gloo"
    if backend == "nccl":
        if not has_cuda():
            raise ValueError("parallel.backend is 'nccl' but CUDA is not available; use 'gloo' or 'auto'")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(minutes=timeout_minutes),
        store=store,
    )
    return rank, world_size


def init_model_parallel(pcfg: ParallelConfig, seed: int = 1234) -> None:
    """Create megatron.core's TP/PP/CP/DP groups and seed every RNG a checkpoint saves: python's
    `random`, numpy's global state, torch (CPU and CUDA) and megatron's RNG tracker.

    Unseeded, python and numpy start from OS entropy in every process, and so does torch's CPU
    generator, which the tracker snapshots on CPU (the shim makes torch.cuda.manual_seed a no-op):
    then no two runs, and no run and its resumed copy, end in the same RNG states. Every rank gets
    the same seed, as a checkpoint hands one RNG state per model-parallel rank to all its DP replicas.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        init_distributed(pcfg.backend, timeout_minutes=pcfg.distributed_timeout_minutes)
    pcfg.validate(dist.get_world_size())
    if not has_cuda() and (pcfg.context_parallel_size > 1 or pcfg.sequence_parallel):
        raise ValueError("parallel.context_parallel_size > 1 and parallel.sequence_parallel need CUDA")
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=pcfg.tensor_model_parallel_size,
        pipeline_model_parallel_size=pcfg.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=pcfg.virtual_pipeline_model_parallel_size,
        context_parallel_size=pcfg.context_parallel_size,
        distributed_timeout_minutes=pcfg.distributed_timeout_minutes,
    )
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # first: on CPU the tracker snapshots this generator for each of its streams
    model_parallel_cuda_manual_seed(seed)


@contextlib.contextmanager
def distributed(parallel: ParallelConfig) -> Iterator[tuple[int, int]]:
    """An entry script's process group: joined from torchrun's environment with parallel.backend and
    its timeout, torn down on the way out whatever raised. Yields (rank, world_size)."""
    ranks = init_distributed(parallel.backend, timeout_minutes=parallel.distributed_timeout_minutes)
    try:
        yield ranks
    finally:
        destroy()


def destroy() -> None:
    """Tear down megatron groups and the default process group (tests call this between runs)."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
