"""tokenizer/trim.py: a vocabulary trimmed to a corpus segments that corpus exactly like the source
tokenizer, decodes every id to the same text, still encodes unseen text, and keeps a prefix's ids."""

from __future__ import annotations

import json
import unicodedata

import pytest
from tokenizers import Tokenizer as HFTokenizer

from vepo_mcore.languages import default_tokenizer_dir, load_flores
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.tokenizer.embedding_rows import new_row_sources
from vepo_mcore.tokenizer.trim import load_source_ids, trim_tokenizer


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    chat = load_tokenizer().apply_chat(
        [{"role": "user", "content": "Translate the following English text into Thai."}],
        add_generation_prompt=True,
    )
    return [chat] + [line for lang in ("en", "th", "vi") for line in load_flores(lang, "dev")[:150]]


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("trim") / "tok"
    return trim_tokenizer(default_tokenizer_dir(), corpus, out)


def test_same_segmentation_and_far_smaller(trimmed, corpus):
    source, small = load_tokenizer(), load_tokenizer(trimmed.path)
    assert len(small) == trimmed.vocab_size < len(source) // 10
    for text in corpus:
        assert [trimmed.source_ids[i] for i in small.encode(text)] == source.encode(text)
    assert load_source_ids(trimmed.path) == trimmed.source_ids
    assert load_source_ids(default_tokenizer_dir()) is None


def test_every_id_decodes_like_the_source(trimmed):
    source, small = load_tokenizer(), load_tokenizer(trimmed.path)
    for new_id, source_id in enumerate(trimmed.source_ids):
        assert small.decode([new_id]) == source.decode([source_id])
    # ChatML specials keep working under their new ids
    assert small.decode([small.im_start_id]) == "<|im_start|>" and small.im_end_id in small.stop_ids


def test_unseen_text_still_round_trips(trimmed):
    small = load_tokenizer(trimmed.path)
    for lang in ("km", "my", "zh", "en"):
        line = load_flores(lang, "devtest")[7]
        assert small.decode(small.encode(line)) == unicodedata.normalize("NFC", line)


def test_prefix_keeps_ids_and_allows_the_resize(tmp_path, trimmed, corpus):
    english = [t for t in corpus if t.isascii()][:50]
    base = trim_tokenizer(default_tokenizer_dir(), english, tmp_path / "base")
    grown = trim_tokenizer(default_tokenizer_dir(), corpus, tmp_path / "grown", prefix=base.path)
    assert grown.prefix_size == base.vocab_size < grown.vocab_size
    assert grown.source_ids[: base.vocab_size] == base.source_ids
    sources = new_row_sources(base.path, grown.path)  # raises if an existing id changed meaning
    assert sorted(sources) == list(range(base.vocab_size, grown.vocab_size))
    # and the grown tokenizer still segments the corpus like the source
    source, small = load_tokenizer(), load_tokenizer(grown.path)
    for text in corpus[:40]:
        assert [grown.source_ids[i] for i in small.encode(text)] == source.encode(text)


def test_transformers_reads_the_trimmed_directory(trimmed, corpus):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(trimmed.path))
    ours = load_tokenizer(trimmed.path)
    for text in corpus[:20]:
        assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    config = json.loads((trimmed.path / "tokenizer_config.json").read_text())
    assert config["added_tokens_decoder"][str(ours.im_end_id)]["content"] == "<|im_end|>"


def test_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match="at least one text"):
        trim_tokenizer(default_tokenizer_dir(), [], tmp_path / "x")
    word_level = json.loads(HFTokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json")).to_str())
    word_level["model"] = {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}
    bad = tmp_path / "wordlevel"
    bad.mkdir()
    (bad / "tokenizer.json").write_text(json.dumps(word_level))
    with pytest.raises(ValueError, match="expected a BPE model"):
        trim_tokenizer(bad, ["a"], tmp_path / "y")
