"""Paired bootstrap resampling between two systems, with sacreBLEU's `--paired-bs` semantics.

For n sentences, draw `n_samples` resamples of n sentence indices with replacement
(numpy default_rng(seed).choice, seed 12345 like sacrebleu's SACREBLEU_SEED default), score
both systems on every resample from summed per-sentence sufficient statistics, and compute

    diff      = |score(sys) - score(base)|                      on the full test set
    d_b       = |score_b(sys) - score_b(base)|                  per resample b
    p         = (#{b : d_b - mean(d) > diff} + 1) / (n_samples + 1)

i.e. the p-value of the null hypothesis "the systems are equal" (Koehn 2004, as in Moses'
bootstrap-hypothesis-difference-significance.pl). The 95% interval is sacrebleu's: half the
distance between the 2.5% and 97.5% order statistics.

Groups (X->E, E->X, X->X, Avg): FLORES is multi-way parallel, so the same resampled sentence
indices are used in every direction and a group's resample score is the mean of its
directions' resample scores; the p-value formula is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_SEED = 12345
DEFAULT_SAMPLES = 1000


def resample_indices(n: int, n_samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED) -> np.ndarray:
    """Sentence indices of every resample, int array [n_samples, n] (sacrebleu's draw)."""
    if n <= 0:
        raise ValueError(f"cannot bootstrap an empty test set (n={n})")
    rng = np.random.default_rng(seed)
    return rng.choice(n, size=(n_samples, n), replace=True)


def resample_scores(
    stats: np.ndarray, indices: np.ndarray, score_fn: Callable[[np.ndarray], float]
) -> np.ndarray:
    """Score of each resample: stats [n, k] per-sentence sufficient statistics, indices [B, n] -> [B].

    Resampled sums are counts @ stats (counts[b, i] = times sentence i is drawn), cast to
    float32 because sacrebleu sums float32 statistics and its BLEU/chrF arithmetic then runs
    in float32; the sums themselves are exact integers either way.
    """
    n_samples, n = indices.shape
    if stats.shape[0] != n:
        raise ValueError(f"stats have {stats.shape[0]} sentences but the resamples draw from {n}")
    counts = np.zeros((n_samples, n), dtype=np.float64)
    np.add.at(counts, (np.arange(n_samples)[:, None], indices), 1.0)
    sums = (counts @ stats).astype(np.float32)
    return np.array([score_fn(row) for row in sums], dtype=np.float64)


@dataclass(frozen=True)
class PairedResult:
    """Outcome of one paired test (scores on the metric's own scale)."""

    base_score: float
    sys_score: float
    delta: float
    """sys_score - base_score."""
    p_value: float
    sys_mean: float
    sys_ci: float
    base_mean: float
    base_ci: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def mean_ci(scores: np.ndarray) -> tuple[float, float]:
    """(mean, half width of the 95% interval) of resample scores, as sacrebleu's estimate_ci."""
    ordered = np.sort(scores)
    n = len(ordered)
    lower = n // 40
    upper = n - lower - 1
    return float(ordered.mean()), float(0.5 * (ordered[upper] - ordered[lower]))


def paired_test(
    base_score: float, sys_score: float, base_resamples: np.ndarray, sys_resamples: np.ndarray
) -> PairedResult:
    """p-value of |sys - base| under paired resampling; resamples are [B] scores on shared indices."""
    if base_resamples.shape != sys_resamples.shape:
        raise ValueError(f"resample shapes differ: {base_resamples.shape} vs {sys_resamples.shape}")
    diff = abs(base_score - sys_score)
    sample_diffs = np.abs(sys_resamples - base_resamples)
    centred = sample_diffs - sample_diffs.mean()
    p_value = (int(np.sum(centred > diff)) + 1) / (len(centred) + 1)
    sys_mean, sys_ci = mean_ci(sys_resamples)
    base_mean, base_ci = mean_ci(base_resamples)
    return PairedResult(
        base_score=base_score,
        sys_score=sys_score,
        delta=sys_score - base_score,
        p_value=p_value,
        sys_mean=sys_mean,
        sys_ci=sys_ci,
        base_mean=base_mean,
        base_ci=base_ci,
    )


def paired_group_test(
    base_scores: Sequence[float],
    sys_scores: Sequence[float],
    base_resamples: Sequence[np.ndarray],
    sys_resamples: Sequence[np.ndarray],
) -> PairedResult:
    """Paired test of a group mean: per-direction scores [D] and resample arrays D x [B]."""
    if not len(base_scores) == len(sys_scores) == len(base_resamples) == len(sys_resamples) > 0:
        raise ValueError("a group test needs the same non-zero number of directions for both systems")
    return paired_test(
        float(np.mean(base_scores)),
        float(np.mean(sys_scores)),
        np.mean(np.stack(base_resamples), axis=0),
        np.mean(np.stack(sys_resamples), axis=0),
    )


def mean_value_ci(
    values: Sequence[float], n_samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED
) -> tuple[float, float]:
    """95% percentile interval of mean(values) under resampling of the n items.

    values: [n] per-item values (a per-sentence difference, a per-group correlation).
    """
    x = np.asarray(values, dtype=np.float64)
    means = x[resample_indices(len(x), n_samples, seed)].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def paired_mean_diff_ci(
    base: Sequence[float], system: Sequence[float], n_samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED
) -> tuple[float, float]:
    """95% percentile interval of mean(system - base) under paired resampling of the n items.

    base, system: [n] per-item scores on the same items (a pass/fail as 0/1, a sentence chrF++).
    """
    a, b = np.asarray(base, dtype=np.float64), np.asarray(system, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired scores differ in shape: {a.shape} vs {b.shape}")
    return mean_value_ci(b - a, n_samples, seed)
