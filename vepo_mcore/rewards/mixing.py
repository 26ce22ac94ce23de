"""Code-mixing reward r_mix (SPEC section 5).

p_mix = share of letters whose Unicode script is not the target's (digits, punctuation and marks
are neutral). For Latin-script targets (en, ms, id, fil, vi) the foreign-word share counts too,
and p_mix is the larger of the two: a word is foreign when it is much more frequent in another of
the project's Latin-script languages than in the target (wordfreq lexicons: Zipf difference >=
FOREIGN_MARGIN and Zipf >= MIN_FOREIGN_ZIPF in the other language). ms and id count as one
language here; capitalised words (names, sentence starts) and one-letter words are never foreign,
and capitalised Latin words in non-Latin text (names and acronyms the references keep in Latin:
"Dalhousie University", "WiFi") are neutral too. Markup, code, URLs and placeholders are removed
first (format.plain_text). r_mix = 0 if p_mix <= threshold else -zeta_mix * (p_mix - threshold).

Why wordfreq and not a lexicon of FLORES dev: 997 lines give too small a vocabulary to tell a rare
target word from a foreign one, while wordfreq's web/subtitle lists (shipped in the wheel) rank
words by frequency per language. Margin 1.0 keeps >= 99.8% of FLORES references under the 0.15
threshold and flags 73-94% of references with every third word replaced by English (Indonesian for en).
"""

from __future__ import annotations

import functools
import math
import unicodedata

import regex

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import language
from vepo_mcore.rewards.format import plain_text
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.rewards.scripts import foreign_script_share
from vepo_mcore.translation.sample import Sample

# Imported where used: wordfreq (~0.25 s: langcodes, ftfy, msgpack; only the Latin-script lexicons need it,
# and the reward registry stays cheap to import).

LATIN_GROUPS: tuple[tuple[str, ...], ...] = (("en",), ("ms", "id"), ("fil",), ("vi",))
"""Latin-script languages, with the ms/id pair as one group."""
FOREIGN_MARGIN = 1.0
"""Zipf units by which another language must out-score the target for a word to be foreign."""
MIN_FOREIGN_ZIPF = 4.0
"""A foreign word must be at least this common in the other language (Zipf; 4 = 10 per million)."""
ZIPF_FLOOR = 2.5
"""Zipf assumed for a word missing from a lexicon (wordfreq's small lists stop near Zipf 3)."""
_WORD = regex.compile(r"\p{Script=Latin}[\p{Script=Latin}\p{M}'’]*")


@functools.cache
def _zipf_table(code: str) -> dict[str, float]:
    import wordfreq

    return {
        word: math.log10(freq * 1e9)
        for word, freq in wordfreq.get_frequency_dict(code, wordlist="best").items()
        if freq > 0
    }


def _group_of(tgt_lang: str) -> tuple[str, ...]:
    for group in LATIN_GROUPS:
        if tgt_lang in group:
            return group
    raise ValueError(f"{tgt_lang!r} is not a Latin-script language; known: {[g for g in LATIN_GROUPS]}")


def _zipf(word: str, group: tuple[str, ...]) -> float:
    return max(_zipf_table(code).get(word, ZIPF_FLOOR) for code in group)


@functools.lru_cache(maxsize=200_000)
def is_foreign_word(word: str, tgt_lang: str) -> bool:
    """True if lower-case ``word`` belongs to another Latin-script language than ``tgt_lang``."""
    group = _group_of(tgt_lang)
    own = _zipf(word, group)
    other = max(_zipf(word, g) for g in LATIN_GROUPS if g != group)
    return other >= MIN_FOREIGN_ZIPF and other - own >= FOREIGN_MARGIN


def foreign_word_share(text: str, tgt_lang: str) -> float:
    """Share of Latin-script words (2+ letters) identified as another language; 0 without words."""
    words = [w for w in _WORD.findall(unicodedata.normalize("NFC", text)) if len(w) >= 2]
    if not words:
        return 0.0
    foreign = sum(1 for w in words if not w[0].isupper() and is_foreign_word(w.lower(), tgt_lang))
    return foreign / len(words)


def mixing_share(text: str, tgt_lang: str) -> float:
    """p_mix of one output (see module docstring); markup, code and URLs are not counted."""
    text = plain_text(text)
    share, _letters = foreign_script_share(text, tgt_lang)
    if language(tgt_lang).script == "Latin":
        share = max(share, foreign_word_share(text, tgt_lang))
    return share


def mixing_term(p_mix: float, threshold: float = 0.15, zeta: float = 5.0) -> float:
    return 0.0 if p_mix <= threshold else -zeta * (p_mix - threshold)


@register_reward("mixing", constraint="mixing")
def mixing_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """r_mix per sample; raw = p_mix; passed = p_mix <= cfg.mix_threshold."""
    cfg = cfg or RewardsConfig()
    shares = [mixing_share(s.response, s.tgt_lang) for s in samples]
    return TermResult(
        values=[mixing_term(p, cfg.mix_threshold, cfg.zeta_mix) for p in shares],
        raw=shares,
        passed=[p <= cfg.mix_threshold for p in shares],
    )
