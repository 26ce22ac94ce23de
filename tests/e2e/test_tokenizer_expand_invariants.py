"""Expanded tokenizer invariants (SPEC section 1) on FLORES-200 devtest, with full en/zh protection.

One expansion is built per module: ms, fil, id with the full 4,000-token budget (they are the ones
whose merges reach English words) and th, my with 300 tokens (scripts with combining marks, non-NFC
Burmese lines). Protection uses the top 60k wordfreq words per language instead of all ~320k to keep
the test near a minute; measured on this configuration, 20k words leave 1 English devtest line changed
and 60k leave none (the tool uses all of them).
"""

from __future__ import annotations

import json
import unicodedata

import pytest
from tokenizers import Tokenizer as HFTokenizer

from vepo_mcore.languages import LANGS, default_tokenizer_dir, flores_path, load_flores
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.tokenizer.expand import MANIFEST, expand_tokenizer, file_sha256
from vepo_mcore.tokenizer.verify import verify_tokenizer_dir

BASE = 151_665
BUDGETS = {"th": 300, "ms": 4000, "my": 300, "fil": 4000, "id": 4000}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def expanded_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("expanded")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOKENIZERS_PARALLELISM", "true")  # protection encodes ~2.6M short texts
        corpora = {lang: [flores_path(lang, "dev")] for lang in BUDGETS}
        expand_tokenizer(default_tokenizer_dir(), corpora, n_tokens=BUDGETS, protect_words=60_000).save(out)
    return out


@pytest.fixture(scope="module")
def base():
    return HFTokenizer.from_file(str(default_tokenizer_dir() / "tokenizer.json"))


@pytest.fixture(scope="module")
def expanded(expanded_dir):
    return HFTokenizer.from_file(str(expanded_dir / "tokenizer.json"))


def _ids(tok, lines):
    return [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_english_chinese_ids_identical(base, expanded, lang):
    lines = load_flores(lang, "devtest")
    changed = [i for i, (a, b) in enumerate(zip(_ids(base, lines), _ids(expanded, lines))) if a != b]
    assert changed == []


@pytest.mark.parametrize("lang", LANGS)
def test_roundtrip_is_nfc(expanded, lang):
    lines = load_flores(lang, "devtest")
    for line, ids in zip(lines, _ids(expanded, lines)):
        assert expanded.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", line)


def test_expansion_compresses_and_manifest(base, expanded, expanded_dir):
    manifest = json.loads((expanded_dir / MANIFEST).read_text())
    next_id = BASE
    for lang in ("th", "ms", "my", "fil", "id"):  # EXPANDED_LANGS order: ids are contiguous per language
        entry = manifest["languages"][lang]
        assert entry["first_id"] == next_id and 0 < entry["count"] <= BUDGETS[lang]
        assert entry["sources"][0]["sha256"] == file_sha256(flores_path(lang, "dev"))
        next_id += entry["count"]
        lines = load_flores(lang, "devtest")
        base_n = sum(map(len, _ids(base, lines)))
        new_n = sum(map(len, _ids(expanded, lines)))
        assert new_n < base_n * (0.9 if lang in ("ms", "fil", "id") else 0.7), lang
    assert manifest["vocab_size"] == next_id == expanded.get_vocab_size()
    for lang in ("th", "my"):
        assert manifest["languages"][lang]["count"] == BUDGETS[lang]


def test_special_tokens_keep_ids(base, expanded):
    base_decoder = base.get_added_tokens_decoder()
    decoder = expanded.get_added_tokens_decoder()
    assert sorted(decoder) == list(range(151_643, BASE))
    for token_id, added in base_decoder.items():
        assert expanded.token_to_id(added.content) == token_id
        assert decoder[token_id].special == added.special == (token_id < 151_657)
    text = "<|im_start|>user\nสวัสดี<|im_end|>\n<tool_call><|endoftext|>"
    ids = expanded.encode(text, add_special_tokens=False).ids
    assert ids[0] == 151_644 and 151_645 in ids and 151_657 in ids and ids[-1] == 151_643


def test_transformers_autotokenizer_matches(expanded, expanded_dir):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(expanded_dir))
    assert len(auto) == expanded.get_vocab_size()
    assert auto.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        151_643,
        151_644,
        151_645,
    ]
    assert auto.eos_token == "<|im_end|>" and auto.pad_token == "<|endoftext|>"
    assert auto.added_tokens_decoder[151_657].special is False
    for lang in LANGS:  # the mark-aware pre-tokenizer must survive loading (th/my would differ otherwise)
        lines = load_flores(lang, "devtest")[:50]
        assert [auto.encode(x, add_special_tokens=False) for x in lines] == _ids(expanded, lines)
    messages = [{"role": "system", "content": "Translate."}, {"role": "user", "content": "สวัสดี"}]
    wrapper = load_tokenizer(expanded_dir)
    assert auto.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == wrapper.apply_chat(messages, add_generation_prompt=True)


def test_project_wrapper_loads_unchanged(expanded_dir):
    """Item 6: the CPT tools load the expanded directory through load_tokenizer with no other change."""
    tok = load_tokenizer(expanded_dir)
    manifest = json.loads((expanded_dir / MANIFEST).read_text())
    assert tok.vocab_size == BASE + sum(entry["count"] for entry in manifest["languages"].values())
    assert (tok.eod_id, tok.im_start_id, tok.im_end_id) == (151_643, 151_644, 151_645)
    assert max(tok.encode(load_flores("my", "devtest")[0])) >= BASE
    report = verify_tokenizer_dir(expanded_dir, langs=("en", "th", "my"))  # all 10 are covered above
    assert report["new_tokens"] == tok.vocab_size - BASE
    assert sum(report["invariants"]["roundtrip_failures"].values()) == 0
