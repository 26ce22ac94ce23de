"""r_mix: foreign-script share (non-Latin targets) and foreign-word share (Latin targets)."""

import pytest

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.mixing import (
    foreign_word_share,
    is_foreign_word,
    mixing_reward,
    mixing_share,
    mixing_term,
)
from vepo_mcore.rewards.scripts import foreign_script_share
from vepo_mcore.translation.sample import Sample


def test_script_share_against_a_hand_count():
    # Thai letters: ส ว ส ด (4; the vowel marks are not letters); Latin lowercase letters: h e l l o (5).
    share, letters = foreign_script_share("สวัสดี hello 123 !", "th")
    assert letters == 9 and share == pytest.approx(5 / 9)
    # Capitalised Latin words are names: neutral, like digits and punctuation.
    assert foreign_script_share("สวัสดี NASA WiFi", "th") == (0.0, 4)
    assert foreign_script_share("", "zh") == (0.0, 0)
    assert foreign_script_share("你好 こんにちは", "zh")[0] == pytest.approx(5 / 7)


def test_foreign_words_for_latin_targets():
    assert is_foreign_word("the", "id") and is_foreign_word("and", "vi") and is_foreign_word("yang", "en")
    assert is_foreign_word("mga", "en") and is_foreign_word("của", "fil")
    assert not is_foreign_word("dan", "ms") and not is_foreign_word("yang", "id")  # ms/id are one group
    assert not is_foreign_word("bank", "ms")  # shared loanword
    # "Saya suka the book and the movie": 7 words; foreign: the, and, the. "Saya" is capitalised, and
    # "book"/"movie" are common enough in Malay web text (wordfreq) to be within one Zipf unit of English.
    assert foreign_word_share("Saya suka the book and the movie", "ms") == pytest.approx(3 / 7)
    assert foreign_word_share("Saya suka buku dan filem itu", "ms") == 0.0


@pytest.mark.parametrize("code", LANGS)
def test_references_are_not_code_mixed(code):
    lines = load_flores(code)[:400]
    shares = [mixing_share(line, code) for line in lines]
    assert sum(p <= 0.15 for p in shares) / len(lines) >= 0.98


@pytest.mark.parametrize("code", LANGS)
def test_english_words_mixed_in_are_caught(code):
    other = load_flores("id" if code == "en" else "en")[:100]
    refs = load_flores(code)[:100]
    mixed = []
    for ref, foreign in zip(refs, other):
        words = [w.lower() for w in foreign.split() if len(w) > 2]
        if code in ("zh", "th", "km", "lo", "my"):
            mixed.append(
                ref[: len(ref) // 2] + " " + " ".join(words[: len(words) // 2]) + " " + ref[len(ref) // 2 :]
            )
        else:
            tokens = ref.split()
            for i in range(0, len(tokens), 3):  # every third word replaced
                tokens[i] = words[i % len(words)]
            mixed.append(" ".join(tokens))
    result = mixing_reward([Sample(response=m, tgt_lang=code) for m in mixed], RewardsConfig())
    assert sum(not p for p in result.passed) / len(mixed) >= 0.7


def test_mixing_term_formula():
    assert mixing_term(0.15) == 0.0 and mixing_term(0.0) == 0.0
    assert mixing_term(0.35) == pytest.approx(-5.0 * 0.2)
    assert mixing_term(1.0, threshold=0.1, zeta=2.0) == pytest.approx(-1.8)
