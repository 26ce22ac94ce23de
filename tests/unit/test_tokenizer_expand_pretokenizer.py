"""Stock vs mark-aware pre-tokenizer regexes on the shipped Qwen2.5 tokenizer and FLORES."""

from __future__ import annotations

import pytest

from vepo_mcore.languages import default_tokenizer_dir, load_flores
from vepo_mcore.tokenizer.expand import build_tokenizer, read_tokenizer_json
from vepo_mcore.tokenizer.pretokenizer import (
    MARK_AWARE_REGEX,
    STOCK_REGEX,
    get_pretokenizer_name,
    pretokenizer_regex,
    set_pretokenizer,
)


@pytest.fixture(scope="module")
def pretokenizers():
    return {
        name: build_tokenizer(
            set_pretokenizer(read_tokenizer_json(default_tokenizer_dir()), name)
        ).pre_tokenizer
        for name in ("stock", "mark_aware")
    }


def test_stock_regex_is_the_shipped_one():
    data = read_tokenizer_json(default_tokenizer_dir())
    assert data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == STOCK_REGEX
    assert get_pretokenizer_name(data) == "stock"
    assert get_pretokenizer_name(set_pretokenizer(data, "mark_aware")) == "mark_aware"
    assert MARK_AWARE_REGEX != STOCK_REGEX


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="mark_aware"):
        pretokenizer_regex("nope")


def test_mark_aware_keeps_thai_words_whole(pretokenizers):
    text = "สวัสดีครับ Hello"  # Thai vowel signs (Mn) inside the word
    stock = [p for p, _ in pretokenizers["stock"].pre_tokenize_str(text)]
    marked = [p for p, _ in pretokenizers["mark_aware"].pre_tokenize_str(text)]
    assert len(stock) > 3  # the stock regex cuts at every vowel sign
    assert len(marked) == 2 and marked[1] == "ĠHello"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_english_chinese_pretokens_unchanged(pretokenizers, lang):
    for line in load_flores(lang, "devtest") + load_flores(lang, "dev"):
        assert pretokenizers["stock"].pre_tokenize_str(line) == pretokenizers["mark_aware"].pre_tokenize_str(
            line
        )
