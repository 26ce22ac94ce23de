"""Reward-model section (SPEC.md section 6): the pairs tools/train_rm.py builds and its loss weights.

Batch sizes live in the training section and count pairs there: training.micro_batch_size pairs
(2x sequences) per micro-batch, training.global_batch_size pairs per optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass

from vepo_mcore.languages import LANGS

CATEGORIES: tuple[str, ...] = (
    "accuracy",
    "off-target",
    "fluency",
    "terminology",
    "code-mixing",
    "repetition",
    "intent",
    "leakage",
    "explanation",
    "format",
)
"""The ten error categories, in the order of the reward model's category logits."""


@dataclass(kw_only=True)
class RMConfig:
    """Corrupted-FLORES pairs (train: dev, held-out: devtest) and the Bradley-Terry + multi-label loss."""

    init_from: str | None = None
    """Policy checkpoint (Megatron, any TP/PP) whose weights initialise the trunk; the head starts fresh."""
    langs: tuple[str, ...] = ()
    """Target languages of the pairs (empty = all ten)."""
    categories: tuple[str, ...] = ()
    """Error categories to corrupt (empty = all ten)."""
    train_lines: int = 997
    """FLORES dev lines used for training pairs (one pair per line x language x category)."""
    test_lines: int = 100
    """FLORES devtest lines used for held-out pairs (validation during training and the final tables)."""
    seed: int = 0
    """Seed of the corruptions and of the source language drawn per (line, target)."""
    other_language_off_target: float = 0.5
    """Share of off-target corruptions that are another language's FLORES line (else a source copy)."""
    bce_weight: float = 1.0
    """Weight of the multi-label category loss beside Bradley-Terry."""
    balance_categories: bool = True
    """Weight each category's positives by negatives / positives in the training pairs (rare labels
    would otherwise be learnt as 'never')."""
    max_pos_weight: float = 50.0
    """Cap on that per-category positive weight."""
    report_dir: str = "reports/rm"
    """Where tools/train_rm.py writes eval.md, eval.json and the curves."""

    def validate(self) -> None:
        """ValueErrors naming the field."""
        for name, values, known in (
            ("langs", self.langs, LANGS),
            ("categories", self.categories, CATEGORIES),
        ):
            unknown = [v for v in values if v not in known]
            if unknown:
                raise ValueError(f"rm.{name}: unknown {unknown}; known: {', '.join(known)}")
        if self.train_lines < 1 or self.test_lines < 0:
            raise ValueError(
                f"rm.train_lines must be >= 1 and rm.test_lines >= 0, got {self.train_lines}, {self.test_lines}"
            )
        if not 0 <= self.other_language_off_target <= 1:
            raise ValueError(
                f"rm.other_language_off_target must be in [0, 1], got {self.other_language_off_target}"
            )
        if self.bce_weight < 0 or self.max_pos_weight < 1:
            raise ValueError(
                f"rm.bce_weight must be >= 0 and rm.max_pos_weight >= 1, got {self.bce_weight}, {self.max_pos_weight}"
            )
