"""The one CPU shim that lets megatron.core run without CUDA (tests, CI, the CPU quickstart).

megatron.core assumes CUDA in a handful of places: `torch.cuda.current_device()` as a
device, the CUDA RNG tracker, streams/events, and `device="cuda"` in tensor factories.
`install_cpu_shim()` patches exactly those, per process, and only when no GPU is present;
on a CUDA machine it does nothing. Known to be enough for megatron-core 0.16.1 on torch 2.13
CPU: GPTModel (local spec) forward/backward with TP/PP on gloo, the optimizers,
dist_checkpointing, and vocab_parallel_cross_entropy.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings

import torch

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock; and the shim patches torch before megatron's modules are imported and patched).

_INSTALLED = False


def has_cuda() -> bool:
    return torch.cuda.is_available()


def device() -> torch.device:
    """The device this process computes on: its CUDA device when available, else CPU."""
    if has_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _CudaToCpu(torch.overrides.TorchFunctionMode):
    """Rewrites device='cuda' in tensor factories (megatron creates buffers on 'cuda')."""

    _FACTORIES = {
        torch.empty,
        torch.zeros,
        torch.ones,
        torch.full,
        torch.tensor,
        torch.arange,
        torch.rand,
        torch.randn,
        torch.randint,
        torch.empty_like,
        torch.zeros_like,
        torch.ones_like,
        torch.full_like,
        torch.as_tensor,
        torch.linspace,
        torch.eye,
    }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and _is_cuda(dev):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to or func is torch.Tensor.cuda:
            args, kwargs = _strip_cuda_args(func, args, kwargs)
        return func(*args, **kwargs)


def _is_cuda(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, int):
        return True  # an integer device index means a CUDA ordinal
    return isinstance(dev, str) and dev.startswith("cuda")


def _strip_cuda_args(func, args, kwargs):
    if func is torch.Tensor.cuda:
        return (args[0],), {}
    args = tuple(
        "cpu" if (i > 0 and _is_cuda(a) and not isinstance(a, bool)) else a for i, a in enumerate(args)
    )
    return args, kwargs


def install_cpu_shim() -> bool:
    """Patch torch.cuda / megatron's CUDA-only calls to CPU equivalents. No-op with CUDA.

    Returns True when the shim is (already) installed.
    """
    global _INSTALLED
    if has_cuda():
        return False
    if _INSTALLED:
        return True
    # Expected on CPU: megatron falls back to torch norms/optimizers without TE or apex.
    warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*not installed.*")
    warnings.filterwarnings("ignore", message=".*full scope is deprecated.*")
    cpu_generator_state = torch.get_rng_state

    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.device_count = lambda: 0
    torch.cuda.get_rng_state = lambda device=None: cpu_generator_state()
    torch.cuda.set_rng_state = lambda state, device=None: None
    torch.cuda.manual_seed = lambda seed: None
    torch.cuda.manual_seed_all = lambda seed: None
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.current_stream = lambda device=None: _NullStream()
    torch.cuda.default_stream = lambda device=None: _NullStream()
    torch.cuda.Stream = _NullStream
    torch.cuda.Event = _NullEvent
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.max_memory_allocated = lambda device=None: 0
    torch.cuda.memory_allocated = lambda device=None: 0
    torch.Tensor.cuda = lambda self, *args, **kwargs: self

    from megatron.core.tensor_parallel import random as mp_random

    mp_random._get_cuda_rng_state = lambda *args, **kwargs: cpu_generator_state()
    mp_random._set_cuda_rng_state = lambda *args, **kwargs: None
    # Here the "CUDA" generator the tracker forks *is* the CPU one, so dropout inside fork() (every
    # forward with model.hidden_dropout > 0) always advances it, and megatron warns once per layer
    # and step that the CPU state changed: true by construction, so not logged.
    logging.getLogger(mp_random.__name__).addFilter(
        lambda record: "CPU RNG state changed within GPU RNG context" not in record.getMessage()
    )

    # The default causal mask is built with a literal device="cuda"; fused_softmax imported it by name.
    from megatron.core.fusions import fused_softmax
    from megatron.core.transformer import utils as transformer_utils

    @functools.lru_cache(maxsize=32)
    def causal_mask_on_cpu(sq: int) -> torch.Tensor:
        return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)

    transformer_utils.get_default_causal_mask = causal_mask_on_cpu
    fused_softmax.get_default_causal_mask = causal_mask_on_cpu

    # clip_grad_by_total_norm_fp32 asserts grads are torch.cuda.FloatTensor; same math on CPU.
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mcore_optimizer

    def clip_grad_by_total_norm_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
        clip_coeff = max_norm / (total_norm + 1.0e-6)
        if clip_coeff >= 1.0:
            return
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        for param in parameters if not isinstance(parameters, torch.Tensor) else [parameters]:
            grad = getattr(param, attr, None)
            if grad is not None:
                grad.detach().mul_(clip_coeff)

    clip_grads.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_cpu
    mcore_optimizer.clip_grad_by_total_norm_fp32 = clip_grad_by_total_norm_cpu

    # megatron allocates bookkeeping tensors with a literal device="cuda" (pipeline schedules,
    # optimizers, loss scalers). A process-wide torch-function mode maps them to CPU; it costs
    # ~8% of a tiny model's step time, nothing on GPU where the shim is never installed.
    _CudaToCpu().__enter__()
    _INSTALLED = True
    return True


@contextlib.contextmanager
def without_shim_mode():
    """Suspend the CPU shim's torch-function mode around a hot loop of plain CPU tensor ops.

    The mode rewrites device="cuda" in megatron's tensor factories and costs a Python call per torch
    call. Code that allocates nothing on "cuda" by name and calls torch many times per step (the
    embedded engine's decode, the CPU output layer's vocabulary blocks) runs without it. Where the
    shim is not installed (CUDA), nothing changes."""
    if not _INSTALLED:
        yield
        return
    with torch._C.DisableTorchFunction():
        yield


class _NullStream:
    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass

    def record_event(self, event=None):
        return _NullEvent()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _NullEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0
