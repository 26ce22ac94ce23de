"""Rollout engines: the interface (base.py), the embedded Megatron sampler, colocated SGLang (its CPU
fake lives in tests/support and registers from there), and the Megatron -> engine weight sync.
Engines register by name; build one with

    engine = build_engine(cfg, model=model, tokenizer=tok)     # cfg.rl.rollout.engine
"""

# The built-in engines register when imported (sglang itself only when an engine starts).
from vepo_mcore.rollout import embedded, sglang_engine  # noqa: E402, F401, I001  (registration)
from vepo_mcore.rollout.base import (
    RolloutEngine,
    SamplingParams,
    build_engine,
    known_engines,
    register_engine,
)
from vepo_mcore.rollout.weight_sync import sync_weights

__all__ = [
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
    "known_engines",
    "register_engine",
    "sync_weights",
]
