"""Rollout engines: the interface (base.py), the embedded Megatron sampler, colocated SGLang (and its
CPU fake), and the Megatron -> engine weight sync. Engines register by name; build one with

    engine = build_engine(cfg, model=model, tokenizer=tok)     # cfg.rl.rollout.engine
"""

from vepo_mcore.rl.rollout.base import (
    RolloutEngine,
    SamplingParams,
    build_engine,
    known_engines,
    register_engine,
)
from vepo_mcore.rl.rollout.weight_sync import sync_weights

__all__ = [
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
    "known_engines",
    "register_engine",
    "sync_weights",
]
