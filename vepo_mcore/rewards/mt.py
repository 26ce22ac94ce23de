"""Translation-quality term R_mt (SPEC section 5): chrF++ / 100 (default), sentence BLEU / 100 with
the target language's sacreBLEU tokenizer, COMET-22 from a local checkpoint, or the reward model.

The metric is chosen by ``RewardsConfig.mt``. COMET needs the optional ``unbabel-comet`` extra and a
checkpoint path (``rewards.comet_checkpoint``, e.g. .../wmt22-comet-da/checkpoints/model.ckpt); it is
imported lazily and the model is loaded once per process. ``mt: rm`` calls the reward registered as
"rm" (vepo_mcore/rm/reward.py).
"""

from __future__ import annotations

import functools
from pathlib import Path

from sacrebleu.metrics import BLEU, CHRF

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGUAGES, language
from vepo_mcore.rewards.registry import TermResult, register_reward, registered_rewards, run_reward
from vepo_mcore.translation.sample import Sample

# Imported where used: comet (optional: the [comet] extra, unbabel-comet), torch (heavy: the reward registry
# is torch-free).


@functools.lru_cache(maxsize=1)
def _chrf() -> CHRF:
    return CHRF(word_order=2)


@functools.cache
def _bleu(tokenize: str) -> BLEU:
    return BLEU(tokenize=tokenize, effective_order=True)


def chrf_score(hypothesis: str, reference: str) -> float:
    """Sentence chrF++ (sacreBLEU CHRF(word_order=2)) / 100, in [0, 1]."""
    return _chrf().sentence_score(hypothesis, [reference]).score / 100.0


def bleu_score(hypothesis: str, reference: str, tgt_lang: str) -> float:
    """Sentence BLEU / 100 with the target's tokenizer (zh / char / 13a) and effective order."""
    tokenize = language(tgt_lang).bleu_tokenize if tgt_lang in LANGUAGES else "13a"
    return _bleu(tokenize).sentence_score(hypothesis, [reference]).score / 100.0


@functools.lru_cache(maxsize=2)
def load_comet(checkpoint: str):
    """The COMET model at ``checkpoint`` (a local .ckpt; nothing is downloaded)."""
    try:
        import comet
    except ImportError:
        raise ImportError(
            "rewards.mt = 'comet' needs the optional unbabel-comet package: pip install 'vepo_mcore[comet]' "
            "(or pip install unbabel-comet), or set rewards.mt to 'chrf'"
        ) from None
    if not Path(checkpoint).is_file():
        raise FileNotFoundError(
            f"rewards.comet_checkpoint {checkpoint!r} is not a file; "
            "expected the model.ckpt of wmt22-comet-da"
        )
    return comet.load_from_checkpoint(checkpoint)


def comet_scores(
    samples: list[Sample], checkpoint: str, batch_size: int = 16, gpus: int | None = None
) -> list[float]:
    """COMET-22 score per sample (src, mt = response, ref), batched through COMET's predict()."""
    if gpus is None:
        import torch

        gpus = 1 if torch.cuda.is_available() else 0
    data = [{"src": s.source, "mt": s.response, "ref": s.reference} for s in samples]
    prediction = load_comet(checkpoint).predict(data, batch_size=batch_size, gpus=gpus, progress_bar=False)
    return [float(score) for score in prediction.scores]


def require_references(samples: list[Sample], metric: str) -> list[str]:
    missing = [i for i, s in enumerate(samples) if s.reference is None]
    if missing:
        raise ValueError(
            f"rewards.mt = {metric!r} needs a reference translation, but samples {missing[:5]} have none "
            "(set rewards.mt to 'rm' or 'none' for reference-free prompts)"
        )
    return [s.reference for s in samples]


def _per_reference(samples: list[Sample], metric: str, score) -> list[float]:
    references = require_references(samples, metric)
    return [score(s, ref) for s, ref in zip(samples, references)]


@register_reward("chrf")
def chrf_reward(samples: list[Sample]) -> list[float]:
    """Sentence chrF++ / 100 against each sample's reference."""
    return _per_reference(samples, "chrf", lambda s, ref: chrf_score(s.response, ref))


@register_reward("bleu")
def bleu_reward(samples: list[Sample]) -> list[float]:
    """Sentence BLEU / 100 with the target language's tokenizer."""
    return _per_reference(samples, "bleu", lambda s, ref: bleu_score(s.response, ref, s.tgt_lang))


@register_reward("comet")
def comet_reward(samples: list[Sample], cfg: RewardsConfig) -> list[float]:
    """COMET-22 from rewards.comet_checkpoint."""
    if not cfg.comet_checkpoint:
        raise ValueError(
            "rewards.mt = 'comet' needs rewards.comet_checkpoint (path to wmt22-comet-da model.ckpt)"
        )
    if not samples:
        return []
    require_references(samples, "comet")
    return comet_scores(samples, cfg.comet_checkpoint, cfg.comet_batch_size)


@register_reward("mt")
def mt_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """R_mt per sample: the reward term named by cfg.mt (chrf | bleu | comet | rm, or any registered
    term), or zeros for 'none'."""
    cfg = cfg or RewardsConfig()
    if cfg.mt == "none":
        return TermResult(values=[0.0] * len(samples))
    if cfg.mt not in registered_rewards() or cfg.mt == "mt":
        hint = (
            " (the term 'rm' registers on import vepo_mcore.rm.reward, as the RL trainer does)"
            if cfg.mt == "rm"
            else ""
        )
        raise ValueError(f"rewards.mt {cfg.mt!r} is not a registered reward term; registered: "
                         f"{', '.join(registered_rewards())}, or 'none'{hint}")  # fmt: skip
    return run_reward(cfg.mt, samples, cfg)
