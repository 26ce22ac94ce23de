"""Weight sync Megatron -> rollout engine: bytes moved per model byte, and bucketed vs per-tensor time.

    .venv/bin/python benchmarks/weight_sync.py [--layers 8] [--hidden 256] [--vocab 16000] [--tp 1 --pp 1]
    .venv/bin/python benchmarks/weight_sync.py --engine sglang        # on a GPU with sglang installed

Builds a Megatron GPTModel at TP x PP (gloo processes on CPU), starts the engine from a config-only
directory (load_format="dummy") and runs weight_sync.sync_weights twice per repeat: in flattened
buckets of --bucket-mb and tensor by tensor (bucket_bytes=0). Prints, for each, the bytes that reached
the engine divided by the HF model's bytes (goal 1.0), the number of update calls, the best time,
and the time ratio per-tensor / bucketed. The fake engine serialises with torch.save (a copy);
real SGLang passes CUDA IPC handles, so only the ratio and the byte count carry over.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def _body(rank: int, world: int, args) -> None:
    import torch.distributed as dist

    from vepo_mcore.config import JobConfig
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout.base import build_engine
    from vepo_mcore.rollout.weight_sync import sync_weights

    torch.set_num_threads(args.threads)
    if args.engine == "fake_sglang":  # the CPU fake is a test double: importing it registers the engine
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: harness
        import harness.fake_sglang  # noqa: F401
    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = args.layers, args.hidden, args.hidden * 3
    m.num_attention_heads, m.num_query_groups, m.vocab_size = 8, 2, args.vocab
    cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size = args.tp, args.pp
    cfg.rl.rollout.engine = args.engine
    cfg.rl.rollout.weight_bucket_mb = args.bucket_mb
    init_model_parallel(cfg.parallel)
    model = build_model(cfg).eval()
    engine = build_engine(cfg)
    engine.wake()  # released right after it was built (colocated): resume the weights before syncing
    results: dict[str, dict] = {}
    for _ in range(args.repeats):
        for label, bucket_bytes in (("bucketed", args.bucket_mb << 20), ("per-tensor", 0)):
            stats = sync_weights(engine, model, cfg, bucket_bytes=bucket_bytes)
            if rank == 0:
                best = results.get(label)
                if best is None or stats["seconds"] < best["seconds"]:
                    results[label] = stats
    if rank == 0:
        model_bytes = _hf_model_bytes(cfg)
        print(
            f"model: {m.num_layers} layers, hidden {m.hidden_size}, vocab {m.vocab_size}, "
            f"{model_bytes / 2**20:.1f} MiB as HF tensors; training TP={args.tp} PP={args.pp}; "
            f"engine {args.engine} (engine TP {cfg.rl.rollout.engine_tp}); bucket {args.bucket_mb} MiB"
        )
        for label, stats in results.items():
            print(
                f"{label:>10}: bytes to engine / model bytes = {stats['bytes'] / model_bytes:.3f}, "
                f"{stats['calls']} update calls, {stats['tensors']} tensors, best {stats['seconds'] * 1e3:.1f} ms"
            )
        ratio = results["per-tensor"]["seconds"] / results["bucketed"]["seconds"]
        print(f"time ratio per-tensor / bucketed: {ratio:.2f}")
    dist.barrier()
    engine.shutdown()


def _hf_model_bytes(cfg) -> int:
    """Bytes of the HF Qwen2 tensors of cfg.model (fp32), counted from the mapping's names."""
    from vepo_mcore.checkpoint import mapping
    from vepo_mcore.models.builder import model_vocab_size

    m = cfg.model
    shapes = {
        "embedding.word_embeddings.weight": (model_vocab_size(cfg), m.hidden_size),
        "output_layer.weight": (model_vocab_size(cfg), m.hidden_size),
        "decoder.final_layernorm.weight": (m.hidden_size,),
    }
    kv = m.num_query_groups * m.head_dim
    per_layer = {
        "input_layernorm.weight": (m.hidden_size,),
        "self_attention.linear_qkv.weight": (m.num_attention_heads * m.head_dim + 2 * kv, m.hidden_size),
        "self_attention.linear_qkv.bias": (m.num_attention_heads * m.head_dim + 2 * kv,),
        "self_attention.linear_proj.weight": (m.hidden_size, m.num_attention_heads * m.head_dim),
        "pre_mlp_layernorm.weight": (m.hidden_size,),
        "mlp.linear_fc1.weight": (2 * m.ffn_hidden_size, m.hidden_size),
        "mlp.linear_fc2.weight": (m.hidden_size, m.ffn_hidden_size),
    }
    for layer in range(m.num_layers):
        for suffix, shape in per_layer.items():
            shapes[f"decoder.layers.{layer}.{suffix}"] = shape
    full = {n: torch.empty(shapes[n]) for n in mapping.megatron_names(m)}
    return sum(t.numel() * 4 for _, t in mapping.megatron_to_hf_tensors(full, m, m.vocab_size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--bucket-mb", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--engine", default="fake_sglang", choices=["fake_sglang", "sglang"])
    args = parser.parse_args()
    from vepo_mcore.parallel.launch import run_processes

    run_processes(_body, args.tp * args.pp, args=(args,))


if __name__ == "__main__":
    main()
