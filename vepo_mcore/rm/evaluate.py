"""Reward-model evaluation on held-out pairs (FLORES devtest): pairwise accuracy overall, per
category and per target language, and per-category error-detection precision / recall / F1.

    result = evaluate_pairs(model, tokenizer, pairs, seq_length)    # RMEvaluation
    Path("reports/rm/eval.md").write_text(markdown_report(result))

Pairwise accuracy: share of pairs whose reference scores strictly above its corruption.
Detection: a sequence is flagged for a category when sigmoid(logit) > 0.5; positives are the
corruptions carrying the category, negatives every other scored sequence (clean references too).
Average precision ranks the same sequences by probability (threshold-free); a head that learnt
nothing scores the positive rate.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vepo_mcore.rewards.corruptions import CATEGORIES, label_vector
from vepo_mcore.rm.data import Pair

# Imported where used: megatron.core and vepo_mcore.rm.model (pulls megatron.core): heavy, seconds to import;
# the trainers import this module before they take the save folder's lock.


@dataclass
class RMEvaluation:
    pairs: int
    accuracy: float
    by_category: dict[str, tuple[float, int]] = field(default_factory=dict)
    """category -> (pairwise accuracy, pairs)."""
    by_language: dict[str, tuple[float, int]] = field(default_factory=dict)
    """target language -> (pairwise accuracy, pairs)."""
    detection: dict[str, tuple[float, float, float, int]] = field(default_factory=dict)
    """category -> (precision, recall, F1, positives)."""
    average_precision: dict[str, float] = field(default_factory=dict)
    """category -> average precision of the category probability over all scored sequences."""


def detection_f1(predicted: torch.Tensor, labels: torch.Tensor) -> dict[str, tuple[float, float, float, int]]:
    """predicted, labels [n, 10] booleans -> category -> (precision, recall, F1, positives); 0 when undefined."""
    out = {}
    for k, name in enumerate(CATEGORIES):
        p, y = predicted[:, k], labels[:, k]
        tp = int((p & y).sum())
        precision = tp / int(p.sum()) if p.any() else 0.0
        recall = tp / int(y.sum()) if y.any() else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[name] = (precision, recall, f1, int(y.sum()))
    return out


def average_precision(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """scores [n], labels [n] booleans -> mean over positives of the precision at their rank
    (descending scores, ties in input order); 0 without positives."""
    order = torch.argsort(scores, descending=True, stable=True)
    hits = labels[order].float()
    if hits.sum() == 0:
        return 0.0
    precision_at = hits.cumsum(0) / torch.arange(1, len(hits) + 1)
    return float((precision_at * hits).sum() / hits.sum())


def summarise(
    pairs: Sequence[Pair],
    better: torch.Tensor,
    worse: torch.Tensor,
    better_probs: torch.Tensor,
    worse_probs: torch.Tensor,
) -> RMEvaluation:
    """Scores [N] and category probabilities [N, 10] of each pair's two sides -> RMEvaluation."""
    wins = (better > worse).tolist()
    groups: dict[str, dict[str, list[bool]]] = {"category": defaultdict(list), "language": defaultdict(list)}
    for pair, win in zip(pairs, wins):
        groups["category"][pair.category].append(win)
        groups["language"][pair.tgt_lang].append(win)

    def mean(values):
        return (sum(values) / len(values), len(values))

    labels = torch.tensor(
        [[0.0] * len(CATEGORIES)] * len(pairs) + [label_vector(p.worse_categories) for p in pairs]
    ).bool()
    probs = torch.cat([better_probs, worse_probs])
    predicted = probs > 0.5
    return RMEvaluation(
        pairs=len(pairs),
        accuracy=sum(wins) / max(1, len(wins)),
        by_category={
            c: mean(v) for c, v in sorted(groups["category"].items(), key=lambda kv: CATEGORIES.index(kv[0]))
        },
        by_language={lang: mean(v) for lang, v in groups["language"].items()},
        detection=detection_f1(predicted, labels),
        average_precision={c: average_precision(probs[:, k], labels[:, k]) for k, c in enumerate(CATEGORIES)},
    )


def evaluate_pairs(
    model, tokenizer, pairs: Sequence[Pair], seq_length: int, batch_size: int = 16
) -> RMEvaluation:
    """Collective over every rank: each data-parallel rank scores both sides of its share of the
    pairs (every DP-th pair; its TP/PP group together), the shares are gathered, and every rank
    summarises all pairs."""
    from megatron.core import parallel_state as ps

    from vepo_mcore.rm.model import score_texts

    sharded = dist.is_initialized() and ps.model_parallel_is_initialized()
    rank, size = (ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()) if sharded else (0, 1)
    mine = pairs[rank::size]
    prompts = [p.prompt for p in mine]
    sides = [
        score_texts(model, tokenizer, prompts, [getattr(p, side) for p in mine], seq_length, batch_size)
        for side in ("better", "worse")
    ]
    scored = torch.cat([torch.cat([s[0][:, None], s[1]], dim=1) for s in sides], dim=1)  # [n, 22]
    if size > 1:
        shares: list = [None] * size
        dist.all_gather_object(shares, scored, group=ps.get_data_parallel_group())
        scored = torch.empty(len(pairs), scored.shape[1])
        for r, share in enumerate(shares):
            scored[r::size] = share
    k = 1 + len(CATEGORIES)
    return summarise(pairs, scored[:, 0], scored[:, k], scored[:, 1:k], scored[:, k + 1 :])


def markdown_report(result: RMEvaluation, title: str = "Reward model on FLORES devtest pairs") -> str:
    """Tables: pairwise accuracy (overall, per category, per target language) and detection P/R/F1."""
    lines = [f"# {title}", "", f"Pairwise accuracy over {result.pairs} pairs: **{result.accuracy:.3f}**", ""]
    lines += [
        "| category | pairwise acc | pairs | detect P | detect R | detect F1 | detect AP | positive rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in CATEGORIES:
        acc, n = result.by_category.get(c, (float("nan"), 0))
        p, r, f1, pos = result.detection.get(c, (0.0, 0.0, 0.0, 0))
        ap, rate = result.average_precision.get(c, 0.0), pos / max(1, 2 * result.pairs)
        lines.append(f"| {c} | {acc:.3f} | {n} | {p:.3f} | {r:.3f} | {f1:.3f} | {ap:.3f} | {rate:.3f} |")
    lines += ["", "| target language | pairwise acc | pairs |", "|---|---|---|"]
    for lang, (acc, n) in result.by_language.items():
        lines.append(f"| {lang} | {acc:.3f} | {n} |")
    return "\n".join(lines) + "\n"
