"""Repetition reward r_rep: a penalty for answers that loop (not in the paper; off by default).

A small policy's greedy answers fail by looping on a word or phrase ("สวนงานสวนงานสวนงาน...") and
still stopping: the length term sees only that the answer is too long, and a loop a little under
the length bound passes every constraint. r_rep names the failure itself:

    p_rep = share of the answer's characters that repeat the unit before them, in runs where a unit
            of >= 2 characters occurs >= 3 times in a row (the first occurrence does not count)
    r_rep = 0 if p_rep <= rep_threshold else -zeta_rep * (p_rep - rep_threshold)

No FLORES-200 dev or devtest reference of the ten languages has p_rep above 0.1 (Filipino's
reduplications, "mamama", are the only runs, a few characters of a sentence). Give the term a
weight in rl.rewards.weights ({"repetition": 0.5}) to use it.
"""

from __future__ import annotations

import regex

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.translation.sample import Sample

_RUN = regex.compile(r"(\S.+?)\1{2,}", flags=regex.DOTALL)
"""A unit of >= 2 characters, not starting with a space, then >= 2 more copies of it."""


def repeated_share(text: str) -> float:
    """p_rep of ``text`` (stripped): characters in the 2nd, 3rd, ... copies of looping units / all."""
    text = text.strip()
    if not text:
        return 0.0
    repeated = sum(len(m.group(0)) - len(m.group(1)) for m in _RUN.finditer(text))
    return repeated / len(text)


def repetition_term(p_rep: float, threshold: float = 0.1, zeta: float = 2.0) -> float:
    """0 up to the threshold, then -zeta per unit of share above it."""
    return 0.0 if p_rep <= threshold else -zeta * (p_rep - threshold)


@register_reward("repetition")
def repetition_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """r_rep per sample; raw = p_rep. Not a constraint: it never filters a sample out."""
    cfg = cfg or RewardsConfig()
    shares = [repeated_share(s.response) for s in samples]
    return TermResult(
        values=[repetition_term(p, cfg.rep_threshold, cfg.zeta_rep) for p in shares], raw=shares
    )
