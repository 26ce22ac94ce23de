"""Convert Qwen2/Qwen2.5 checkpoints between Hugging Face and megatron.core dist checkpoints (CPU).

    python tools/convert_hf.py hf-to-megatron --hf Qwen2.5-7B --out ckpt/qwen7b --tp 4 --pp 2
    python tools/convert_hf.py hf-to-megatron --hf Qwen2.5-7B --out ckpt/qwen7b --tp 4 --dry-run
    python tools/convert_hf.py megatron-to-hf --ckpt ckpt/qwen7b --out Qwen2.5-7B-vepo
    python tools/convert_hf.py reshard --ckpt ckpt/qwen7b --out ckpt/qwen7b_tp2 --tp 2

All three stream tensor by tensor in one process (memory near the largest tensor, not the
model); the dist checkpoint hf-to-megatron writes (every TP/PP rank's shards) loads at any TP/PP.
reshard rewrites a checkpoint's files for another TP/PP (vocab rows re-padded, config.yaml
updated); it keeps the weights only.
--vocab-size sets the real vocab (default: the tokenizer.json's length); --overwrite: into a non-empty --out.
"""

from __future__ import annotations

import argparse
import os
import sys

from vepo_mcore.config.cli import check_output_folder, run_cli

DTYPES = ("bfloat16", "float32", "float16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="direction", required=True)
    to_mc = sub.add_parser("hf-to-megatron", help="HF directory -> megatron dist checkpoint")
    to_mc.add_argument("--hf", required=True, help="HF model directory (config.json + safetensors)")
    to_mc.add_argument("--out", required=True, help="output checkpoint directory")
    to_mc.add_argument("--tp", type=int, default=1, help="tensor-parallel size to write")
    to_mc.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to write")
    to_mc.add_argument("--vocab-size", type=int, default=None, help="real vocab (default: tokenizer length)")
    to_mc.add_argument("--dry-run", action="store_true", help="print the tensor mapping and exit")
    to_hf = sub.add_parser("megatron-to-hf", help="megatron dist checkpoint (any TP/PP) -> HF directory")
    to_hf.add_argument("--ckpt", required=True, help="checkpoint directory (or its iter_* subdirectory)")
    to_hf.add_argument("--out", required=True, help="output HF directory")
    to_hf.add_argument("--max-shard-gb", type=float, default=5.0, help="safetensors shard size limit")
    to_hf.add_argument("--dtype", choices=DTYPES, default=None, help="default: the source config.json's")
    to_hf.add_argument("--vocab-rows", type=int, default=None, help="embedding rows to write")
    re = sub.add_parser("reshard", help="megatron dist checkpoint (any TP/PP) -> the same at another TP/PP")
    re.add_argument("--ckpt", required=True, help="checkpoint directory (or its iter_* subdirectory)")
    re.add_argument("--out", required=True, help="output checkpoint directory")
    re.add_argument("--tp", type=int, default=1, help="tensor-parallel size to write")
    re.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to write")
    for sub_parser in (to_mc, to_hf, re):
        sub_parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    return parser.parse_args([a for a in (sys.argv[1:] if argv is None else argv) if a != "--debug"])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # Conversion is a CPU job: hide GPUs (before CUDA initialises) so every rank builds the same
    # local-spec model on CPU.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    from vepo_mcore.checkpoint.convert import dry_run, hf_to_megatron, megatron_to_hf
    from vepo_mcore.checkpoint.reshard import reshard_checkpoint

    if getattr(args, "dry_run", False):
        return print(dry_run(args.hf, args.tp, args.pp, args.vocab_size))
    check_output_folder("--out", args.out, create=False, overwrite=args.overwrite)  # before any work
    if args.direction == "hf-to-megatron":
        out = hf_to_megatron(args.hf, args.out, args.tp, args.pp, args.vocab_size)
    elif args.direction == "reshard":
        out = reshard_checkpoint(args.ckpt, args.out, args.tp, args.pp)
    else:
        dtype = getattr(torch, args.dtype) if args.dtype else None
        out = megatron_to_hf(args.ckpt, args.out, int(args.max_shard_gb * (1 << 30)), dtype, args.vocab_rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    run_cli(main)
