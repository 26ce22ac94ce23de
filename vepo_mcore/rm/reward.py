"""The reward-model term `rm` (R_mt when rl.rewards.mt = 'rm'): the trained RM's score of each
(prompt, response), reference-free.

The RM is loaded once per process from rewards.rm_checkpoint into the running model-parallel
layout (rm.model.load_reward_model). TP-aware: every rank of a TP group must score the same
samples (the RM's TP layers communicate), as the RL trainer's reward call on every training rank
does; the scores come back identical on each rank. A sample without a ChatML prompt gets the
translation prompt built from its source and languages (translation.prompts.format_prompt).
"""

from __future__ import annotations

import functools

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.translation.sample import Sample


@functools.lru_cache(maxsize=1)
def _loaded(checkpoint: str):
    from vepo_mcore.rm.model import load_reward_model

    return load_reward_model(checkpoint)


def clear_cache() -> None:
    """Forget the loaded RM (e.g. after the checkpoint or the process groups changed)."""
    _loaded.cache_clear()


def _prompt(sample: Sample, tokenizer) -> str:
    if sample.prompt:
        return sample.prompt
    from vepo_mcore.translation.directions import Direction
    from vepo_mcore.translation.prompts import format_prompt

    if not (sample.source and sample.src_lang and sample.tgt_lang):
        raise ValueError("reward 'rm': a sample needs a prompt, or source + src_lang + tgt_lang")
    return format_prompt(Direction(sample.src_lang, sample.tgt_lang), sample.source, tokenizer)


@register_reward("rm")
def rm_reward(samples: list[Sample], cfg: RewardsConfig) -> TermResult:
    """RM score per sample; raw = the RM's largest category probability (how sure it is of an error)."""
    if not cfg.rm_checkpoint:
        raise ValueError(
            "rl.rewards.mt = 'rm' needs rl.rewards.rm_checkpoint (a checkpoint of tools/train_rm.py)"
        )
    if not samples:
        return TermResult(values=[], raw=[])
    from vepo_mcore.rm.model import score_texts

    model, rm_cfg, tokenizer = _loaded(str(cfg.rm_checkpoint))
    prompts = [_prompt(s, tokenizer) for s in samples]
    scores, probs = score_texts(
        model, tokenizer, prompts, [s.response for s in samples], seq_length=rm_cfg.training.seq_length
    )
    return TermResult(values=scores.tolist(), raw=probs.max(-1).values.tolist())
