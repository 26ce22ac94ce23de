"""Expand the Qwen2.5 tokenizer for th, ms, km, lo, my, fil, id, vi and write a compression report.

    python tools/expand_tokenizer.py --out out/qwen2.5-expanded --report-dir reports/tokenizer
    python tools/expand_tokenizer.py --out out/tok --corpus th=th.txt --corpus th=more_th.jsonl --corpus km=km.txt

Without --corpus, each language trains on its FLORES-200 dev file (devtest is kept for the report).
`--corpus ms=wordfreq:ms` adds a pseudo-corpus from the offline wordfreq list (ms, id, fil, vi).
Corpora are streamed (.txt one text per line, .jsonl with a "text" field). The output directory
loads with transformers.AutoTokenizer.from_pretrained and vepo_mcore.tokenizer.load_tokenizer and
holds expansion_manifest.json (new ids per language, corpus sha256s).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from vepo_mcore.languages import EXPANDED_LANGS, default_tokenizer_dir
from vepo_mcore.tokenizer.expand import PROTECT_WORDS, WORDFREQ_PREFIX, default_corpora
from vepo_mcore.tokenizer.pretokenizer import DEFAULT_PRETOKENIZER, PRETOKENIZERS
from vepo_mcore.tokenizer.report import expand_and_report


def parse_corpora(specs: list[str]) -> dict[str, list[Path]]:
    corpora: dict[str, list[Path]] = defaultdict(list)
    for spec in specs:
        lang, sep, path = spec.partition("=")
        if not sep or lang not in EXPANDED_LANGS:
            raise SystemExit(
                f"--corpus {spec!r}: expected LANG=PATH with LANG in {', '.join(EXPANDED_LANGS)}"
            )
        corpora[lang].append(Path(path))
    return dict(corpora)


def _display_path(path: Path) -> Path:
    """Paths inside the working directory are recorded relative to it (the manifest/report stay portable)."""
    if str(path).startswith(WORDFREQ_PREFIX):
        return path
    resolved = Path(path).resolve()
    return resolved.relative_to(Path.cwd()) if resolved.is_relative_to(Path.cwd()) else Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default=str(default_tokenizer_dir()), help="base tokenizer directory")
    parser.add_argument("--corpus", action="append", default=[], metavar="LANG=PATH", help="repeatable")
    parser.add_argument(
        "--wordfreq",
        default="",
        help="comma-separated languages (ms,id,fil,vi) that also train on wordfreq:LANG",
    )
    parser.add_argument("--tokens-per-lang", type=int, default=4000)
    parser.add_argument("--min-frequency", type=int, default=2, help="smallest pair count that is merged")
    parser.add_argument("--max-lines", type=int, default=None, help="read at most this many lines per file")
    parser.add_argument(
        "--protect-words",
        type=int,
        default=PROTECT_WORDS,
        help="wordfreq en/zh words to protect (default: all)",
    )
    parser.add_argument("--pretokenizer", choices=sorted(PRETOKENIZERS), default=DEFAULT_PRETOKENIZER)
    parser.add_argument(
        "--no-compare", action="store_true", help="skip the expansion with the other pre-tokenizer"
    )
    parser.add_argument("--out", required=True, help="output tokenizer directory")
    parser.add_argument(
        "--report-dir", default=None, help="compression report directory (default OUT/report)"
    )
    args = parser.parse_args()

    corpora = parse_corpora(args.corpus) if args.corpus else default_corpora()
    for lang in filter(None, args.wordfreq.split(",")):
        if lang not in corpora:
            raise SystemExit(f"--wordfreq {lang}: no corpus for that language ({', '.join(corpora)})")
        corpora[lang].append(Path(WORDFREQ_PREFIX + lang))
    corpora = {lang: [_display_path(p) for p in paths] for lang, paths in corpora.items()}
    compare = [] if args.no_compare else sorted(PRETOKENIZERS)
    result, report = expand_and_report(
        args.base,
        corpora,
        args.out,
        args.report_dir or Path(args.out) / "report",
        args.pretokenizer,
        compare,
        n_tokens=args.tokens_per_lang,
        min_frequency=args.min_frequency,
        max_lines=args.max_lines,
        protect_words=args.protect_words,
    )
    print(json.dumps({lang: v["count"] for lang, v in result.manifest()["languages"].items()}))
    print(f"vocab {result.vocab_size}; tokenizer in {args.out}")
    if report is not None:
        gains = {
            lang: row["gain"][f"expanded_{args.pretokenizer}"] for lang, row in report["compression"].items()
        }
        print("devtest gain:", json.dumps(gains))


if __name__ == "__main__":
    main()
