"""Unicode-script counting shared by the LID script check and the code-mixing term.

Only letters (Unicode category L) are counted: digits, punctuation, spaces and combining marks
are neutral, so "COVID-19" in a Thai sentence weighs its five Latin letters and nothing else.
"""

from __future__ import annotations

import functools

import regex

from vepo_mcore.languages import language

_LETTER = regex.compile(r"\p{L}")
_NAME = regex.compile(r"(?<![\p{L}\p{M}])\p{Lu}[\p{L}\p{M}'’]*")
_KANA = regex.compile(r"[\p{Script=Hiragana}\p{Script=Katakana}]")


@functools.cache
def _script_pattern(script: str) -> regex.Pattern:
    # Letters of the script only: Thai/Khmer/Myanmar vowel signs are marks (category M), not letters.
    return regex.compile(rf"[\p{{L}}&&\p{{Script={script}}}]", regex.V1)


def letter_count(text: str) -> int:
    """Number of Unicode letters in ``text``."""
    return len(_LETTER.findall(text))


def script_letter_count(text: str, script: str) -> int:
    """Number of letters of one Unicode script (Latin, Han, Thai, Khmer, Lao, Myanmar, ...)."""
    return len(_script_pattern(script).findall(text))


def foreign_script_share(text: str, tgt_lang: str, names_neutral: bool = True) -> tuple[float, int]:
    """(share of letters not in the target language's script, letter count); (0.0, 0) without letters.

    With ``names_neutral``, capitalised words (names and acronyms such as "Dalhousie University",
    "WiFi", "ADT", which references in Thai, Lao, Khmer, Burmese and Chinese keep in Latin) are
    neutral like digits: they are removed before counting.
    """
    if names_neutral:
        text = _NAME.sub("", text)
    letters = letter_count(text)
    if letters == 0:
        return 0.0, 0
    native = script_letter_count(text, language(tgt_lang).script)
    return (letters - native) / letters, letters


def has_kana(text: str) -> bool:
    """True if ``text`` holds any Hiragana/Katakana (then it cannot be plain Chinese)."""
    return _KANA.search(text) is not None
