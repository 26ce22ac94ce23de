"""Corrupted translations by error category, for training and testing the reward model (SPEC section 6).

    c = corrupt(source, reference, "en", "th", "repetition", seed=3)   # Corruption(text, categories, kind)
    all_ten = corrupt_all(source, reference, "en", "th", seed=3)       # one per category

Every corruption is deterministic for (inputs, category, seed), differs from the reference, and
carries the categories it exhibits (non-exclusive: an English comment in a Thai output is both
`intent` and `off-target`). Text is cut into units: whitespace words for Latin-script languages,
short runs of grapheme clusters for zh/th/km/lo/my, which do not separate words by spaces.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import regex

from vepo_mcore.config.rm import CATEGORIES
from vepo_mcore.languages import language

SPACELESS = frozenset({"zh", "th", "km", "lo", "my"})
"""Languages whose words are not separated by spaces: units are runs of grapheme clusters."""

_NEGATION = {
    "en": "not", "zh": "不", "th": "ไม่", "ms": "tidak", "km": "មិន", "lo": "ບໍ່",
    "my": "မ", "fil": "hindi", "id": "tidak", "vi": "không",
}  # fmt: skip
_ENGLISH_WORDS = (
    "the", "people", "because", "however", "government", "important", "really", "actually",
    "meeting", "country", "report", "maybe", "very", "system", "problem", "money",
)  # fmt: skip
_FOREIGN_WORDS = ("tidak", "sangat", "người", "của", "ang", "mga", "dengan", "yang", "và", "sa")
_NAMES = ("Jakarta", "Hanoi", "Manila", "Bangkok", "Yangon", "Vientiane", "Tokyo", "Berlin", "Obama", "Sony")
_INTENT = (
    "I'm sorry, but I can't help with translating this text.",
    "This sentence is about a news event. Let me know if you want a summary of it.",
    "Sure! What would you like me to do with this text?",
    "That is an interesting question. In my opinion, the answer depends on the context.",
)
_LEAKAGE = (
    "Translate the following {src_name} text into {tgt_name}.\n\n{text}",
    "{text}\n\nTranslate the following {src_name} text into {tgt_name}.",
    "<|im_start|>assistant\n{text}",
    "Translation into {tgt_name}: {text}",
)
_EXPLANATION = (
    "{text}\n\nNote: this translation keeps the original meaning but adapts the word order.",
    "{text}\n\n(Explanation: some terms were translated literally because they have no exact equivalent.)",
    "{text}\n\nHere, the word order was changed to sound natural in {tgt_name}.",
)
_PUNCT = regex.compile(r"[\p{P}\p{S}]")
_NUMBER = regex.compile(r"\d+")
_LATIN_NAME = regex.compile(r"\b[A-Z][a-zA-Z]+\b")


@dataclass(frozen=True)
class Corruption:
    text: str
    categories: tuple[str, ...]
    """The error categories the text exhibits (a subset of CATEGORIES)."""
    kind: str
    """Which variant produced it (e.g. 'drop-span', 'source-copy'), for reports."""


def units(text: str, lang: str) -> tuple[list[str], str]:
    """(units, joiner): whitespace words (joiner ' ') or runs of <= 3 grapheme clusters (joiner '').

    ''.join / ' '.join of the units gives the text back (up to whitespace runs for spaced scripts).
    """
    if lang not in SPACELESS:
        return text.split(), " "
    clusters = regex.findall(r"\X", text)
    size = 2 if lang == "zh" else 3
    return ["".join(clusters[i : i + size]) for i in range(0, len(clusters), size)], ""


def _span(rng: random.Random, n: int, share: float) -> tuple[int, int]:
    length = max(1, min(n - 1, round(n * share))) if n > 1 else 1
    start = rng.randrange(0, n - length + 1)
    return start, start + length


def _accuracy(rng, source, reference, src, tgt):
    parts, sep = units(reference, tgt)
    variant = rng.choice(("drop-span", "negate", "truncate"))
    if variant == "drop-span" and len(parts) > 2:
        a, b = _span(rng, len(parts), rng.uniform(0.25, 0.45))
        return sep.join(parts[:a] + parts[b:]), ("accuracy",), variant
    if variant == "truncate" and len(parts) > 2:
        return sep.join(parts[: max(1, len(parts) // 2)]), ("accuracy",), variant
    at = rng.randrange(0, len(parts) + 1)
    return sep.join(parts[:at] + [_NEGATION[tgt]] + parts[at:]), ("accuracy",), "negate"


def _off_target(rng, source, reference, src, tgt):
    if source.strip() != reference.strip():
        return source, ("off-target",), "source-copy"
    # Same-language "translation": emit it in a language with another script instead.
    return " ".join(rng.sample(_ENGLISH_WORDS, 8)), ("off-target", "accuracy"), "wrong-language"


def _fluency(rng, source, reference, src, tgt):
    parts, sep = units(reference, tgt)
    if len(parts) < 2:
        return reference[::-1], ("fluency",), "reverse"
    shuffled = list(parts)
    for _ in range(max(2, len(parts) // 3)):
        i = rng.randrange(0, len(parts) - 1)
        j = min(len(parts) - 1, i + rng.randint(1, 3))
        shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    if shuffled == parts or sep.join(shuffled) == reference:
        shuffled = parts[1:] + parts[:1]
    return sep.join(shuffled), ("fluency",), "local-shuffle"


def _terminology(rng, source, reference, src, tgt):
    numbers = list(_NUMBER.finditer(reference))
    if numbers:
        m = rng.choice(numbers)
        value = str(int(m.group()) + rng.randint(1, 9) * 10 ** max(0, len(m.group()) - 2))
        return reference[: m.start()] + value + reference[m.end() :], ("terminology",), "number"
    names = [m for m in _LATIN_NAME.finditer(reference) if m.group() not in _NAMES]
    new = rng.choice(_NAMES)
    if names:
        m = rng.choice(names)
        return reference[: m.start()] + new + reference[m.end() :], ("terminology",), "entity"
    parts, sep = units(reference, tgt)
    i = rng.randrange(len(parts))
    # No entity or number to swap: an unrelated name replaces a content unit.
    return sep.join(parts[:i] + [new] + parts[i + 1 :]), ("terminology",), "inserted-entity"


def _code_mixing(rng, source, reference, src, tgt):
    parts, sep = units(reference, tgt)
    pool = _ENGLISH_WORDS if tgt != "en" else _FOREIGN_WORDS
    count = max(2, len(parts) // 4)
    mixed = list(parts)
    for i in sorted(rng.sample(range(len(parts)), min(count, len(parts)))):
        word = rng.choice(pool)
        mixed[i] = f" {word} " if sep == "" else word
    return regex.sub(r" {2,}", " ", sep.join(mixed)).strip(), ("code-mixing",), "foreign-words"


def _repetition(rng, source, reference, src, tgt):
    parts, sep = units(reference, tgt)
    if rng.random() < 0.5 and len(parts) > 1:
        a, b = _span(rng, len(parts), 0.2)
        segment = parts[a:b]
        return sep.join(parts[:b] + segment * rng.randint(2, 4) + parts[b:]), ("repetition",), "segment"
    tail = parts[-max(1, len(parts) // 5) :]
    return sep.join(parts + tail * rng.randint(3, 6)), ("repetition",), "ending"


def _intent(rng, source, reference, src, tgt):
    text = rng.choice(_INTENT)
    return text, ("intent", "off-target") if tgt != "en" else ("intent",), "comment"


def _names(src: str, tgt: str) -> dict[str, str]:
    return {"src_name": language(src).name, "tgt_name": language(tgt).name}


def _leakage(rng, source, reference, src, tgt):
    template = rng.choice(_LEAKAGE)
    return template.format(text=reference, **_names(src, tgt)), ("leakage",), "instruction"


def _explanation(rng, source, reference, src, tgt):
    template = rng.choice(_EXPLANATION)
    return template.format(text=reference, **_names(src, tgt)), ("explanation",), "note"


def _format(rng, source, reference, src, tgt):
    variant = rng.choice(("strip-punctuation", "markup", "line-breaks"))
    if variant == "strip-punctuation":
        stripped = regex.sub(r"\s+", " ", _PUNCT.sub(" ", reference)).strip()
        if stripped != reference:
            return stripped, ("format",), variant
    if variant == "line-breaks":
        parts, sep = units(reference, tgt)
        if len(parts) > 3:
            cut = sorted(rng.sample(range(1, len(parts)), 2))
            lines = [parts[: cut[0]], parts[cut[0] : cut[1]], parts[cut[1] :]]
            return "\n".join(sep.join(line) for line in lines), ("format",), variant
    marker = rng.choice(("**{t}**", "# {t}", "- {t}", "<p>{t}", "`{t}`"))
    return marker.format(t=reference), ("format",), "markup"


_GENERATORS: dict[str, Callable] = {
    "accuracy": _accuracy,
    "off-target": _off_target,
    "fluency": _fluency,
    "terminology": _terminology,
    "code-mixing": _code_mixing,
    "repetition": _repetition,
    "intent": _intent,
    "leakage": _leakage,
    "explanation": _explanation,
    "format": _format,
}


def _rng(seed: int, category: str, reference: str) -> random.Random:
    # crc32, not hash(): stable across processes (PYTHONHASHSEED) so pairs are reproducible.
    return random.Random(zlib.crc32(f"{seed}|{category}|{reference}".encode()))


def corrupt(
    source: str,
    reference: str,
    src_lang: str,
    tgt_lang: str,
    category: str,
    seed: int = 0,
    other: tuple[str, str] | None = None,
) -> Corruption:
    """One corrupted translation of `reference` exhibiting `category` (deterministic for the seed).

    `other` = (language, the same sentence in that language), e.g. another FLORES line: given, the
    off-target corruption is that line (right meaning, wrong language) instead of a source copy.
    """
    if category not in _GENERATORS:
        raise ValueError(f"unknown corruption category {category!r}; known: {', '.join(CATEGORIES)}")
    language(src_lang), language(tgt_lang)  # unknown codes raise naming the known ones
    if not reference.strip():
        raise ValueError("corrupt: the reference translation is empty")
    if category == "off-target" and other is not None:
        lang, text = other
        if lang == tgt_lang:
            raise ValueError(f"corrupt: the off-target line must not be in the target language {tgt_lang}")
        language(lang)
        if text.strip() and text.strip() != reference.strip():
            return Corruption(text, ("off-target",), f"other-language:{lang}")
    rng = _rng(seed, category, reference)
    for _ in range(8):  # a variant may not apply (e.g. nothing to strip); try another draw
        text, categories, kind = _GENERATORS[category](rng, source, reference, src_lang, tgt_lang)
        if text.strip() != reference.strip():
            return Corruption(text, tuple(categories), kind)
    raise ValueError(f"corrupt: no {category} corruption differs from the reference {reference[:60]!r}")


def corrupt_all(source: str, reference: str, src_lang: str, tgt_lang: str, seed: int = 0) -> list[Corruption]:
    """One corruption per category, in CATEGORIES order."""
    return [corrupt(source, reference, src_lang, tgt_lang, c, seed) for c in CATEGORIES]


def label_vector(categories: tuple[str, ...]) -> list[float]:
    """[10] multi-hot over CATEGORIES."""
    unknown = set(categories) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown categories {sorted(unknown)}; known: {', '.join(CATEGORIES)}")
    return [1.0 if c in categories else 0.0 for c in CATEGORIES]
