"""Robustness: arbitrary text in, finite rewards out, never an exception."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS
from vepo_mcore.rewards.constraints import constraint_table
from vepo_mcore.rewards.format import broken_syntax, structure
from vepo_mcore.rewards.rlvr import rlvr_reward
from vepo_mcore.translation.sample import Sample

MARKUP = st.sampled_from(
    [
        "<b>",
        "</b>",
        "<i",
        "</>",
        "<a href='x'>",
        "```",
        "`",
        "**",
        "*",
        "# ",
        "\n1. ",
        "\n3. ",
        "- ",
        "[x](",
        "](y)",
        "{0}",
        "{{",
        "}}",
        "%s",
        "%(",
        "${v}",
        "http://",
        "https://a.b/c?d=<e>",
        "a@b.c",
        "<br/>",
        "<<>>",
        "\x00",
        "\r\n",
    ]
)
SCRIPTS = st.sampled_from(
    [
        "hello world ",
        "สวัสดี ",
        "你好世界",
        "ສະບາຍດີ ",
        "ជំរាបសួរ ",
        "မင်္ဂလာပါ ",
        "xin chào ",
        "こんにちは",
        "Привет ",
    ]
)
TEXT = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(MARKUP, SCRIPTS, st.text(max_size=5)), max_size=30).map("".join),
    st.sampled_from(["", " ", "\n\t \u3000\u200b", "\x00\x00", "\ufeff", "\U0001f600" * 10]),
)


def _score(source: str, response: str, src: str, tgt: str, mt: str) -> list[Sample]:
    samples = [
        Sample(source=source, response=response, reference=source, src_lang=src, tgt_lang=tgt),
        Sample(source=response, response=source, reference=response, src_lang=tgt, tgt_lang=src),
    ]
    rewards = rlvr_reward(samples, RewardsConfig(mt=mt))
    assert all(math.isfinite(r) for r in rewards)
    for sample in samples:
        assert all(math.isfinite(v) for v in sample.reward_terms.values()), sample.reward_terms
        assert set(sample.passed) == {"lang", "length", "format", "mixing"}
    return samples


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT, TEXT, st.sampled_from(LANGS), st.sampled_from(LANGS), st.sampled_from(["chrf", "bleu"]))
def test_arbitrary_text_gives_finite_rewards(source, response, src, tgt, mt):
    _score(source, response, src, tgt, mt)
    structure(response)
    assert broken_syntax(response) >= 0


def test_huge_outputs():
    huge = ("สวัสดีครับ <b>ok</b> " * 6000)[:100_000]
    samples = _score("Hello <b>world</b>", huge, "en", "th", "chrf")
    assert not samples[0].passed["length"]
    table = constraint_table(samples)
    assert table["overall"]["n"] == 2


def test_only_whitespace_and_empty():
    for response in ["", "   ", "\n\n\t", "\u200b\u3000"]:
        samples = _score("Hello there, friend.", response, "en", "vi", "chrf")
        assert not samples[0].passed["lang"] and not samples[0].passed["length"]


def test_adversarial_markup_stays_cheap():
    # Each would be quadratic (minutes) with unbounded backtracking; linear patterns take well under a second at 30k characters.
    for text in [
        "<a" + " " * 30_000,
        "[x](y" * 6_000,
        "a" * 30_000,
        "**a " * 8_000,
        "*a" * 15_000,
        "1. a\n" * 6_000,
    ]:
        samples = _score("Hello <b>world</b> [x](y)", text, "en", "th", "chrf")
        assert math.isfinite(samples[0].reward)
