"""Model wrapping, optimizer and LR schedule: megatron.core DDP, get_megatron_optimizer, OptimizerParamScheduler.

    model = wrap_model(build_model(cfg), cfg)        # DDP with a contiguous grad buffer
    optimizer = build_optimizer(model, cfg)         # Adam(W), clipping, optional ZeRO-1
    scheduler = build_scheduler(optimizer, cfg)     # linear warmup then cosine/linear/constant

Loss normalisation: the model config gets `calculate_per_token_loss=True`, so DDP sums (not
averages) gradients over DP ranks and megatron's finalize_model_grads divides them by the
token count of the whole global batch. A loss_func returning (loss_sum, num_tokens, ...) then
gives the exact token average whatever the micro-batch split and DP size.
"""

from __future__ import annotations

import contextlib

import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.models.fusions import gpu_fusions, log_fusions_off, machine
from vepo_mcore.parallel.device import has_cuda

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).


def wrap_model(model: torch.nn.Module, cfg: JobConfig):
    """Wrap this rank's GPTModel stage (in Float16Module under bf16) in megatron.core
    DistributedDataParallel and wire the model config for the schedules (grad finalisation,
    per-token loss scaling). Gradients are reduced while backward runs where models/fusions.py
    allows it (GPU, more than one data x context-parallel rank)."""
    from megatron.core import parallel_state
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )

    config = model.config
    dp_size = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    fusions = gpu_fusions(cfg, **machine(), dp_size=dp_size)
    log_fusions_off(fusions, "overlap_grad_reduce")
    model = half_precision(model)
    config.calculate_per_token_loss = True
    config.finalize_model_grads_func = finalize_model_grads
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=fusions.settings["overlap_grad_reduce"],  # GPU, DP > 1: models/fusions.py
        use_distributed_optimizer=cfg.training.optimizer.use_distributed_optimizer,
        # Grads are summed over DP here and divided by the global token count in finalize_model_grads.
        average_in_collective=False,
    )
    wrapped = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    config.no_sync_func = wrapped.no_sync
    return wrapped


def half_precision(model: torch.nn.Module) -> torch.nn.Module:
    """`model` in Megatron-LM's mixed-precision wrapper under bf16/fp16 (every parameter in half
    precision, where the local spec's norms would stay fp32; fp32 out of the last stage), else as is."""
    from megatron.core.transformer.module import Float16Module

    if model.config.bf16 or model.config.fp16:
        return Float16Module(model.config, model)
    return model


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside DDP (checkpoints use its parameter names, without a 'module.' prefix)."""
    while hasattr(model, "module"):
        model = model.module
    return model


def build_optimizer(model: torch.nn.Module, cfg: JobConfig):
    """megatron.core Adam with decoupled weight decay (none on norms and biases), global-norm clipping,
    fp32 master weights under bf16, and ZeRO-1 sharding when use_distributed_optimizer is set.
    Where megatron falls back to torch's AdamW (no TE or Apex: always on CPU), its fused kernel is
    switched on (see fuse_torch_adam)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    o = cfg.training.optimizer
    config = OptimizerConfig(
        optimizer="adam",
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        bf16=cfg.training.bf16,
        params_dtype=torch.bfloat16 if cfg.training.bf16 else torch.float32,
        use_distributed_optimizer=o.use_distributed_optimizer,
    )
    with _cpu_params_pass_cuda_type_checks():
        optimizer = get_megatron_optimizer(config, [model])
    fuse_torch_adam(optimizer)
    return optimizer


def torch_adams(optimizer) -> list[torch.optim.Optimizer]:
    """The torch.optim Adam/AdamW instances inside megatron's (chained) optimizer wrapper.

    On GPU megatron uses Transformer Engine's (or apex's) FusedAdam instead, which keeps its step in
    the param groups: a per-parameter 'step' entry there makes FusedAdam.state_dict() raise KeyError.
    """
    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    found = (getattr(o, "optimizer", None) for o in inner)
    return [o for o in found if isinstance(o, (torch.optim.Adam, torch.optim.AdamW))]


def fuse_torch_adam(optimizer) -> None:
    """Run every torch.optim.Adam/AdamW inside a megatron optimizer with fused=True.

    megatron.core builds torch's AdamW when neither Transformer Engine nor Apex is installed, with
    torch's default for-loop implementation, one kernel per parameter and operation: on 2 CPU cores
    ~150 ms a step for benchmarks/train_step.py's 42M parameters, against ~14 ms for torch's fused CPU/CUDA kernel
    (the same update, fp32 rounding aside). TE's and Apex's FusedAdam are left as they are. A
    checkpoint keeps its param_groups: one written before this loads unfused (the same math)."""
    for torch_opt in torch_adams(optimizer):
        params = [p for group in torch_opt.param_groups for p in group["params"]]
        if any(g.get("differentiable") for g in torch_opt.param_groups) or not all(
            p.dtype in (torch.float32, torch.float16, torch.bfloat16) and p.device.type in ("cpu", "cuda")
            for p in params
        ):
            continue
        for group in torch_opt.param_groups:
            group["fused"], group["foreach"] = True, False
        torch_opt.defaults["fused"], torch_opt.defaults["foreach"] = True, False


def adam_step_tensor(group: dict, param: torch.Tensor, value: float) -> torch.Tensor:
    """A torch Adam per-parameter 'step' as its implementation keeps it: a float32 scalar on the
    parameter's device for the fused kernel, a CPU scalar otherwise."""
    if group.get("fused") or group.get("capturable"):
        return torch.tensor(value, dtype=torch.float32, device=param.device)
    return torch.tensor(value)


@contextlib.contextmanager
def _cpu_params_pass_cuda_type_checks():
    """On CPU, make `tensor.type()` say torch.cuda.* while megatron builds the optimizer.

    megatron.core 0.16's DistributedOptimizer and bf16 optimizer accept parameters only when
    `param.type()` is 'torch.cuda.{Float,BFloat16,Half}Tensor'; the math is device-agnostic.
    Scoped to the constructor, and a no-op with CUDA.
    """
    if has_cuda():
        yield
        return
    original = torch.Tensor.type

    def cuda_type(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and self.device.type == "cpu":
            name = original(self)  # may already pass through this patch via a torch-function mode
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = cuda_type
    try:
        yield
    finally:
        torch.Tensor.type = original


def build_scheduler(optimizer, cfg: JobConfig):
    """Linear warmup 0 -> lr over warmup_iters, then decay to min_lr over decay_iters (default train_iters)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    t, s = cfg.training, cfg.training.scheduler
    decay_iters = s.decay_iters if s.decay_iters is not None else t.train_iters
    decay_iters = max(decay_iters, s.warmup_iters + 1)  # megatron requires warmup < decay
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=t.optimizer.lr,
        min_lr=t.optimizer.min_lr,
        lr_warmup_steps=s.warmup_iters,
        lr_decay_steps=decay_iters,
        lr_decay_style=s.decay_style,
        start_wd=t.optimizer.weight_decay,
        end_wd=t.optimizer.weight_decay,
        wd_incr_steps=decay_iters,
        wd_incr_style="constant",
        # Resume restores the schedule from the checkpoint; the config must agree with it.
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
    )
