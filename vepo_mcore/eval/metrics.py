"""Corpus metrics of one translation direction, computed exactly as the `sacrebleu` command line does.

Registry of string metrics (SPEC section 7):
  bleu    sacreBLEU with the target language's tokenizer ('zh', 'char' for th/km/lo/my, '13a'),
          or spBLEU (tokenizer 'flores200') when a local flores200 sentencepiece model is given
  chrf    chrF2 (character 6-grams, beta 2)
  chrf++  chrF2 with word bigrams (word_order=2)
COMET-22 is in comet.py (a neural model, scored in one batch over all directions).

Lines are compared the way the CLI reads files: split on '\\n' only and right-stripped, so a
score printed here with `width` decimals equals the CLI's on the same files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import sentencepiece
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.base import Metric

from vepo_mcore.languages import language

SPM_SIGNATURE = "flores200"
"""Tokenizer name written in spBLEU signatures (what `sacrebleu -tok flores200` prints)."""


class LocalSentencePieceTokenizer:
    """sacreBLEU's flores200 tokenizer, loaded from a local model file instead of a download.

    Splits a line into sentencepiece pieces joined by spaces, as sacrebleu's TokenizerSPM does.
    """

    def __init__(self, model_path: str | Path):
        path = Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"spBLEU sentencepiece model {path} does not exist (eval.spm_model)")

        self.path = path
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
        self._encode = lru_cache(maxsize=2**16)(self._pieces)

    def _pieces(self, line: str) -> str:
        return " ".join(self._sp.encode(line, out_type=str))

    def signature(self) -> str:
        return SPM_SIGNATURE

    def __call__(self, line: str) -> str:
        return self._encode(line)


def _bleu(tgt: str, spm_model: str | Path | None) -> Metric:
    if spm_model is None:
        return BLEU(tokenize=language(tgt).bleu_tokenize)
    metric = BLEU(tokenize="none")
    metric.tokenizer = LocalSentencePieceTokenizer(spm_model)
    metric.tokenizer_signature = metric.tokenizer.signature()
    return metric


METRICS: dict[str, Callable[[str, str | Path | None], Metric]] = {
    "bleu": _bleu,
    "chrf": lambda tgt, spm_model: CHRF(),
    "chrf++": lambda tgt, spm_model: CHRF(word_order=2),
}
"""Metric name -> builder(target language, spm model path or None) -> a sacrebleu Metric."""

DEFAULT_METRICS: tuple[str, ...] = ("bleu", "chrf", "chrf++")


def build_metric(name: str, tgt: str, spm_model: str | Path | None = None) -> Metric:
    """A fresh sacrebleu metric object for target language `tgt`."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; known: {', '.join(METRICS)} (and comet via comet.py)")
    return METRICS[name](tgt, spm_model)


def read_lines(path: str | Path) -> list[str]:
    """Lines of a text file as the sacrebleu CLI reads them ('\\n' only, right-stripped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    text = path.read_text(encoding="utf-8")
    if text.endswith("\n"):
        text = text[:-1]
    return [line.rstrip() for line in text.split("\n")] if text else []


def clean_lines(lines: Sequence[str]) -> list[str]:
    """Right-strip every line, as the CLI does after reading a file."""
    return [line.rstrip() for line in lines]


@dataclass(frozen=True)
class MetricResult:
    """A corpus score with everything needed to reproduce it."""

    name: str
    """Registry name (bleu, chrf, chrf++, comet)."""
    score: float
    """Full-precision corpus score (BLEU/chrF on 0-100, COMET on 0-1)."""
    signature: str
    """sacreBLEU signature (or the COMET checkpoint for comet)."""
    display_name: str
    """What sacrebleu calls the metric: BLEU, chrF2, chrF2++."""

    def format(self, width: int = 1) -> str:
        """The score as the sacrebleu CLI prints it with `--width width`."""
        return f"{self.score:.{width}f}"


def sentence_stats(metric: Metric, hyps: Sequence[str], refs: Sequence[str] | None) -> list[list[int]]:
    """Sufficient statistics per sentence (n_sentences lists of n_stats ints), as sacrebleu extracts them.

    `refs=None` uses the references cached in the metric (see `metric_with_references`).
    `metric._aggregate_and_compute(stats)` of the result is exactly `metric.corpus_score(...)`.
    """
    if refs is None:
        n_refs = len(metric._ref_cache) if metric._ref_cache is not None else 0
        if len(hyps) != n_refs:
            raise ValueError(f"{len(hyps)} hypotheses but {n_refs} cached references")
        return metric._extract_corpus_statistics(clean_lines(hyps), None)
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references")
    return metric._extract_corpus_statistics(clean_lines(hyps), [clean_lines(refs)])


_REF_CACHE: dict[tuple, Metric] = {}


def metric_with_references(
    name: str, tgt: str, refs: Sequence[str], spm_model: str | Path | None = None
) -> Metric:
    """A metric with `refs` pre-processed once (n-grams of every reference), reused across calls.

    Every target language's references serve 9 directions; preprocessing them is ~40% of a
    metric's cost. The cache keeps one target language at a time (callers group work by target)
    so memory stays bounded.
    """
    cleaned = tuple(clean_lines(refs))
    key = (name, tgt, str(spm_model), hash(cleaned), len(cleaned))
    if key not in _REF_CACHE:
        if any(k[1] != tgt for k in _REF_CACHE):
            _REF_CACHE.clear()
        metric = build_metric(name, tgt, spm_model)
        metric._ref_cache = metric._cache_references([list(cleaned)])
        _REF_CACHE[key] = metric
    return _REF_CACHE[key]


def aggregate_score(metric: Metric, stats: list[list[int]]) -> float:
    """Corpus score from per-sentence statistics (what corpus_score computes)."""
    return float(metric._aggregate_and_compute(stats).score)


def score_from_stats(metric: Metric, summed: np.ndarray) -> float:
    """Corpus score from summed sufficient statistics [n_stats] (what corpus_score computes)."""
    return float(metric._compute_score_from_stats(summed).score)


def corpus_score(
    name: str, hyps: Sequence[str], refs: Sequence[str], tgt: str, spm_model: str | Path | None = None
) -> MetricResult:
    """One metric over a direction: hyps/refs are line-aligned lists of n sentences."""
    metric = build_metric(name, tgt, spm_model)
    if len(hyps) != len(refs):
        raise ValueError(f"{name}: {len(hyps)} hypotheses but {len(refs)} references")
    score = metric.corpus_score(clean_lines(hyps), [clean_lines(refs)])
    return MetricResult(name, float(score.score), str(metric.get_signature()), score.name)
