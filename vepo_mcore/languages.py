"""The ten languages of the project and where their shipped data lives.

One table holds every per-language fact the pipeline needs (FLORES code, fastText label,
script, sacreBLEU tokenizer), so no module keeps its own copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
FLORES_SPLITS = ("dev", "devtest")


@dataclass(frozen=True)
class Language:
    code: str
    """Project code (en, zh, th, ms, km, lo, my, fil, id, vi)."""
    flores: str
    """FLORES-200 code (eng_Latn, ...)."""
    fasttext: str
    """fastText lid.176 label (fil -> tl)."""
    script: str
    """Unicode script of the language's letters: Latin, Han, Thai, Khmer, Lao, Myanmar."""
    bleu_tokenize: str
    """sacreBLEU tokenizer for this language as a target (SPEC section 7)."""
    name: str
    """English name."""


LANGUAGES: dict[str, Language] = {
    lang.code: lang
    for lang in (
        Language("en", "eng_Latn", "en", "Latin", "13a", "English"),
        Language("zh", "zho_Hans", "zh", "Han", "zh", "Chinese"),
        Language("th", "tha_Thai", "th", "Thai", "char", "Thai"),
        Language("ms", "zsm_Latn", "ms", "Latin", "13a", "Malay"),
        Language("km", "khm_Khmr", "km", "Khmer", "char", "Khmer"),
        Language("lo", "lao_Laoo", "lo", "Lao", "char", "Lao"),
        Language("my", "mya_Mymr", "my", "Myanmar", "char", "Burmese"),
        Language("fil", "tgl_Latn", "tl", "Latin", "13a", "Filipino"),
        Language("id", "ind_Latn", "id", "Latin", "13a", "Indonesian"),
        Language("vi", "vie_Latn", "vi", "Latin", "13a", "Vietnamese"),
    )
}
LANGS: tuple[str, ...] = tuple(LANGUAGES)
"""All ten, in the paper's order."""
EXPANDED_LANGS: tuple[str, ...] = ("th", "ms", "km", "lo", "my", "fil", "id", "vi")
"""The eight low-resource languages the tokenizer is expanded for."""


def language(code: str) -> Language:
    try:
        return LANGUAGES[code]
    except KeyError:
        raise ValueError(f"unknown language {code!r}; known: {', '.join(LANGS)}") from None


def flores_dir() -> Path:
    """FLORES-200 root: $VEPO_FLORES_DIR, else the copy shipped in vepo_mcore/assets."""
    root = Path(os.environ.get("VEPO_FLORES_DIR", ASSETS / "flores200"))
    if not (root / "devtest").is_dir():
        raise FileNotFoundError(f"FLORES-200 directory {root} has no devtest/ folder (set VEPO_FLORES_DIR)")
    return root


def flores_path(code: str, split: str = "devtest") -> Path:
    if split not in FLORES_SPLITS:
        raise ValueError(f"unknown FLORES split {split!r}; known: {FLORES_SPLITS}")
    return flores_dir() / split / f"{language(code).flores}.txt"


def load_flores(code: str, split: str = "devtest") -> list[str]:
    """Sentences of one language, line-aligned across languages."""
    return flores_path(code, split).read_text(encoding="utf-8").splitlines()


def sentence_range(spec: str) -> slice:
    """'800:' / ':800' / '100:200' / ':' -> the slice of a FLORES split's (line-aligned) sentences.

    How SFT and RL share one split without sharing sentences: SFT on dev[:800], RL prompts from
    dev[800:], so RL sees prompts the policy has not memorised.
    """
    start, sep, stop = spec.partition(":")
    try:
        if not sep:
            raise ValueError
        bounds = [int(x) if x.strip() else None for x in (start, stop)]
    except ValueError:
        raise ValueError(f"sentence range {spec!r}: expected START:STOP like '800:' or ':800'") from None
    if any(b is not None and b < 0 for b in bounds):
        raise ValueError(f"sentence range {spec!r}: indices must be >= 0")
    return slice(*bounds)


def default_tokenizer_dir() -> Path:
    """The Qwen2.5 tokenizer shipped in vepo_mcore/assets (151,665 ids)."""
    return ASSETS / "qwen2.5-tokenizer"
