"""Tokenise ChatML conversations (jsonl) into Megatron indexed files for SFT at millions of samples.

    python tools/preprocess_sft.py --input data/sft_tiny/general.jsonl --output-prefix data/sft_disk/general
    # -> data/sft_disk/general_conversation_document.bin/.idx  token ids, one document per conversation
    #    data/sft_disk/general_loss_spans_document.bin/.idx    the assistant-only loss mask as spans
    #    data/sft_disk/general_sft.json                        counts, tokenizer

Give the output prefix as a source in data.sft_phases (instead of the .jsonl file): the trainer
memory-maps it, with the same tokens, loss mask, mixing and packing as the in-memory path.
A line that is not a conversation stops the run with its file and line; no output is left.
"""

from __future__ import annotations

import argparse
import sys
import time

from vepo_mcore.data.sft_indexed import preprocess_sft


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, help="ChatML jsonl file(s), one conversation a line")
    p.add_argument("--output-prefix", required=True, help="output path prefix (the data.sft_phases source)")
    p.add_argument("--tokenizer-dir", default=None, help="tokenizer directory (default: shipped Qwen2.5)")
    p.add_argument("--chunk-size", type=int, default=4096, help="conversations tokenised per batch")
    args = p.parse_args(argv)
    start = time.perf_counter()
    try:
        meta = preprocess_sft(args.input, args.output_prefix, args.tokenizer_dir, args.chunk_size)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    print(
        f"{args.output_prefix}: {meta['conversations']:,} conversations, {meta['tokens']:,} tokens "
        f"in {seconds:.1f} s ({meta['conversations'] / max(seconds, 1e-9):,.0f} conversations/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
