"""The reward-model term `rm` (R_mt when rl.rewards.mt = 'rm'): the trained RM's score of each
(prompt, response), reference-free.

The RM is loaded once per process from rewards.rm_checkpoint into the running model-parallel
layout (rm.model.load_reward_model). TP-aware: every rank of a TP group must score the same
samples (the RM's TP layers communicate), as the RL trainer's reward call on every training rank
does; the scores come back identical on each rank. A sample without a ChatML prompt gets the
translation prompt built from its source and languages (translation.prompts.format_prompt).

rl.rewards.rm_placement: 'resident' keeps the RM on the training GPUs all run long; 'offload' keeps
its weights in (pinned) host memory and copies them to the GPU only for the scoring call
(rm/placement.py), so neither the colocated engine's rollout nor training shares the GPU with it.
The scores are the same either way (docs/DESIGN.md, "The reward model at 7B").
The model side (megatron.core, the RM checkpoint) is imported when the term is first built:
registering the term costs nothing.
"""

from __future__ import annotations

import contextlib

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.translation.directions import Direction
from vepo_mcore.translation.prompts import format_prompt
from vepo_mcore.translation.sample import Sample

# Imported where used: vepo_mcore.rm.model (pulls megatron.core) and vepo_mcore.rm.placement (pulls torch):
# the model side loads when the term is first built; registering the term costs nothing.

_CACHE: dict[tuple[str, str], tuple] = {}
"""(checkpoint, placement) -> (model, cfg, tokenizer, Offloader or None): one RM per process."""


def _loaded(checkpoint: str, placement: str) -> tuple:
    """Collective on the first call: load the RM; an offloaded one leaves the GPU right away."""
    key = (checkpoint, placement)
    if key not in _CACHE:
        from vepo_mcore.rm.model import load_reward_model
        from vepo_mcore.rm.placement import Offloader

        clear_cache()
        model, rm_cfg, tokenizer = load_reward_model(checkpoint)
        mover = None
        if placement == "offload":
            mover = Offloader(model)
            mover.offload()
        _CACHE[key] = (model, rm_cfg, tokenizer, mover)
    return _CACHE[key]


def loaded_model(checkpoint: str, placement: str) -> tuple:
    """(model, Offloader or None) of the loaded RM; KeyError before the first score (tests, reports)."""
    model, _, _, mover = _CACHE[(checkpoint, placement)]
    return model, mover


def clear_cache() -> None:
    """Forget the loaded RM (e.g. after the checkpoint or the process groups changed)."""
    _CACHE.clear()


def _prompt(sample: Sample, tokenizer) -> str:
    if sample.prompt:
        return sample.prompt

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

    model, rm_cfg, tokenizer, mover = _loaded(str(cfg.rm_checkpoint), cfg.rm_placement)
    prompts = [_prompt(s, tokenizer) for s in samples]
    responses = [s.response for s in samples]
    with mover.on_device() if mover else contextlib.nullcontext():
        scores, probs = score_texts(model, tokenizer, prompts, responses,
                                    seq_length=rm_cfg.training.seq_length, batch_size=cfg.rm_batch_size)  # fmt: skip
    return TermResult(values=scores.tolist(), raw=probs.max(-1).values.tolist())
