"""Distributed init (NCCL/gloo), the CPU shim for megatron.core, and a local process launcher."""

from vepo_mcore.parallel.device import device, has_cuda, install_cpu_shim
from vepo_mcore.parallel.init import destroy, distributed, free_port, init_distributed, init_model_parallel

__all__ = [
    "destroy",
    "device",
    "distributed",
    "free_port",
    "has_cuda",
    "init_distributed",
    "init_model_parallel",
    "install_cpu_shim",
]
