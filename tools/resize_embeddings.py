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

Continued pre-training on the expanded tokenizer then needs only consistent config: tokenize the
corpora with it (tools/preprocess_data.py --tokenizer-dir), train from the resized checkpoint
(--training.checkpoint.load=ckpt/qwen7b-exp --training.checkpoint.finetune=true
--tokenizer.path=out/qwen2.5-expanded --model.vocab_size=<its length>, the values its config.yaml
holds), and keep a TP with the same padded row count: a dist checkpoint loads only into the row
count it was written with.
"""

from __future__ import annotations

import argparse


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--megatron-load", help="Megatron checkpoint directory (or its iter_* directory)")
    add("--megatron-save", help="output Megatron checkpoint directory")
    add("--hf-in", help="HF Qwen2 model directory")
    add("--hf-out", help="output HF model directory")
    add("--tokenizer", required=True, help="expanded tokenizer directory")
    add("--base-tokenizer", default=None, help="base tokenizer directory (default: shipped Qwen2.5)")
    add("--hf-divisible-by", type=int, default=128, help="HF rows: multiple of this")
    add("--max-shard-gb", type=float, default=5.0, help="HF safetensors shard size limit")
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

        shard = int(args.max_shard_gb * (1 << 30))
        out = resize_hf_checkpoint(
            args.hf_in, args.hf_out, args.tokenizer, args.base_tokenizer, args.hf_divisible_by, shard
        )
        print(f"wrote {out}")
        return
    from vepo_mcore.checkpoint.resize import megatron_worker
    from vepo_mcore.parallel.launch import run_processes
    from vepo_mcore.training.checkpointing import checkpoint_config

    # A CPU job, like conversion: run_processes starts its gloo workers with the GPUs hidden.
    cfg, _ = checkpoint_config(args.megatron_load, overrides)
    world = cfg.parallel.tensor_model_parallel_size * cfg.parallel.pipeline_model_parallel_size
    worker_args = (args.megatron_load, args.megatron_save, args.tokenizer, args.base_tokenizer, overrides)
    run_processes(megatron_worker, world, args=worker_args)


if __name__ == "__main__":
    main()
