"""Resize a model's embeddings after tokenizer expansion (SPEC section 1), on CPU.

    python tools/resize_embeddings.py --megatron-load ckpt/qwen7b --megatron-save ckpt/qwen7b-exp \\
        --tokenizer out/qwen2.5-expanded [--parallel.tensor_model_parallel_size=4 ...]
    python tools/resize_embeddings.py --hf-in Qwen2.5-7B --hf-out Qwen2.5-7B-exp --tokenizer out/qwen2.5-expanded

New rows (input embedding and output layer) = mean of the base rows of the new token's base-tokenizer
encoding; original rows unchanged; padding rows zero. Megatron: runs TP*PP local gloo processes at
the checkpoint's config.yaml layout plus dotted overrides (the layout fixes the padded row count:
padded_vocab_size(new_vocab, model.make_vocab_size_divisible_by, TP)); writes a weights-only
checkpoint whose config.yaml has model.vocab_size = the expanded tokenizer's length and
tokenizer.path = --tokenizer, with the tokenizer copied beside it. HF: config.json's vocab_size
becomes padded_vocab_size(new_vocab, --hf-divisible-by (128), 1).

Continued pre-training on the expanded tokenizer then needs no code change, only consistent config:
  1. tokenize the corpora with it: tools/preprocess_data.py --tokenizer-dir out/qwen2.5-expanded ...
  2. train from the resized checkpoint: --training.checkpoint.load=ckpt/qwen7b-exp
     --training.checkpoint.finetune=true --tokenizer.path=out/qwen2.5-expanded
     --model.vocab_size=<len(expanded tokenizer)> (the values its config.yaml holds). model.vocab_size
     must equal the expanded tokenizer's length: the padded row count, and so whether the checkpoint
     loads, follows from it; the trainer does not check it against the tokenizer.
  3. keep the TP used here, or one with the same padded_vocab_size(new_vocab, divisible_by, TP):
     a dist checkpoint loads only into the row count it was written with.
"""

from __future__ import annotations

import argparse
import os


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--megatron-load", help="Megatron checkpoint directory (or its iter_* directory)")
    parser.add_argument("--megatron-save", help="output Megatron checkpoint directory")
    parser.add_argument("--hf-in", help="HF Qwen2 model directory")
    parser.add_argument("--hf-out", help="output HF model directory")
    parser.add_argument("--tokenizer", required=True, help="expanded tokenizer directory")
    parser.add_argument(
        "--base-tokenizer", default=None, help="base tokenizer directory (default: shipped Qwen2.5)"
    )
    parser.add_argument("--hf-divisible-by", type=int, default=128, help="HF rows: multiple of this")
    parser.add_argument("--max-shard-gb", type=float, default=5.0, help="HF safetensors shard size limit")
    args, overrides = parser.parse_known_args(argv)
    megatron, hf = (args.megatron_load, args.megatron_save), (args.hf_in, args.hf_out)
    if all(megatron) == all(hf) or (any(megatron) and any(hf)):
        parser.error("give either --megatron-load and --megatron-save, or --hf-in and --hf-out")
    if overrides and not all(megatron):
        parser.error(f"dotted overrides {overrides} apply only to --megatron-load")
    bad = [o for o in overrides if not o.startswith("--")]
    if bad:
        parser.error(
            f"unrecognised arguments {bad} (overrides look like --parallel.tensor_model_parallel_size=2)"
        )
    return args, overrides


def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(argv)
    if args.hf_in:
        from vepo_mcore.checkpoint.resize import resize_hf_checkpoint

        out = resize_hf_checkpoint(
            args.hf_in,
            args.hf_out,
            args.tokenizer,
            args.base_tokenizer,
            args.hf_divisible_by,
            int(args.max_shard_gb * (1 << 30)),
        )
        print(f"wrote {out}")
        return
    # A CPU job, like conversion: hide GPUs before CUDA initialises so every rank builds on CPU.
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        from vepo_mcore.checkpoint.resize import megatron_worker
        from vepo_mcore.parallel.launch import run_processes
        from vepo_mcore.training.checkpointing import checkpoint_config

        cfg, _ = checkpoint_config(args.megatron_load, overrides)
        world = cfg.parallel.tensor_model_parallel_size * cfg.parallel.pipeline_model_parallel_size
        run_processes(
            megatron_worker,
            world,
            args=(args.megatron_load, args.megatron_save, args.tokenizer, args.base_tokenizer, overrides),
        )
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous


if __name__ == "__main__":
    main()
