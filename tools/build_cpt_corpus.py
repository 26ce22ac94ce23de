"""Build the tiny CPT corpus of the quickstart: one Megatron indexed dataset per language from FLORES dev.

python tools/build_cpt_corpus.py --output-dir data/cpt_tiny
# -> data/cpt_tiny/cpt_<lang>_text_document.bin/.idx for en zh th ms km lo my fil id vi,
#    the paths examples/configs/cpt_tiny.yaml reads
"""

from __future__ import annotations

import argparse
import sys
import warnings

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

from vepo_mcore.data.corpus import build_flores_cpt_corpus  # noqa: E402
from vepo_mcore.data.indexed import count_tokens  # noqa: E402
from vepo_mcore.languages import LANGS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default="data/cpt_tiny", help="where the .jsonl and .bin/.idx files go")
    p.add_argument("--langs", nargs="+", default=list(LANGS), help="language codes (default: all ten)")
    p.add_argument(
        "--sentences-per-doc", type=int, default=4, help="consecutive FLORES sentences per document"
    )
    p.add_argument("--tokenizer-dir", default=None, help="tokenizer directory (default: shipped Qwen2.5)")
    p.add_argument("--workers", type=int, default=1, help="tokenising processes")
    args = p.parse_args(argv)
    paths = build_flores_cpt_corpus(
        args.output_dir,
        args.langs,
        sentences_per_doc=args.sentences_per_doc,
        tokenizer_dir=args.tokenizer_dir,
        workers=args.workers,
    )
    print("data:\n  paths:")
    for lang, prefix in paths.items():
        print(f"    {lang}: {prefix}   # {count_tokens(prefix):,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
