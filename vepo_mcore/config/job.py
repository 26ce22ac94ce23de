"""The one config tree: every entry point loads a JobConfig from YAML plus dotted overrides."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import yaml

from vepo_mcore.config.base import config_help, load_config, to_dict
from vepo_mcore.config.data import DataConfig
from vepo_mcore.config.eval import EvalConfig
from vepo_mcore.config.memory import MemoryConfig
from vepo_mcore.config.model import ModelConfig
from vepo_mcore.config.parallel import ParallelConfig
from vepo_mcore.config.rl import RLConfig
from vepo_mcore.config.rm import RMConfig
from vepo_mcore.config.tokenizer import TokenizerConfig
from vepo_mcore.config.training import TrainingConfig


@dataclass(kw_only=True)
class JobConfig:
    """Everything a run needs. Sections a job does not use keep their defaults."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Model shape."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel layout."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Training loop."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """Tokenizer."""
    rl: RLConfig = field(default_factory=RLConfig)
    """RL (VEPO and baselines)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation."""
    rm: RMConfig = field(default_factory=RMConfig)
    """Reward-model training."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """The GPU the memory plan is checked against (--dry-run)."""

    def validate(self, world_size: int | None = None) -> None:
        """Check every section; world-size-dependent checks run when world_size is given."""
        self.parallel.validate(world_size)
        self.model.validate(self.parallel.tensor_model_parallel_size)
        dp = self.parallel.data_parallel_size(world_size) if world_size else None
        self.training.validate(dp)
        self.data.validate()
        self.rl.validate()
        self.eval.validate()
        self.rm.validate()
        self.memory.validate()
        if self.rl.eval_sentences and self.training.eval_interval <= 0:
            raise ValueError(
                f"rl.eval_sentences {self.rl.eval_sentences!r} is never evaluated with training.eval_interval "
                f"{self.training.eval_interval}: set training.eval_interval to validate every N RL steps"
            )
        if self.model.num_layers % self.parallel.pipeline_model_parallel_size:
            raise ValueError(
                f"model.num_layers ({self.model.num_layers}) must be divisible by "
                f"parallel.pipeline_model_parallel_size ({self.parallel.pipeline_model_parallel_size})"
            )


MEGATRON_LM_FLAGS: dict[str, str] = {
    "tensor-model-parallel-size": "parallel.tensor_model_parallel_size",
    "pipeline-model-parallel-size": "parallel.pipeline_model_parallel_size",
    "num-layers-per-virtual-pipeline-stage": "parallel.virtual_pipeline_model_parallel_size",
    "context-parallel-size": "parallel.context_parallel_size",
    "sequence-parallel": "parallel.sequence_parallel true",
    "distributed-backend": "parallel.backend",
    "distributed-timeout-minutes": "parallel.distributed_timeout_minutes",
    "num-layers": "model.num_layers",
    "hidden-size": "model.hidden_size",
    "ffn-hidden-size": "model.ffn_hidden_size",
    "num-attention-heads": "model.num_attention_heads",
    "num-query-groups": "model.num_query_groups",
    "kv-channels": "model.kv_channels",
    "max-position-embeddings": "model.max_position_embeddings",
    "rotary-base": "model.rotary_base",
    "norm-epsilon": "model.norm_epsilon",
    "make-vocab-size-divisible-by": "model.make_vocab_size_divisible_by",
    "init-method-std": "model.init_method_std",
    "attention-dropout": "model.attention_dropout",
    "hidden-dropout": "model.hidden_dropout",
    "transformer-impl": "model.transformer_impl",
    "fp8-format": "model.fp8.format",
    "micro-batch-size": "training.micro_batch_size",
    "global-batch-size": "training.global_batch_size",
    "seq-length": "training.seq_length",
    "train-iters": "training.train_iters",
    "eval-interval": "training.eval_interval",
    "eval-iters": "training.eval_iters",
    "seed": "training.seed",
    "bf16": "training.bf16 true",
    "recompute-granularity": "training.recompute",
    "lr": "training.optimizer.lr",
    "min-lr": "training.optimizer.min_lr",
    "weight-decay": "training.optimizer.weight_decay",
    "adam-beta1": "training.optimizer.adam_beta1",
    "adam-beta2": "training.optimizer.adam_beta2",
    "adam-eps": "training.optimizer.adam_eps",
    "clip-grad": "training.optimizer.clip_grad",
    "use-distributed-optimizer": "training.optimizer.use_distributed_optimizer true",
    "lr-warmup-iters": "training.scheduler.warmup_iters",
    "lr-decay-style": "training.scheduler.decay_style",
    "lr-decay-iters": "training.scheduler.decay_iters",
    "save": "training.checkpoint.save",
    "load": "training.checkpoint.load",
    "save-interval": "training.checkpoint.save_interval",
    "finetune": "training.checkpoint.finetune true",
    "async-save": "training.checkpoint.async_save true",
    "log-interval": "training.logging.log_interval",
    "tensorboard-dir": "training.logging.tensorboard_dir",
    "data-path": "data.paths.<lang> PREFIX",
    "split": "data.split",
    "data-cache-path": "data.cache_dir",
    "reset-position-ids": "data.reset_position_ids true",
    "reset-attention-mask": "data.reset_attention_mask true",
    "eod-mask-loss": "data.eod_mask_loss true",
    "num-workers": "data.num_workers",
    "tokenizer-model": "tokenizer.path",
}
"""Megatron-LM's common flags -> the dotted field (and value, for a switch) that does the same here."""


def check_megatron_flags(overrides: list[str]) -> None:
    """A ValueError naming our field for a Megatron-LM flag (--tensor-model-parallel-size 2 ->
    --parallel.tensor_model_parallel_size 2); dotted flags pass."""
    for arg in overrides:
        flag = arg.partition("=")[0]
        if not flag.startswith("--") or "." in flag:
            continue
        ours = MEGATRON_LM_FLAGS.get(flag[2:].replace("_", "-"))
        if ours is not None:
            raise ValueError(f"{flag} is Megatron-LM's flag; did you mean --{ours}?")


def job_from_cli(
    argv: list[str] | None,
    description: str,
    sections: tuple[str, ...] | None = None,
) -> tuple[argparse.Namespace, JobConfig]:
    """The entry scripts' command line: --config YAML [--dry-run [--world-size N]] [--print-config]
    and dotted overrides of any field (--training.train_iters 100); --help lists the fields of `sections` (default all)
    with their defaults. --print-config prints the effective config as YAML and exits. Returns
    (flags, the loaded JobConfig)."""
    epilog = "config fields (YAML sections, or dotted flags; defaults shown):\n" + "\n".join(
        config_help(JobConfig, sections)
    )
    parser = argparse.ArgumentParser(
        description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML config (see examples/configs/)")
    parser.add_argument("--dry-run", action="store_true", help="parse and validate the config, then exit")
    parser.add_argument("--world-size", type=int, default=None, help="--dry-run: also check this many ranks")
    parser.add_argument(
        "--check-paths",
        action="store_true",
        help="--dry-run: a missing data, checkpoint or tokenizer path is an error (exit 2), not a warning",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of configuration and data errors too"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the effective config (YAML, defaults filled in) and exit",
    )
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parser.parse_known_args(argv)
    check_megatron_flags(overrides)
    cfg = load_config(JobConfig, args.config, overrides)
    if args.print_config:
        tree = to_dict(cfg)
        print(yaml.safe_dump({k: tree[k] for k in sections} if sections else tree, sort_keys=False), end="")
        raise SystemExit(0)
    return args, cfg
