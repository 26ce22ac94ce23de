"""Shared by the tests/gpu modules (skipped without CUDA: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def nccl():
    """One process's NCCL group and megatron's model parallel state (TP = PP = 1), for the module."""
    from vepo_mcore.config import ParallelConfig
    from vepo_mcore.parallel import destroy, init_distributed, init_model_parallel

    init_distributed("nccl", rank=0, world_size=1)
    init_model_parallel(ParallelConfig(), seed=3)
    yield
    destroy()
