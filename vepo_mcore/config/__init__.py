"""The dataclass config tree (see job.py) and its YAML/CLI plumbing (see base.py)."""

from vepo_mcore.config.base import from_dict, load_config, parse_overrides, save_config, to_dict
from vepo_mcore.config.data import DataConfig, SFTPhaseConfig
from vepo_mcore.config.eval import EvalConfig
from vepo_mcore.config.job import JobConfig
from vepo_mcore.config.model import FP8Config, ModelConfig
from vepo_mcore.config.parallel import ParallelConfig
from vepo_mcore.config.rewards import FilterConfig, RewardsConfig
from vepo_mcore.config.rl import KLConfig, LossConfig, RLConfig, RolloutConfig, SamplingParams
from vepo_mcore.config.rm import RMConfig
from vepo_mcore.config.tokenizer import TokenizerConfig
from vepo_mcore.config.training import TrainingConfig

__all__ = [
    "DataConfig",
    "EvalConfig",
    "FP8Config",
    "FilterConfig",
    "JobConfig",
    "KLConfig",
    "LossConfig",
    "ModelConfig",
    "ParallelConfig",
    "RLConfig",
    "RMConfig",
    "RewardsConfig",
    "RolloutConfig",
    "SFTPhaseConfig",
    "SamplingParams",
    "TokenizerConfig",
    "TrainingConfig",
    "from_dict",
    "load_config",
    "parse_overrides",
    "save_config",
    "to_dict",
]
