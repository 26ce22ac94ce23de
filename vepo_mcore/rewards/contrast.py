"""Contrastive chrF++ (`rewards.mt: chrf_contrast`): the chrF++ a response earns from its own
reference above what it earns from other sentences of the target language.

    R_mt = ( chrF++(y, ref) - w * mean_k chrF++(y, c_k) ) / 100,  k = 1..K

with c_1..c_K drawn from the target language's FLORES-200 dev sentences (never its devtest), the
reference itself excluded, by a generator seeded from the reference (the same K for a prompt in
every step and process), w = rewards.contrast_weight and K = rewards.contrast_references.

Why: a small policy can raise plain chrF++ with text that ignores the source (one frequent
opening for every prompt of a direction scores ~14 chrF++ against any reference), and RL then
collapses onto it; the held-out `chrf_source` and `same_opening` measures (eval/heldout.py) show
it. Text that matches every sentence of the language equally earns ~0 here, so only what depends
on the source is rewarded. Not in the paper: an option for small policies.
"""

from __future__ import annotations

import functools
import random
import zlib

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import load_flores
from vepo_mcore.rewards.mt import chrf_score, require_references
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.translation.sample import Sample

CONTRAST_SPLIT = "dev"
"""FLORES-200 split the contrast sentences come from (the held-out evaluation uses devtest)."""


@functools.cache
def _pool(lang: str) -> tuple[str, ...]:
    return tuple(load_flores(lang, CONTRAST_SPLIT))


def contrast_sentences(reference: str, lang: str, k: int) -> list[str]:
    """`k` distinct FLORES dev sentences of `lang` other than `reference`, chosen by a generator
    seeded from the reference's bytes (crc32: stable across processes, unlike hash())."""
    pool = [s for s in _pool(lang) if s != reference]
    if k > len(pool):
        raise ValueError(
            f"rewards.contrast_references = {k} but FLORES {CONTRAST_SPLIT} has only {len(pool)} other "
            f"sentences of {lang!r}"
        )
    rng = random.Random(zlib.crc32(reference.encode("utf-8")))
    return rng.sample(pool, k)


def contrast_chrf(hypothesis: str, reference: str, lang: str, k: int, weight: float) -> tuple[float, float]:
    """(R_mt, chrF++ / 100 against the reference) of one response, as in the module docstring."""
    own = chrf_score(hypothesis, reference)
    others = [chrf_score(hypothesis, c) for c in contrast_sentences(reference, lang, k)]
    return own - weight * sum(others) / k, own


@register_reward("chrf_contrast")
def chrf_contrast_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """Contrastive chrF++ per sample; raw = plain chrF++ / 100 (what rewards.mt 'chrf' would give)."""
    cfg = cfg or RewardsConfig()
    references = require_references(samples, "chrf_contrast")
    scored = [
        contrast_chrf(s.response, ref, s.tgt_lang, cfg.contrast_references, cfg.contrast_weight)
        for s, ref in zip(samples, references)
    ]
    return TermResult(values=[value for value, _ in scored], raw=[own for _, own in scored])
