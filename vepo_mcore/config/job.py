"""The one config tree: every entry point loads a JobConfig from YAML plus dotted overrides."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from vepo_mcore.config.base import load_config
from vepo_mcore.config.data import DataConfig
from vepo_mcore.config.eval import EvalConfig
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

    def validate(self, world_size: int | None = None) -> None:
        """Check every section; world-size-dependent checks run when world_size is given."""
        self.parallel.validate(world_size)
        self.model.validate(self.parallel.tensor_model_parallel_size)
        dp = self.parallel.data_parallel_size(world_size) if world_size else None
        self.training.validate(dp)
        self.data.validate()
        self.rl.validate()
        self.rm.validate()
        if self.model.num_layers % self.parallel.pipeline_model_parallel_size:
            raise ValueError(
                f"model.num_layers ({self.model.num_layers}) must be divisible by "
                f"parallel.pipeline_model_parallel_size ({self.parallel.pipeline_model_parallel_size})"
            )


def job_from_cli(argv: list[str] | None, description: str) -> tuple[argparse.Namespace, JobConfig]:
    """The entry scripts' command line: --config YAML [--dry-run [--world-size N]] and dotted
    overrides of any field (--training.train_iters 100). Returns (flags, the loaded JobConfig)."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML config (see examples/configs/)")
    parser.add_argument("--dry-run", action="store_true", help="parse and validate the config, then exit")
    parser.add_argument("--world-size", type=int, default=None, help="--dry-run: also check this many ranks")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of configuration and data errors too"
    )
    args, overrides = parser.parse_known_args(argv)
    return args, load_config(JobConfig, args.config, overrides)
