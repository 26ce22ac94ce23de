"""The corruption generator: every category for every target language yields a labelled text that
differs from the reference, deterministically for a seed, and shows the error it claims."""

from __future__ import annotations

import pytest
import regex

from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.corruptions import (
    _ENGLISH_WORDS,
    _FOREIGN_WORDS,
    _NEGATION,
    CATEGORIES,
    SPACELESS,
    corrupt,
    corrupt_all,
    label_vector,
    units,
)

LINES = (0, 7, 33, 120, 500)


def _case(tgt: str, line: int) -> tuple[str, str, str]:
    src = "en" if tgt != "en" else "zh"
    return load_flores(src, "dev")[line], load_flores(tgt, "dev")[line], src


@pytest.mark.parametrize("tgt", LANGS)
def test_every_category_differs_labelled_and_deterministic(tgt):
    for line in LINES:
        source, reference, src = _case(tgt, line)
        first = corrupt_all(source, reference, src, tgt, seed=line)
        again = corrupt_all(source, reference, src, tgt, seed=line)
        assert first == again
        for category, c in zip(CATEGORIES, first):
            assert c.text.strip() and c.text.strip() != reference.strip(), (tgt, category)
            assert category in c.categories and set(c.categories) <= set(CATEGORIES), c
            assert label_vector(c.categories)[CATEGORIES.index(category)] == 1.0
        # Seeds matter: across seeds some category draws another variant or position.
        other = corrupt_all(source, reference, src, tgt, seed=line + 1)
        assert [c.text for c in other] != [c.text for c in first]


@pytest.mark.parametrize("tgt", LANGS)
def test_each_category_shows_its_error(tgt):
    norm = lambda s: regex.sub(r"\s+", "", s)  # noqa: E731
    for line in LINES:
        source, reference, src = _case(tgt, line)
        for seed in range(3):
            c = {cat: corrupt(source, reference, src, tgt, cat, seed) for cat in CATEGORIES}
            acc = c["accuracy"].text
            assert len(norm(acc)) < len(norm(reference)) or _NEGATION[tgt] in acc
            assert c["off-target"].text == source
            # Shuffles move units around: the same characters, in another order.
            assert sorted(norm(c["fluency"].text)) == sorted(norm(reference))
            assert norm(c["fluency"].text) != norm(reference)
            pool = _ENGLISH_WORDS if tgt != "en" else _FOREIGN_WORDS
            assert any(w in c["code-mixing"].text.split() for w in pool)
            rep = c["repetition"].text
            assert len(rep) > len(reference) and sorted(set(norm(rep))) == sorted(set(norm(reference)))
            assert c["intent"].categories == (("intent", "off-target") if tgt != "en" else ("intent",))
            assert reference in c["leakage"].text and (
                "Translate the following" in c["leakage"].text or "Translation into" in c["leakage"].text
                or "<|im_start|>" in c["leakage"].text
            )  # fmt: skip
            assert (
                c["explanation"].text.startswith(reference)
                and len(c["explanation"].text) > len(reference) + 20
            )
            fmt = c["format"].text
            assert "\n" in fmt or norm(fmt) != norm(reference)
            term = c["terminology"].text
            assert regex.findall(r"\d+|[A-Z][a-zA-Z]+", term) != regex.findall(
                r"\d+|[A-Z][a-zA-Z]+", reference
            )


@pytest.mark.parametrize("lang", sorted(SPACELESS))
def test_spaceless_units_are_whole_grapheme_clusters(lang):
    text = load_flores(lang, "dev")[3]
    parts, sep = units(text, lang)
    assert sep == "" and "".join(parts) == text and len(parts) > 5
    boundaries, at = set(), 0
    for cluster in regex.findall(r"\X", text):
        at += len(cluster)
        boundaries.add(at)
    at = 0
    for part in parts:  # a unit never ends inside a cluster (a Thai vowel sign stays with its consonant)
        at += len(part)
        assert at in boundaries


def test_errors_name_the_known_values():
    with pytest.raises(ValueError, match="known: accuracy, off-target"):
        corrupt("a", "b c", "en", "th", "grammar")
    with pytest.raises(ValueError, match="unknown language"):
        corrupt("a", "b c", "en", "xx", "fluency")
    with pytest.raises(ValueError, match="empty"):
        corrupt("a", "  ", "en", "th", "fluency")
    with pytest.raises(ValueError, match="must not be in the target language th"):
        corrupt("a", "b c", "en", "th", "off-target", other=("th", "d e"))
    with pytest.raises(ValueError, match="unknown language"):
        corrupt("a", "b c", "en", "th", "off-target", other=("xx", "d e"))
    with pytest.raises(ValueError, match="unknown categories"):
        label_vector(("fluency", "style"))
