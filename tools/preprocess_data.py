"""Tokenise raw text into a Megatron indexed dataset (.bin/.idx), like Megatron-LM's tools/preprocess_data.py.

    python tools/preprocess_data.py --input th.jsonl --output-prefix data/cpt --lang th --workers 8
    # -> data/cpt_th_text_document.bin / .idx, one document per jsonl line, EOD appended

Inputs: jsonl (field --json-key, default "text"), plain .txt (one document per line), parquet
(column --json-key); .jsonl.gz / .txt.gz too. Several --input files go into one output, in order.
A bad line stops the run with its file and line number unless --skip-bad-lines (then it is
counted in the summary).
"""

from __future__ import annotations

import argparse
import sys
import warnings

# megatron.core warns at import that the GPU-only fused kernels are absent; irrelevant for tokenising.
warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

from vepo_mcore.data.indexed import dataset_prefix  # noqa: E402
from vepo_mcore.data.preprocess import FORMATS, BadInputError, preprocess  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="input file(s): .jsonl, .txt, .parquet (.gz ok)")
    p.add_argument("--output-prefix", required=True, help="output path prefix; Megatron naming is appended")
    p.add_argument(
        "--lang", default=None, help="language code inserted in the output name (out_<lang>_text_...)"
    )
    p.add_argument("--json-key", default="text", help="jsonl field / parquet column holding the text")
    p.add_argument("--input-format", choices=FORMATS, default=None, help="override detection by extension")
    p.add_argument("--tokenizer-dir", default=None, help="tokenizer directory (default: shipped Qwen2.5)")
    p.add_argument("--workers", type=int, default=1, help="tokenizer threads (above 8 spread over processes)")
    p.add_argument("--chunk-size", type=int, default=256, help="lines per work item sent to a worker")
    p.add_argument(
        "--append-eod", action=argparse.BooleanOptionalAction, default=True, help="EOD after each doc"
    )
    p.add_argument(
        "--skip-bad-lines", action="store_true", help="skip and count bad lines instead of failing"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prefix = dataset_prefix(args.output_prefix, args.lang, args.json_key)
    try:
        summary = preprocess(
            args.input,
            prefix,
            tokenizer_dir=args.tokenizer_dir,
            text_key=args.json_key,
            input_format=args.input_format,
            workers=args.workers,
            append_eod=args.append_eod,
            skip_bad_lines=args.skip_bad_lines,
            chunk_size=args.chunk_size,
            progress=not args.no_progress,
        )
    except (BadInputError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
