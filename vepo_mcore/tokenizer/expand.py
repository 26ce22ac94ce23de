"""Expand the Qwen2.5 tokenizer with BPE tokens for the 8 low-resource languages (SPEC section 1).

Per language, in EXPANDED_LANGS order: stream its corpora, pre-tokenize with the library
(NFC + the chosen Split regex + byte-level), segment every distinct word with the current model
(base merges plus the merges of the languages before it), learn `n_tokens` merges on top of that
segmentation (merges.learn_merges) and append tokens and merges. Every existing id keeps its
meaning; new ids start at 151,665.

English and Chinese are protected: every adjacent pair of the base segmentation of ~300k wordfreq
words per language (lower/Capitalised/UPPER, with and without a leading space) and of the en/zh
FLORES dev lines is banned, so no learned merge can fire on them.

    result = expand_tokenizer(default_tokenizer_dir(), {"th": ["th.txt"]}, n_tokens=4000)
    result.save("out/qwen2.5-expanded")
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import regex
from tokenizers import Tokenizer as HFTokenizer
from tqdm import tqdm

from vepo_mcore.languages import EXPANDED_LANGS, flores_path, language, load_flores
from vepo_mcore.tokenizer.merges import learn_merges, pair_key
from vepo_mcore.tokenizer.pretokenizer import DEFAULT_PRETOKENIZER, set_pretokenizer

# Imported where used: wordfreq (~0.25 s: langcodes, ftfy, msgpack; only wordfreq corpora and the protection
# lists need it).

BASE_VOCAB_SIZE = 151_665
"""Qwen2.5: 151,643 BPE tokens + 22 added tokens (151643-151664)."""
PROTECTED_LANGS = ("en", "zh")
PROTECT_WORDS = 1_000_000
"""Words per protected language taken from wordfreq (its en/zh lists hold ~320k/~334k, so: all)."""
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)
MANIFEST = "expansion_manifest.json"
WORDFREQ_PREFIX = "wordfreq:"
"""Corpus spec for a wordfreq pseudo-corpus, e.g. `--corpus ms=wordfreq:ms`."""
WORDFREQ_SCALE = 100_000
_WORD_CHAR = regex.compile(r"[\p{L}\p{M}]")
_MARK = regex.compile(r"\p{M}")


def read_tokenizer_json(tokenizer_dir: str | Path) -> dict:
    file = Path(tokenizer_dir) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"tokenizer directory {tokenizer_dir} has no tokenizer.json")
    data = json.loads(file.read_text(encoding="utf-8"))
    if data.get("model", {}).get("type") != "BPE":
        raise ValueError(f"{file}: expected a BPE model, got {data.get('model', {}).get('type')!r}")
    return data


def build_tokenizer(tokenizer_json: dict) -> HFTokenizer:
    return HFTokenizer.from_str(json.dumps(tokenizer_json, ensure_ascii=False))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wordfreq_lines(lang: str) -> Iterator[str]:
    """Pseudo-corpus from a wordfreq list: " word" repeated round(frequency * WORDFREQ_SCALE) times.

    ~100k word occurrences per language (several times FLORES dev), frequent words weighted up.
    Lists exist offline for ms, id, fil (~30k words) and vi (~10k); not for th, km, lo, my.
    """
    import wordfreq

    if lang not in wordfreq.available_languages(wordlist="best"):
        raise ValueError(f"wordfreq has no list for {lang!r} (corpus {WORDFREQ_PREFIX}{lang})")
    for word, freq in wordfreq.get_frequency_dict(lang, wordlist="best").items():
        yield from [" " + word] * round(freq * WORDFREQ_SCALE)


def source_sha256(path: str | Path) -> str:
    """sha256 of a corpus file, or of the generated text of a wordfreq source."""
    if str(path).startswith(WORDFREQ_PREFIX):
        digest = hashlib.sha256()
        for line in wordfreq_lines(str(path)[len(WORDFREQ_PREFIX) :]):
            digest.update(line.encode() + b"\n")
        return digest.hexdigest()
    return file_sha256(path)


def iter_corpus(path: str | Path, max_lines: int | None = None) -> Iterator[str]:
    """Stream text lines: .txt (one document per line), .jsonl (a "text" field per line) or
    `wordfreq:LANG` (wordfreq_lines)."""
    if str(path).startswith(WORDFREQ_PREFIX):
        lines = wordfreq_lines(str(path)[len(WORDFREQ_PREFIX) :])
        yield from (line for n, line in enumerate(lines) if max_lines is None or n < max_lines)
        return
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {path} does not exist")
    is_jsonl = path.suffix == ".jsonl"
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if max_lines is not None and n > max_lines:
                return
            if is_jsonl:
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise ValueError(f"{path}:{n}: expected a JSON object with a string 'text' field")
                yield record["text"]
            else:
                yield line.rstrip("\n")


def count_words(tokenizer: HFTokenizer, lines: Iterable[str]) -> Counter[str]:
    """Byte-level pre-tokens that contain a letter or combining mark -> frequency.

    Punctuation, digit and whitespace pre-tokens are left out: new tokens are for words.
    """
    counts: Counter[str] = Counter()
    normalizer, pre = tokenizer.normalizer, tokenizer.pre_tokenizer
    for line in lines:
        text = normalizer.normalize_str(line) if normalizer is not None else line
        for piece, (start, end) in pre.pre_tokenize_str(text):
            if _WORD_CHAR.search(text, start, end):
                counts[piece] += 1
    return counts


def segment_words(tokenizer: HFTokenizer, words: Mapping[str, int]) -> dict[tuple[int, ...], int]:
    """Segment byte-level pre-tokens with the tokenizer's BPE model: ids tuple -> frequency."""
    model = tokenizer.model
    out: dict[tuple[int, ...], int] = {}
    for word, count in words.items():
        ids = tuple(t.id for t in model.tokenize(word))
        out[ids] = out.get(ids, 0) + count
    return out


@lru_cache(maxsize=2)
def protection_texts(
    langs: tuple[str, ...] = PROTECTED_LANGS, n_words: int = PROTECT_WORDS
) -> tuple[str, ...]:
    """wordfreq words of each language in 6 spellings, plus FLORES dev lines (never devtest)."""
    import wordfreq

    texts: set[str] = set()
    for lang in langs:
        if lang not in wordfreq.available_languages(wordlist="best"):
            raise ValueError(f"wordfreq has no list for protected language {lang!r}")
        for word in wordfreq.top_n_list(lang, n_words, wordlist="best"):
            for variant in (word, word.capitalize(), word.upper()):
                texts.add(variant)
                texts.add(" " + variant)
        texts.update(load_flores(lang, "dev"))
    return tuple(sorted(texts))


def protected_pairs(tokenizer: HFTokenizer, texts: Sequence[str], batch: int = 50_000) -> set[int]:
    """pair_key of every adjacent pair of ids inside one pre-token of the texts' encodings."""
    pairs: set[int] = set()
    steps = range(0, len(texts), batch)
    for start in tqdm(steps, desc="protect en/zh", unit="batch", leave=False, disable=None):
        for enc in tokenizer.encode_batch(texts[start : start + batch], add_special_tokens=False):
            ids, words = enc.ids, enc.word_ids
            for j in range(len(ids) - 1):
                if words[j] == words[j + 1] and words[j] is not None:
                    pairs.add(pair_key(ids[j], ids[j + 1]))
    return pairs


_MARK_FREE_PAIRS: dict[tuple, frozenset[int]] = {}


def default_protection(
    base_dir: str | Path,
    pretokenizer: str,
    langs: Sequence[str] = PROTECTED_LANGS,
    n_words: int = PROTECT_WORDS,
    tokenizer: HFTokenizer | None = None,
) -> set[int]:
    """Banned pairs for `langs` under `pretokenizer`: top n_words wordfreq words in 6 spellings + FLORES dev.

    tokenizer: the base tokenizer already built with `pretokenizer` (built from base_dir when None).
    """
    if not langs:
        return set()
    if tokenizer is None:
        tokenizer = build_tokenizer(set_pretokenizer(read_tokenizer_json(base_dir), pretokenizer))
    texts = protection_texts(tuple(langs), n_words)
    # The registered regexes differ only on combining marks, so texts without any split the same way
    # under every pre-tokenizer: encode those once per process, not once per pre-tokenizer.
    key = (str(Path(base_dir).resolve()), tuple(langs), n_words)
    if key not in _MARK_FREE_PAIRS:
        _MARK_FREE_PAIRS.clear()  # one entry is enough (~1.5M ints); keep memory bounded
        _MARK_FREE_PAIRS[key] = frozenset(
            protected_pairs(tokenizer, [t for t in texts if not _MARK.search(t)])
        )
    return set(_MARK_FREE_PAIRS[key]) | protected_pairs(tokenizer, [t for t in texts if _MARK.search(t)])


@dataclass
class LanguageExpansion:
    lang: str
    first_id: int
    count: int
    sources: list[dict] = field(default_factory=list)
    """{"path", "sha256", "lines"} per corpus file."""
    distinct_words: int = 0

    @property
    def new_ids(self) -> range:
        return range(self.first_id, self.first_id + self.count)


@dataclass
class ExpansionResult:
    tokenizer_json: dict
    base_dir: Path
    pretokenizer: str
    n_tokens: int | dict[str, int]
    min_frequency: int
    languages: list[LanguageExpansion]
    protection: dict
    _tokenizer: HFTokenizer | None = field(default=None, repr=False)

    @property
    def vocab_size(self) -> int:
        return BASE_VOCAB_SIZE + sum(lang.count for lang in self.languages)

    def tokenizer(self) -> HFTokenizer:
        """The expanded `tokenizers.Tokenizer` (built once; building parses ~180k merges)."""
        if self._tokenizer is None:
            self._tokenizer = build_tokenizer(self.tokenizer_json)
        return self._tokenizer

    def manifest(self) -> dict:
        return {
            "base_tokenizer": str(self.base_dir),
            "base_tokenizer_sha256": file_sha256(self.base_dir / "tokenizer.json"),
            "base_vocab_size": BASE_VOCAB_SIZE,
            "vocab_size": self.vocab_size,
            "pretokenizer": self.pretokenizer,
            "tokens_per_language": self.n_tokens,
            "min_frequency": self.min_frequency,
            "protection": self.protection,
            "languages": {
                lang.lang: {
                    "first_id": lang.first_id,
                    "last_id": lang.first_id + lang.count - 1,
                    "count": lang.count,
                    "distinct_words": lang.distinct_words,
                    "sources": lang.sources,
                }
                for lang in self.languages
            },
        }

    def save(self, out_dir: str | Path) -> Path:
        """Write a tokenizer directory loadable by AutoTokenizer and load_tokenizer, plus the manifest."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokenizer.json").write_text(
            json.dumps(self.tokenizer_json, ensure_ascii=False), encoding="utf-8"
        )
        for name in TOKENIZER_FILES:
            if (self.base_dir / name).is_file():
                shutil.copyfile(self.base_dir / name, out / name)
        config_file = out / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        # transformers 5's Qwen2Tokenizer rebuilds the stock pre-tokenizer regex from code and would
        # ignore the mark-aware one; the generic fast class takes tokenizer.json as written.
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        (out / MANIFEST).write_text(json.dumps(self.manifest(), indent=2) + "\n", encoding="utf-8")
        return out


def _with_added_tokens_in_vocab(tokenizer_json: dict) -> dict:
    # `tokenizers` gives an added token missing from the model vocab the next free id, not the id in
    # tokenizer.json; once new tokens are appended, Qwen's 22 added tokens would silently move.
    vocab = tokenizer_json["model"]["vocab"]
    for added in tokenizer_json.get("added_tokens", []):
        if vocab.setdefault(added["content"], added["id"]) != added["id"]:
            raise ValueError(
                f"added token {added['content']!r} has id {added['id']} but vocab says {vocab[added['content']]}"
            )
    ids = sorted(vocab.values())
    if ids != list(range(len(ids))):
        raise ValueError(f"base vocabulary ids are not 0..{len(ids) - 1} once added tokens are included")
    return tokenizer_json


def expand_tokenizer(
    base_dir: str | Path,
    corpora: Mapping[str, Sequence[str | Path]],
    n_tokens: int | Mapping[str, int] = 4000,
    pretokenizer: str = DEFAULT_PRETOKENIZER,
    min_frequency: int = 2,
    max_lines: int | None = None,
    protect: Sequence[str] = PROTECTED_LANGS,
    protection: set[int] | None = None,
    protect_words: int = PROTECT_WORDS,
) -> ExpansionResult:
    """Learn and append `n_tokens` new tokens per language (fewer if pairs run below min_frequency).

    corpora: language code -> corpus files (.txt/.jsonl) or `wordfreq:LANG`, in EXPANDED_LANGS order.
    n_tokens: one budget for every language, or language -> budget.
    protection: precomputed protected_pairs (to reuse across runs); computed when None.
    protect_words: wordfreq words per protected language (tests use fewer to run faster).
    """
    for lang in corpora:
        if lang not in EXPANDED_LANGS:
            language(lang)  # raises for unknown codes
            raise ValueError(
                f"language {lang!r} is not expanded; expected one of {', '.join(EXPANDED_LANGS)}"
            )
    if isinstance(n_tokens, Mapping) and set(n_tokens) != set(corpora):
        raise ValueError(f"n_tokens has budgets for {sorted(n_tokens)} but corpora for {sorted(corpora)}")
    base_dir = Path(base_dir)
    data = _with_added_tokens_in_vocab(set_pretokenizer(read_tokenizer_json(base_dir), pretokenizer))
    if len(data["model"]["vocab"]) != BASE_VOCAB_SIZE:
        raise ValueError(
            f"{base_dir}: expected {BASE_VOCAB_SIZE} ids (Qwen2.5), got {len(data['model']['vocab'])}"
        )
    base = build_tokenizer(data)
    banned = (
        protection
        if protection is not None
        else default_protection(base_dir, pretokenizer, protect, protect_words, tokenizer=base)
    )

    strings = [""] * BASE_VOCAB_SIZE
    for token, token_id in data["model"]["vocab"].items():
        strings[token_id] = token
    merges_out = data["model"]["merges"]
    as_strings = bool(merges_out) and isinstance(merges_out[0], str)
    languages = []
    current, stale = base, False
    for lang in (code for code in EXPANDED_LANGS if code in corpora):
        if stale:  # segment with the merges of the languages before this one
            current, stale = build_tokenizer(data), False
        words: Counter[str] = Counter()
        sources = []
        for path in corpora[lang]:
            lines = 0

            def counted(it: Iterable[str]) -> Iterator[str]:
                nonlocal lines
                for line in it:
                    lines += 1
                    yield line

            stream = tqdm(
                counted(iter_corpus(path, max_lines)),
                desc=f"{lang} read {Path(path).name}",
                unit="line",
                leave=False,
                disable=None,
            )
            words.update(count_words(current, stream))
            sources.append({"path": str(path), "sha256": source_sha256(path), "lines": lines})
        segmented = segment_words(current, words)
        first_id = len(strings)
        budget = n_tokens[lang] if isinstance(n_tokens, Mapping) else n_tokens
        with tqdm(total=budget, desc=f"{lang} merges", unit="tok", leave=False, disable=None) as bar:
            merges = learn_merges(
                segmented, strings, budget, min_frequency, banned, on_merge=lambda _: bar.update()
            )
        for a, b in merges:
            token = strings[a] + strings[b]
            data["model"]["vocab"][token] = len(strings)
            strings.append(token)
            merges_out.append(f"{strings[a]} {strings[b]}" if as_strings else [strings[a], strings[b]])
        languages.append(LanguageExpansion(lang, first_id, len(merges), sources, len(words)))
        tqdm.write(
            f"[expand {pretokenizer}] {lang}: {len(merges)} new tokens from {len(words)} distinct words"
        )
        stale = stale or bool(merges)
    info = {
        "languages": list(protect),
        "sources": [f"wordfreq top_n_list({lang!r}, {protect_words}, wordlist='best')" for lang in protect]
        + [f"FLORES-200 dev {language(lang).flores}" for lang in protect],
        "spellings": "lower, Capitalised, UPPER; with and without a leading space",
        "texts": len(protection_texts(tuple(protect), protect_words)) if protect else 0,
        "banned_pairs": len(banned),
    }
    budgets = dict(n_tokens) if isinstance(n_tokens, Mapping) else n_tokens
    return ExpansionResult(data, base_dir, pretokenizer, budgets, min_frequency, languages, info)


def default_corpora() -> dict[str, list[Path]]:
    """FLORES-200 dev of each expanded language (devtest is never a training source)."""
    return {lang: [flores_path(lang, "dev")] for lang in EXPANDED_LANGS}


def corpora_from_specs(specs: Sequence[str], wordfreq: Sequence[str] = ()) -> dict[str, list[Path]]:
    """`LANG=PATH` specs (repeatable; none = default_corpora()) plus a wordfreq pseudo-corpus for each
    language in `wordfreq`. Paths inside the working directory are recorded relative to it, so the
    manifest and the report stay portable."""
    corpora: dict[str, list[Path]] = {}
    for spec in specs:
        lang, sep, path = spec.partition("=")
        if not sep or lang not in EXPANDED_LANGS:
            raise ValueError(
                f"--corpus {spec!r}: expected LANG=PATH with LANG in {', '.join(EXPANDED_LANGS)}"
            )
        corpora.setdefault(lang, []).append(Path(path))
    corpora = corpora or default_corpora()
    for lang in wordfreq:
        if lang not in corpora:
            raise ValueError(f"--wordfreq {lang}: no corpus for that language ({', '.join(corpora)})")
        corpora[lang].append(Path(WORDFREQ_PREFIX + lang))
    return {lang: [_display_path(p) for p in paths] for lang, paths in corpora.items()}


def _display_path(path: Path) -> Path:
    if str(path).startswith(WORDFREQ_PREFIX):
        return path
    resolved = Path(path).resolve()
    return resolved.relative_to(Path.cwd()) if resolved.is_relative_to(Path.cwd()) else Path(path)
