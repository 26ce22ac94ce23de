"""Eval section: one FLORES-200 evaluation run (tools/evaluate.py), every field a dotted flag.

    python tools/evaluate.py --eval.system.hyp_dir hyps/ --eval.directions e2x --eval.out_dir reports/eval/x

A job YAML's `eval:` section gives the defaults (--config); dotted flags override them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

SystemKind = Literal["hyp-dir", "reference", "copy-source", "hf-model", "checkpoint"]


@dataclass(kw_only=True)
class EvalSystemConfig:
    """A system to evaluate: hypothesis files, a sanity system, or a model that translates first."""

    kind: SystemKind | None = None
    """'hyp-dir' (files hyp_dir/{src}-{tgt}.txt), 'reference' (scores 100), 'copy-source', 'hf-model'
    (translate with a rollout engine serving model_path) or 'checkpoint' (translate with a Megatron
    training checkpoint, inside a process group). None: 'checkpoint' with checkpoint, 'hf-model' with
    model_path, 'hyp-dir' with hyp_dir, else 'reference'."""
    hyp_dir: str | None = None
    """Hypothesis directory; hf-model and checkpoint write their translations here (default out_dir/hyps)."""
    name: str | None = None
    """Display name (default: the directory or checkpoint name, else the kind)."""
    model_path: str | None = None
    """hf-model: Hugging Face Qwen2 directory."""
    engine: str = "sglang"
    """hf-model: rollout engine by registry name ('sglang' on GPU; tests register a CPU fake)."""
    tokenizer_path: str | None = None
    """hf-model: tokenizer directory (default: model_path if it has tokenizer.json, else the shipped Qwen2.5)."""
    template: str | None = None
    """hf-model: user-turn prompt template (fields src_name tgt_name src tgt source); None = the shipped one."""
    checkpoint: str | None = None
    """checkpoint: Megatron training checkpoint; its saved config gives the model and the engine."""
    max_new_tokens: int = 256
    """hf-model and checkpoint: translation length cap in tokens."""
    batch_size: int = 64
    """hf-model and checkpoint: prompts per generate call."""

    @property
    def resolved_kind(self) -> str:
        """kind, or what the given paths imply when it is None."""
        if self.kind is not None:
            return self.kind
        if self.checkpoint:
            return "checkpoint"
        if self.model_path:
            return "hf-model"
        return "hyp-dir" if self.hyp_dir else "reference"

    @property
    def label(self) -> str:
        """The name tables and reports show."""
        if self.name:
            return self.name
        kind = self.resolved_kind
        return Path(self.hyp_dir).name if kind == "hyp-dir" and self.hyp_dir else kind

    def validate(self, where: str) -> None:
        """ValueErrors naming the field (where = 'eval.system' or 'eval.baseline')."""
        needs = {"hyp-dir": "hyp_dir", "hf-model": "model_path", "checkpoint": "checkpoint"}
        kind = self.resolved_kind
        if kind in needs and not getattr(self, needs[kind]):
            raise ValueError(f"{where}.kind {kind!r} needs {where}.{needs[kind]}")
        for name in ("max_new_tokens", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{where}.{name} must be >= 1, got {getattr(self, name)}")


@dataclass(kw_only=True)
class EvalConfig:
    """FLORES-200 evaluation: which directions, which system (and baseline), which metrics, where to."""

    directions: str = "all"
    """Comma list of src-tgt pairs, or groups x2e/e2x/x2x, or 'all' (90 directions)."""
    split: Literal["dev", "devtest"] = "devtest"
    """FLORES split."""
    max_sentences: int | None = None
    """Truncate each direction for quick runs."""
    comet_checkpoint: str | None = None
    """Path to a COMET-22 checkpoint; None skips COMET."""
    spm_model: str | None = None
    """flores200 sentencepiece model for spBLEU; None = per-language sacreBLEU tokenizers."""
    system: EvalSystemConfig = field(default_factory=EvalSystemConfig)
    """The system evaluated."""
    baseline: EvalSystemConfig | None = None
    """Second system for the paired bootstrap (None = no significance test)."""
    out_dir: str = "reports/eval/run"
    """Output directory of scores.csv/json, table3.md, heatmaps, bootstrap and constraint reports."""
    metrics: str = "bleu,chrf,chrf++"
    """Comma list of string metrics (COMET is added by comet_checkpoint)."""
    bootstrap_samples: int = 1000
    """Paired bootstrap resamples (with a baseline)."""
    seed: int = 12345
    """Seed of the bootstrap resamples."""
    workers: int = 0
    """Metric processes; 0 = one per CPU core, 1 = serial in this process."""
    width: int = 1
    """Decimals of BLEU/chrF in tables (the sacrebleu CLI's --width)."""
    plots: bool = True
    """Write heatmap_<metric>.png."""

    def validate(self) -> None:
        """ValueErrors naming the field."""
        self.system.validate("eval.system")
        if self.baseline is not None:
            self.baseline.validate("eval.baseline")
            if self.baseline.resolved_kind == "checkpoint":
                raise ValueError(
                    "eval.baseline: a checkpoint baseline is not supported; translate it first "
                    "(eval.system.checkpoint) and give its hyps as eval.baseline.hyp_dir"
                )
        if self.max_sentences is not None and self.max_sentences < 1:
            raise ValueError(f"eval.max_sentences must be >= 1 or null, got {self.max_sentences}")
        if not [m for m in self.metrics.split(",") if m.strip()]:
            raise ValueError("eval.metrics: name at least one metric (bleu,chrf,chrf++)")
        for name, low in (("bootstrap_samples", 1), ("workers", 0), ("width", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"eval.{name} must be >= {low}, got {getattr(self, name)}")
