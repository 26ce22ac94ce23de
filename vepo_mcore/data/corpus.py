"""A small CPT corpus from the shipped FLORES-200 dev text: one indexed dataset per language.

    paths = build_flores_cpt_corpus("data/cpt_tiny")   # {"en": "data/cpt_tiny/cpt_en_text_document", ...}

For the quickstart and tests only: 997 dev sentences per language, grouped into documents of a
few consecutive sentences (FLORES sentences come from paragraphs, so neighbours belong
together). devtest is never used: it is the evaluation set.
"""

from __future__ import annotations

import json
from pathlib import Path

from vepo_mcore.data.indexed import dataset_prefix
from vepo_mcore.data.preprocess import preprocess
from vepo_mcore.languages import LANGS, language, load_flores


def flores_documents(lang: str, sentences_per_doc: int = 4, split: str = "dev") -> list[str]:
    """FLORES sentences of `lang` joined `sentences_per_doc` at a time (separator: a space, none for zh)."""
    if sentences_per_doc < 1:
        raise ValueError(f"sentences_per_doc must be >= 1, got {sentences_per_doc}")
    if split != "dev":
        raise ValueError(
            f"the CPT corpus is built from FLORES dev only (devtest is for evaluation), got {split!r}"
        )
    sentences = load_flores(lang, split)
    joiner = "" if language(lang).script == "Han" else " "
    return [
        joiner.join(sentences[i : i + sentences_per_doc]) for i in range(0, len(sentences), sentences_per_doc)
    ]


def build_flores_cpt_corpus(
    out_dir: str | Path,
    langs: tuple[str, ...] | list[str] = LANGS,
    *,
    sentences_per_doc: int = 4,
    tokenizer_dir: str | Path | None = None,
    workers: int = 1,
    progress: bool = False,
    extra_documents: dict[str, list[str]] | None = None,
) -> dict[str, str]:
    """Write `<out_dir>/cpt_<lang>.jsonl` and its indexed dataset per language; returns lang -> prefix.
    extra_documents: more documents per language, written after FLORES's (other openly licensed text)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for lang in langs:
        language(lang)  # unknown codes fail here with the list of known ones
        jsonl = out / f"cpt_{lang}.jsonl"
        with jsonl.open("w", encoding="utf-8") as f:
            for doc in flores_documents(lang, sentences_per_doc) + (extra_documents or {}).get(lang, []):
                f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
        prefix = dataset_prefix(out / "cpt", lang)
        preprocess([jsonl], prefix, tokenizer_dir=tokenizer_dir, workers=workers, progress=progress)
        paths[lang] = prefix
    return paths
