"""Which of the GPU fusions Megatron-LM turns on this run gets, each on where its dependency is present:

    fusions = gpu_fusions(cfg, **machine(), dp_size=8)
    fusions.settings   # {"gradient_accumulation_fusion": True, "overlap_grad_reduce": True, "apply_rope_fusion": True}
    fusions.off        # {name: why} for each one that is off
    log_fusions_off(fusions, "overlap_grad_reduce")    # one line on rank 0 per fusion off, once

The dependencies, as megatron-core 0.16.1 has them:

- gradient_accumulation_fusion: Transformer Engine's linears accumulate the weight gradient into
  main_grad themselves; megatron's ColumnParallelLinear / RowParallelLinear need apex's
  fused_weight_gradient_mlp_cuda (ColumnParallelLinear refuses to be built without it). Under the TE
  spec the only megatron linear is the output layer, which `build_with_fusions` keeps unfused without apex.
  The fused GEMMs write `param.main_grad`, which megatron DDP (training/optimizer.py) provides.
- overlap_grad_reduce: no kernel; something to overlap (more than one rank in DDP's data x context
  parallel group), and every parameter's backward hook firing with `param.grad` set (DDP asserts it):
  a weight tied to the embedding at PP = 1 gets its gradient from both users straight into main_grad
  and none through autograd (models/main_grad.py), so its hook never fires.
- apply_rope_fusion: TE's fused RoPE (megatron's TransformerConfig refuses it below TE 1.4; its
  packed-sequence kernel under context parallelism needs TE 1.12).

Nothing is fused on CPU: the unfused paths compute the same thing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import torch
import torch.distributed as dist

from vepo_mcore.config.job import JobConfig
from vepo_mcore.parallel.device import has_cuda

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).

ROPE_MIN_TE = (1, 4)
"""megatron's TransformerConfig: 'apply_rope_fusion is not available. Please install TE >= 1.4.'"""
ROPE_CP_MIN_TE = (1, 12)
"""megatron's fused_apply_rotary_pos_emb_thd: 'Only TE >= 1.12 supports RoPE fusion for THD format with CP.'"""
SWITCHES = {
    "gradient_accumulation_fusion": "training.fusions.gradient_accumulation",
    "overlap_grad_reduce": "training.fusions.overlap_grad_reduce",
    "apply_rope_fusion": "training.fusions.rope",
}
"""megatron's name of each fusion -> the config field that forces it off."""

_LOGGED: set[tuple[str, str]] = set()
M = TypeVar("M", bound=torch.nn.Module)


class Fusions(NamedTuple):
    """What `gpu_fusions` decided."""

    settings: dict[str, bool]
    """megatron's name of each fusion -> on."""
    off: dict[str, str]
    """megatron's name -> why it is off, for each one that is."""


def _version(text: str) -> tuple[int, ...]:
    """'2.11.0+cu13' -> (2, 11, 0)."""
    match = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(part) for part in match.group().split(".")) if match else (0,)


def gpu_fusions(
    cfg: JobConfig, *, cuda: bool, te_version: str | None, apex_grad_fusion: bool, dp_size: int
) -> Fusions:
    """The fusions `cfg` gets on a machine with (`cuda`, Transformer Engine `te_version` or None,
    apex's fused_weight_gradient_mlp_cuda importable: `apex_grad_fusion`) and `dp_size` ranks in
    DDP's gradient-reduction group (data x context parallel). Pure: `machine()` probes the machine."""
    switches = cfg.training.fusions
    te_spec = cuda and te_version is not None and cfg.model.transformer_impl != "local"
    off: dict[str, str] = {}

    if not switches.gradient_accumulation:
        off["gradient_accumulation_fusion"] = f"{SWITCHES['gradient_accumulation_fusion']} is false"
    elif not cuda:
        off["gradient_accumulation_fusion"] = "no CUDA"
    elif not te_spec and not apex_grad_fusion:
        spec = (
            "the local layer spec" if te_version is not None else "without Transformer Engine, the local spec"
        )
        off["gradient_accumulation_fusion"] = (
            f"{spec} uses megatron's linears, which need apex's fused_weight_gradient_mlp_cuda (not installed)"
        )

    p = cfg.parallel
    if not switches.overlap_grad_reduce:
        off["overlap_grad_reduce"] = f"{SWITCHES['overlap_grad_reduce']} is false"
    elif not cuda:
        off["overlap_grad_reduce"] = "no CUDA"
    elif dp_size <= 1:
        off["overlap_grad_reduce"] = "one data-parallel rank: no gradient reduction to overlap"
    elif cfg.model.tie_word_embeddings and p.pipeline_model_parallel_size == 1:
        off["overlap_grad_reduce"] = (
            "model.tie_word_embeddings at PP = 1: the tied weight's gradient can reach main_grad "
            "without autograd (models/main_grad.py), and overlapped reduction needs DDP's hook to see it"
        )

    if not switches.rope:
        off["apply_rope_fusion"] = f"{SWITCHES['apply_rope_fusion']} is false"
    elif not cuda:
        off["apply_rope_fusion"] = "no CUDA"
    elif te_version is None:
        off["apply_rope_fusion"] = "Transformer Engine is not installed (the fused RoPE is its kernel)"
    elif _version(te_version) < ROPE_MIN_TE:
        off["apply_rope_fusion"] = f"Transformer Engine {te_version} < 1.4"
    elif p.context_parallel_size > 1 and _version(te_version) < ROPE_CP_MIN_TE:
        off["apply_rope_fusion"] = f"Transformer Engine {te_version} < 1.12 under context parallelism"

    return Fusions({name: name not in off for name in SWITCHES}, off)


def machine() -> dict:
    """This process's `cuda`, `te_version` and `apex_grad_fusion` for gpu_fusions (no import of TE)."""
    te_version = None
    if importlib.util.find_spec("transformer_engine") is not None:
        for dist_name in ("transformer_engine", "transformer-engine"):
            try:
                te_version = importlib.metadata.version(dist_name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return {
        "cuda": has_cuda(),
        "te_version": te_version,
        "apex_grad_fusion": importlib.util.find_spec("fused_weight_gradient_mlp_cuda") is not None,
    }


def log_fusions_off(fusions: Fusions, *names: str) -> None:
    """One stderr line on rank 0 for each of `names` that is off on a GPU, each line once a process."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    for name in names:
        why = fusions.off.get(name)
        if why is None or why == "no CUDA" or (name, why) in _LOGGED:
            continue
        _LOGGED.add((name, why))
        print(f"fusion off: {name} ({why})", file=sys.stderr, flush=True)


def build_with_fusions(config, build: Callable[[], M], apex_grad_fusion: bool) -> M:
    """`build()`, where `config.gradient_accumulation_fusion` is on without apex: megatron's own
    linears (under the TE spec, the output layer) are built past ColumnParallelLinear's apex check and
    then run unfused, their weight gradient reaching main_grad through DDP's hook (or through
    models/output_loss.py's own accumulation); Transformer Engine's linears fuse it themselves."""
    from megatron.core.tensor_parallel import layers

    if not config.gradient_accumulation_fusion or apex_grad_fusion:
        return build()
    available, layers._grad_accum_fusion_available = layers._grad_accum_fusion_available, True
    try:
        model = build()
    finally:
        layers._grad_accum_fusion_available = available
    for module in model.modules():
        if isinstance(module, (layers.ColumnParallelLinear, layers.RowParallelLinear)):
            module.gradient_accumulation_fusion = False
    return model
