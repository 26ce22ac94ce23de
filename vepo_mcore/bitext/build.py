"""Build English <-> X parallel text from the packages of bitext/sources.py, with a manifest.

    manifest = build_parallel_corpus(BitextPlan(langs=["th", "vi", "id"], cache=..., out=Path("data/bitext")))

For each language: every source's aligned pairs, cleaned (markup and access keys out, placeables,
names and numbers kept), filtered by the project's own reward checks (the length ratio rho of
rewards/length.py, the code-mixing share of rewards/mixing.py, which is the share of letters
outside the target's script and, for Latin-script targets, of foreign words), de-duplicated on the
English side (the first source in plan.sources wins), capped per source and in single words;
then `heldout` pairs of >= 4 English words are set aside as an in-domain test set. Writes
OUT/<lang>/{train,heldout}.jsonl ({"en", "text", "source"} per line) and OUT/data.json:

    {"sources": [{"source", "package", "version", "license", "format", "pairs": {lang: n}}],
     "pairs_total": {lang: n}, "heldout": {lang: n}, "dropped": {lang: {reason: n}}}

No FLORES devtest sentence is ever kept (an exact English match is dropped), and nothing here is
committed to git: several sources are share-alike, so every machine rebuilds it from the packages.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from vepo_mcore.bitext.debs import Deb, fetch_debs
from vepo_mcore.bitext.formats import clean_text
from vepo_mcore.bitext.sources import SOURCES, Pair, Source, source
from vepo_mcore.languages import EXPANDED_LANGS, language, load_flores
from vepo_mcore.rewards.length import length_ratio
from vepo_mcore.rewards.mixing import mixing_share


@dataclass(kw_only=True)
class BitextPlan:
    """What build_parallel_corpus builds."""

    langs: list[str]
    """Target languages (project codes); English is always the other side."""
    cache: Path
    """Folder of the fetched .deb files (reused; outside git)."""
    out: Path
    sources: list[str] = field(default_factory=lambda: ["libreoffice-help", "firefox", "libreoffice-ui",
                                                        "gettext", "cldr"])  # fmt: skip
    """Source families in priority order: an English string kept from one is dropped from the later ones."""
    heldout: int = 500
    """In-domain test pairs per language (English of >= 4 words), never in train.jsonl."""
    length_band: tuple[float, float] = (0.4, 2.5)
    """Kept: the normalised length ratio rho (rewards/length.py) inside this band."""
    max_mixing: float = 0.3
    """Kept: the code-mixing share of the target (rewards/mixing.py) at most this."""
    max_per_source: int = 25_000
    """At most this many pairs per source family and language."""
    single_word_share: float = 0.2
    """At most this share of a language's kept pairs may be single English words."""
    seed: int = 0

    def __post_init__(self) -> None:
        for lang in self.langs:
            if lang == "en" or language(lang).code not in (*EXPANDED_LANGS, "zh"):
                raise ValueError(
                    f"bitext langs: {lang!r} is not a target language; known: {EXPANDED_LANGS + ('zh',)}"
                )
        for name in self.sources:
            source(name)
        low, high = self.length_band
        if not 0 < low < high:
            raise ValueError(f"bitext length_band {self.length_band}: expected 0 < low < high")


def drop_reason(english: str, target: str, lang: str, plan: BitextPlan) -> str | None:
    """Why a cleaned pair is not kept (None: kept)."""
    if not english or not target:
        return "empty"
    if english.casefold() == target.casefold():
        return "identical"
    if sum(ch.isalpha() for ch in english) < 2:
        return "no_letters"
    low, high = plan.length_band
    if not low <= length_ratio(english, target, "en", lang) <= high:
        return "length"
    if mixing_share(target, lang) > plan.max_mixing:
        return "mixing"
    return None


def _package_of(src: Source, lang: str, key: str) -> str:
    if src.package:
        return src.package.format(locale=src.locales[lang])
    return src.shared[0] if len(src.shared) == 1 else key.split(":", 1)[0]


def _kept(
    pairs: list[Pair], lang: str, plan: BitextPlan, seen: set[str], devtest: set[str], dropped: Counter
) -> list[Pair]:
    """Cleaned pairs of one source that pass drop_reason, are not FLORES devtest English (`devtest`,
    casefolded) and whose English is not in `seen` (updated); capped at plan.max_per_source."""
    out = []
    for english, target, key in pairs:
        english, target = clean_text(english), clean_text(target)
        reason = drop_reason(english, target, lang, plan)
        folded = english.casefold()
        if reason is None and folded in devtest:
            reason = "flores_devtest"
        if reason is None and folded in seen:
            reason = "duplicate"
        if reason:
            dropped[reason] += 1
            continue
        seen.add(folded)
        out.append((english, target, key))
    rng = random.Random(f"{plan.seed}-{lang}-{len(out)}")
    if len(out) > plan.max_per_source:
        dropped["source_cap"] += len(out) - plan.max_per_source
        out = rng.sample(out, plan.max_per_source)
    return out


def _cap_single_words(rows: list[dict], plan: BitextPlan, rng: random.Random, dropped: Counter) -> list[dict]:
    single = [r for r in rows if len(r["en"].split()) == 1]
    allowed = int(plan.single_word_share * (len(rows) - len(single)) / (1 - plan.single_word_share))
    if len(single) <= allowed:
        return rows
    keep = {id(r) for r in rng.sample(single, allowed)}
    dropped["single_word_cap"] += len(single) - allowed
    return [r for r in rows if len(r["en"].split()) > 1 or id(r) in keep]


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def build_parallel_corpus(plan: BitextPlan, log=print) -> dict:
    """Fetch, extract, filter and split; returns the manifest (also written to OUT/data.json)."""
    wanted = sorted({p for name in plan.sources for lang in plan.langs for p in SOURCES[name].packages(lang)})
    debs: dict[str, Deb] = fetch_debs(wanted, plan.cache)
    kept_per_package: dict[str, Counter] = {p: Counter() for p in wanted}
    manifest: dict = {"sources": [], "pairs_total": {}, "heldout": {}, "dropped": {}}
    devtest = {sentence.casefold() for sentence in load_flores("en", "devtest")}
    for lang in plan.langs:
        rows, seen, dropped = [], set(), Counter()
        for name in plan.sources:
            src = SOURCES[name]
            if lang not in src.locales:
                continue
            pairs = _kept(src.extract(debs, lang, src.locales[lang]), lang, plan, seen, devtest, dropped)
            rows += [
                {"en": e, "text": t, "source": name, "package": _package_of(src, lang, k)}
                for e, t, k in pairs
            ]
            log(f"[bitext] {lang} {name}: {len(pairs):,} pairs")
        rng = random.Random(f"{plan.seed}-{lang}")
        rows = _cap_single_words(rows, plan, rng, dropped)
        candidates = [i for i, r in enumerate(rows) if len(r["en"].split()) >= 4]
        held = set(rng.sample(candidates, min(plan.heldout, len(candidates))))
        train = [r for i, r in enumerate(rows) if i not in held]
        rng.shuffle(train)
        write_jsonl(train, plan.out / lang / "train.jsonl")
        write_jsonl([r for i, r in enumerate(rows) if i in held], plan.out / lang / "heldout.jsonl")
        for r in rows:
            kept_per_package[r["package"]][lang] += 1
        manifest["pairs_total"][lang] = len(train)
        manifest["heldout"][lang] = len(held)
        manifest["dropped"][lang] = dict(sorted(dropped.items()))
        log(f"[bitext] {lang}: {len(train):,} train + {len(held)} held out; dropped {dict(dropped)}")
    for name in plan.sources:
        src = SOURCES[name]
        for package in sorted({p for lang in plan.langs for p in src.packages(lang)}):
            manifest["sources"].append({
                "source": name, "package": package, "version": debs[package].version,
                "license": src.license_of(package), "format": src.format,
                "pairs": dict(kept_per_package[package]),
            })  # fmt: skip
    (plan.out / "data.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return manifest
