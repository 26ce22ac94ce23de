"""Invariant checks for an expanded tokenizer (SPEC section 1), usable by tests and the CPT tools.

    verify_tokenizer_dir("out/qwen2.5-expanded")   # raises ValueError naming what broke

Checks, on FLORES-200 devtest (never a training source):
- English and Chinese encode to exactly the base tokenizer's ids;
- decode(encode(x)) == NFC(x) for every line of all 10 languages (the normalizer is NFC, and 49
  Burmese lines are not NFC, so the raw text cannot come back for the base tokenizer either);
- the 22 added tokens keep ids 151643-151664 and their special flags (151657-151664 not special);
- through the project wrapper (load_tokenizer): vocab_size = 151,665 + new tokens of the manifest.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from vepo_mcore.languages import LANGS, default_tokenizer_dir, load_flores
from vepo_mcore.tokenizer.expand import BASE_VOCAB_SIZE, MANIFEST, PROTECTED_LANGS, read_tokenizer_json
from vepo_mcore.tokenizer.tokenizer import Tokenizer


def encode_lines(tokenizer: HFTokenizer, lines: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch(list(lines), add_special_tokens=False)]


def added_token_errors(base_json: dict, tokenizer: HFTokenizer) -> list[str]:
    """Added tokens of the base tokenizer.json whose id or special flag changed."""
    errors = []
    decoder = tokenizer.get_added_tokens_decoder()
    for added in base_json.get("added_tokens", []):
        token_id, content = added["id"], added["content"]
        if tokenizer.token_to_id(content) != token_id:
            errors.append(f"{content} moved from id {token_id} to {tokenizer.token_to_id(content)}")
        elif token_id not in decoder or decoder[token_id].special != added["special"]:
            errors.append(
                f"{content} (id {token_id}) lost its added-token entry or special={added['special']}"
            )
        elif tokenizer.encode(content, add_special_tokens=False).ids != [token_id]:
            errors.append(f"{content} does not encode to [{token_id}]")
    return errors


def check_invariants(
    base: HFTokenizer,
    expanded: HFTokenizer,
    base_json: dict,
    langs: Sequence[str] = LANGS,
    protected: Sequence[str] = PROTECTED_LANGS,
    split: str = "devtest",
) -> dict:
    """Counts of broken invariants per language; all zero / empty when the expansion is sound."""
    changed, roundtrip = {}, {}
    for lang in langs:
        lines = load_flores(lang, split)
        ids = encode_lines(expanded, lines)
        roundtrip[lang] = sum(
            expanded.decode(x, skip_special_tokens=False) != unicodedata.normalize("NFC", line)
            for x, line in zip(ids, lines)
        )
        if lang in protected:
            changed[lang] = sum(a != b for a, b in zip(encode_lines(base, lines), ids))
    return {
        "split": split,
        "protected_lines_changed": changed,
        "roundtrip_failures": roundtrip,
        "added_token_errors": added_token_errors(base_json, expanded),
    }


def invariant_errors(report: dict) -> list[str]:
    errors = [
        f"{n} {lang} lines encode differently" for lang, n in report["protected_lines_changed"].items() if n
    ]
    errors += [
        f"{n} {lang} lines fail decode(encode(x)) == NFC(x)"
        for lang, n in report["roundtrip_failures"].items()
        if n
    ]
    return errors + report["added_token_errors"]


def verify_tokenizer_dir(
    path: str | Path, base_dir: str | Path | None = None, langs: Sequence[str] = LANGS
) -> dict:
    """Load an expanded tokenizer through the project wrapper and check every invariant.

    Returns {"vocab_size", "new_tokens", "invariants"}; raises ValueError listing what broke.
    """
    path = Path(path)
    base_dir = Path(base_dir) if base_dir is not None else default_tokenizer_dir()
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise FileNotFoundError(f"{path} has no {MANIFEST}; is it an expanded tokenizer directory?")
    manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    new_tokens = sum(lang["count"] for lang in manifest["languages"].values())
    wrapper = Tokenizer(path)  # not the cached load_tokenizer: the directory may be rewritten between calls
    errors = []
    if wrapper.vocab_size != BASE_VOCAB_SIZE + new_tokens or manifest["vocab_size"] != wrapper.vocab_size:
        errors.append(
            f"vocab_size {wrapper.vocab_size}, manifest says {manifest['vocab_size']}, "
            f"expected {BASE_VOCAB_SIZE} + {new_tokens} new tokens"
        )
    base_json = read_tokenizer_json(base_dir)
    base = HFTokenizer.from_file(str(base_dir / "tokenizer.json"))
    report = check_invariants(base, wrapper.backend, base_json, langs)
    errors += invariant_errors(report)
    for lang in langs:
        line = load_flores(lang, "devtest")[0]
        if wrapper.decode(wrapper.encode(line)) != unicodedata.normalize("NFC", line):
            errors.append(f"wrapper round trip fails on the first {lang} devtest line")
    if errors:
        raise ValueError(f"expanded tokenizer {path} breaks invariants: " + "; ".join(errors))
    return {"vocab_size": wrapper.vocab_size, "new_tokens": new_tokens, "invariants": report}
