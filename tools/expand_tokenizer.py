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
from pathlib import Path

from vepo_mcore.config.cli import run_cli
from vepo_mcore.languages import default_tokenizer_dir
from vepo_mcore.tokenizer.expand import PROTECT_WORDS, corpora_from_specs
from vepo_mcore.tokenizer.pretokenizer import DEFAULT_PRETOKENIZER, PRETOKENIZERS
from vepo_mcore.tokenizer.report import expand_and_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--base", default=str(default_tokenizer_dir()), help="base tokenizer directory")
    add("--corpus", action="append", default=[], metavar="LANG=PATH", help="repeatable")
    add(
        "--wordfreq",
        default="",
        help="comma-separated languages (ms,id,fil,vi) that also train on wordfreq:LANG",
    )
    add("--tokens-per-lang", type=int, default=4000)
    add("--min-frequency", type=int, default=2, help="smallest pair count that is merged")
    add("--max-lines", type=int, default=None, help="read at most this many lines per file")
    add(
        "--protect-words",
        type=int,
        default=PROTECT_WORDS,
        help="wordfreq en/zh words to protect (default: all)",
    )
    add("--pretokenizer", choices=sorted(PRETOKENIZERS), default=DEFAULT_PRETOKENIZER)
    add("--no-compare", action="store_true", help="skip the expansion with the other pre-tokenizer")
    add("--out", required=True, help="output tokenizer directory")
    add("--report-dir", default=None, help="compression report directory (default OUT/report)")
    args = parser.parse_args(argv)

    corpora = corpora_from_specs(args.corpus, [lang for lang in args.wordfreq.split(",") if lang])
    result, report = expand_and_report(
        args.base, corpora, args.out, args.report_dir or Path(args.out) / "report", args.pretokenizer,
        [] if args.no_compare else sorted(PRETOKENIZERS), n_tokens=args.tokens_per_lang,
        min_frequency=args.min_frequency, max_lines=args.max_lines, protect_words=args.protect_words,
    )  # fmt: skip
    print(json.dumps({lang: v["count"] for lang, v in result.manifest()["languages"].items()}))
    print(f"vocab {result.vocab_size}; tokenizer in {args.out}")
    if report is not None:
        gains = {
            lang: row["gain"][f"expanded_{args.pretokenizer}"] for lang, row in report["compression"].items()
        }
        print("devtest gain:", json.dumps(gains))


if __name__ == "__main__":
    run_cli(main)
