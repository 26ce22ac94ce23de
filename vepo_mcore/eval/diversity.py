"""How different the G samples of one prompt are: the measure of template collapse inside a group.

    group_chrf(["a b c", "a b d", "x y"])    # mean chrF++ (0-100) over ordered pairs: 100 = identical
    distinct_n(["a b c", "a b d"], 2)        # distinct word bigrams / all bigrams (0-1): 1 = no overlap

A policy that answers every sample of a prompt alike has group_chrf near 100 and distinct-2 near
1/G; the RL step logs both as rollout/group_chrf and rollout/distinct2 (means over its groups).
"""

from __future__ import annotations

from collections.abc import Sequence

from vepo_mcore.rewards.mt import chrf_score


def group_chrf(texts: Sequence[str]) -> float:
    """Mean sentence chrF++ of every ordered pair (i != j) of `texts` (chrF++ is not symmetric);
    nan for fewer than two."""
    pairs = [(a, b) for i, a in enumerate(texts) for j, b in enumerate(texts) if i != j]
    if not pairs:
        return float("nan")
    return 100.0 * sum(chrf_score(a, b) for a, b in pairs) / len(pairs)


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct word n-grams over all word n-grams of `texts` (characters for unspaced scripts are
    not split: a Thai answer is mostly one "word", so this is a Latin-script measure); nan without
    n-grams."""
    grams = [
        tuple(words[i : i + n]) for t in texts for words in [t.split()] for i in range(len(words) - n + 1)
    ]
    return len(set(grams)) / len(grams) if grams else float("nan")
