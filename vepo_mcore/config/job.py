"""The one config tree: every entry point loads a JobConfig from YAML plus dotted overrides."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from vepo_mcore.config.base import load_config
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


def expand_flag_aliases(argv: list[str], aliases: dict[str, tuple[str, str | None]]) -> list[str]:
    """argv with each alias flag written as its dotted field: `--out DIR` or `--out=DIR` becomes
    `--eval.out_dir DIR`; a switch (fixed value, e.g. `--no-plots`) becomes `--eval.plots false`."""
    out: list[str] = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag not in aliases:
            out.append(arg)
            continue
        dotted, fixed = aliases[flag]
        if fixed is not None:
            if eq:
                raise ValueError(f"{flag} is a switch (it sets {dotted} to {fixed}); it takes no value")
            out += [f"--{dotted}", fixed]
        else:
            out += [f"--{dotted}={value}"] if eq else [f"--{dotted}"]
    return out


def job_from_cli(
    argv: list[str] | None, description: str, aliases: dict[str, tuple[str, str | None]] | None = None
) -> tuple[argparse.Namespace, JobConfig]:
    """The entry scripts' command line: --config YAML [--dry-run [--world-size N]] and dotted
    overrides of any field (--training.train_iters 100). `aliases` maps a script's older flags onto
    dotted fields (listed in --help). Returns (flags, the loaded JobConfig)."""
    epilog = None
    if aliases:
        rows = [
            f"  {flag:20s} --{dotted}" + (f" {fixed}" if fixed else "")
            for flag, (dotted, fixed) in aliases.items()
        ]
        epilog = "older flags, still accepted as aliases of dotted fields:\n" + "\n".join(rows)
    parser = argparse.ArgumentParser(
        description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML config (see examples/configs/)")
    parser.add_argument("--dry-run", action="store_true", help="parse and validate the config, then exit")
    parser.add_argument("--world-size", type=int, default=None, help="--dry-run: also check this many ranks")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of configuration and data errors too"
    )
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = parser.parse_known_args(expand_flag_aliases(argv, aliases or {}))
    return args, load_config(JobConfig, args.config, overrides)
