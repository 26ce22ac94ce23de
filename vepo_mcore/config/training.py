"""Training section: batch sizes, optimizer, LR schedule, precision, checkpoints, logging."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True)
class OptimizerConfig:
    """Adam(W) through megatron.core's get_megatron_optimizer."""

    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 3e-5
    """Floor of the cosine decay."""
    weight_decay: float = 0.1
    """Decoupled weight decay (not applied to norms and biases)."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.95
    """Adam beta2."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    clip_grad: float = 1.0
    """Global gradient-norm clip; 0 disables."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state across data-parallel ranks (ZeRO-1)."""


@dataclass(kw_only=True)
class SchedulerConfig:
    """Linear warmup then decay to min_lr."""

    warmup_iters: int = 0
    """Steps of linear warmup from 0 to lr."""
    decay_style: Literal["cosine", "linear", "constant"] = "cosine"
    """Shape of the decay after warmup."""
    decay_iters: int | None = None
    """Steps over which to decay; None = training.train_iters."""


@dataclass(kw_only=True)
class CheckpointConfig:
    """megatron.core dist_checkpointing (torch_dist) with config and tokenizer beside it."""

    save: str | None = None
    """Directory for checkpoints (iter_0000100/ ... and a `latest` pointer)."""
    load: str | None = None
    """Checkpoint to start from (e.g. CPT for SFT, SFT for RL). A run whose `save` directory already
    holds a checkpoint resumes from `save` instead, so a relaunched fine-tune continues."""
    save_interval: int = 0
    """Save every N steps (0 = only at the end)."""
    keep_last: int = 3
    """Keep the newest K checkpoints; 0 keeps all."""
    finetune: bool = False
    """Load only model weights from `load` (no optimizer/scheduler/data position)."""
    verify_hashes: bool = False
    """Also check every checkpoint file's SHA-256 against its integrity.json when loading (reads the
    checkpoint once more, split over the ranks); file sizes are always checked."""
    async_save: bool = False
    """Write checkpoints in the background (megatron.core's async save, as Megatron-LM's --async-save):
    training waits only while the state is copied to host memory; the checkpoint becomes `latest`
    once written, at a later step, before the next save or at the end of the run. Still atomic."""
    lock_stale_minutes: float = 10.0
    """A `save` folder is locked by the run writing it (save/writer.lock, refreshed every 30 s). A lock
    left by a dead process on this host is taken over at once; one from another host when it is
    older than this many minutes."""


@dataclass(kw_only=True)
class LoggingConfig:
    """Rank-0 console, tensorboard and JSONL metrics."""

    log_interval: int = 1
    """Print and record metrics every N steps."""
    tensorboard_dir: str | None = None
    """Tensorboard event directory (None = <save>/tensorboard if save is set)."""
    metrics_jsonl: str | None = None
    """JSONL metrics file (None = <save>/metrics.jsonl if save is set)."""
    progress_bar: bool = True
    """Show a progress bar on rank 0 (stderr) with loss, tokens/s and ETA when stderr is a terminal,
    below the line each log interval prints on stdout."""
    wandb_project: str | None = None
    """Also log every metrics row to this Weights & Biases project (None = no W&B; needs the wandb
    package, which the project does not depend on)."""
    wandb_run_name: str | None = None
    """The W&B run's name (None = W&B's own)."""
    wandb_mode: Literal["online", "offline"] = "offline"
    """'offline' writes the run under <save>/wandb (or ./wandb) with no network, for `wandb sync`
    later; 'online' streams it."""


@dataclass(kw_only=True)
class FusionConfig:
    """The GPU fusions Megatron-LM turns on. Each is on where its dependency is present
    (models/fusions.py decides and prints one line for each one that is off); false forces it off.
    Never on CPU, where the unfused paths compute the same thing."""

    gradient_accumulation: bool = True
    """Weight-gradient GEMMs add straight into DDP's fp32 main_grad (megatron's
    gradient_accumulation_fusion): no weight-sized gradient tensor per linear layer, no separate add.
    Needs Transformer Engine's layers (megatron's own linears, the local spec's, need apex's
    fused_weight_gradient_mlp_cuda). A model built with it trains only inside megatron DDP
    (training/optimizer.py's wrap_model), which gives each weight its main_grad."""
    overlap_grad_reduce: bool = True
    """Reduce each bucket of gradients over the data-parallel ranks while backward still runs (megatron
    DDP's overlap_grad_reduce). Needs more than one data x context-parallel rank, and untied
    embeddings at PP = 1. It changes DDP's bucket layout, which the distributed optimizer's
    checkpoints (dp_reshardable) follow: resume with the setting the checkpoint was saved with."""
    rope: bool = True
    """Transformer Engine's fused RoPE kernel (megatron's apply_rope_fusion). Needs Transformer Engine
    >= 1.4 (>= 1.12 under context parallelism, for its packed-sequence kernel)."""


@dataclass(kw_only=True)
class TrainingConfig:
    """Global training loop settings shared by CPT, SFT and RL."""

    micro_batch_size: int = 2
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int = 8
    """Sequences per optimizer step across all DP ranks (= micro * DP * grad accumulation)."""
    seq_length: int = 128
    """Tokens per training sequence."""
    train_iters: int = 10
    """Optimizer steps."""
    eval_interval: int = 0
    """Validate every N steps (0 = never)."""
    eval_iters: int = 2
    """Validation micro-batch rounds per evaluation."""
    seed: int = 1234
    """Seed for init, data order and dropout."""
    bf16: bool = False
    """Train in bf16 with fp32 master weights: GPU runs, and CPU runs where the CPU has AMX (the toy
    recipe: ~1.5x fp32's step, benchmarks/cpu_bf16.py); without AMX a CPU runs bf16 slower."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation (megatron's recompute_granularity): 'selective' recomputes core
    attention (saves the [s, s] scores of the local spec; little with TE's flash attention, which
    stores none), 'full' keeps only each layer's input and recomputes the layer in backward
    (recompute_method uniform, one layer per checkpoint): ~1/3 more compute, a fraction of the memory."""
    fusions: FusionConfig = field(default_factory=FusionConfig)
    """GPU fusions (gradient-accumulation fusion, overlapped gradient reduction, fused RoPE)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer settings."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """LR schedule."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Logging."""

    def validate(self, data_parallel: int | None = None) -> None:
        for name in ("micro_batch_size", "global_batch_size", "seq_length"):
            if getattr(self, name) <= 0:
                raise ValueError(f"training.{name} must be positive, got {getattr(self, name)}")
        if self.train_iters < 0:
            raise ValueError(f"training.train_iters must be >= 0, got {self.train_iters}")
        if data_parallel is not None and self.global_batch_size % (self.micro_batch_size * data_parallel):
            raise ValueError(
                f"training.global_batch_size ({self.global_batch_size}) must be divisible by "
                f"training.micro_batch_size ({self.micro_batch_size}) * data-parallel size ({data_parallel})"
            )
        if self.optimizer.min_lr > self.optimizer.lr:
            raise ValueError("training.optimizer.min_lr must not exceed training.optimizer.lr")
