"""The output layer + loss on a GPU at Qwen2.5-7B's shape: ours from the hidden states
(models/output_loss.py) against megatron's logits + vocab_parallel_cross_entropy, as GPTModel runs it.

    python benchmarks/output_layer_gpu.py            # hidden 3584, V 152,064, bf16, 4,096 and 16,384 tokens

Forward + backward of sum(mask * loss) (CPT / SFT), and of the RL log-prob + entropy at tau 0.7, at
two lengths and a few chunk sizes. Reference, as megatron users run it: F.linear in the weight's dtype,
then megatron.core.tensor_parallel.vocab_parallel_cross_entropy (one process, NCCL, TP = 1); for RL the
logits then rl.logprobs (the fused log-prob + entropy handed logits). Prints the median time of
--repeats after a warm-up (CUDA events), peak memory above the inputs, and one JSON line
{"bench": "output_layer_gpu", "ratio": ours / megatron's time, ...}. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _timed(fn, repeats: int) -> tuple[float, int]:
    """(median ms, peak bytes above what was allocated before) of fn() over `repeats` after one warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated() - base


def _measure(n: int, weight, args, g) -> list[dict]:
    """The CE and RL cases at n tokens: megatron's logits path, then ours at each chunk size."""
    import torch
    import torch.nn.functional as F
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from vepo_mcore.models.output_loss import output_layer_cross_entropy, output_layer_logprobs
    from vepo_mcore.rl.logprobs import logprobs_and_entropy

    hidden = torch.randn(n, args.hidden, device="cuda", generator=g).to(weight.dtype).requires_grad_()
    labels = torch.randint(0, args.vocab, (n,), device="cuda", generator=g)
    mask = (torch.rand(n, device="cuda", generator=g) > 0.2).float()

    def megatron_ce():
        logits = F.linear(hidden, weight)[:, None, :]  # [s, b, V] as GPTModel hands it over
        (vocab_parallel_cross_entropy(logits, labels[:, None])[:, 0] * mask).sum().backward()

    def megatron_rl():
        logp, ent = logprobs_and_entropy(F.linear(hidden, weight), labels, temperature=0.7)
        ((logp * mask).sum() + ent.sum()).backward()

    def ours_ce(chunk):
        def run():
            loss = output_layer_cross_entropy(
                hidden, weight, labels, chunk_size=chunk or None, loss_weights=mask
            )
            (loss * mask).sum().backward()

        return run

    def ours_rl(chunk):
        def run():
            logp, ent = output_layer_logprobs(hidden, weight, labels, 0.7, chunk_size=chunk or None)
            ((logp * mask).sum() + ent.sum()).backward()

        return run

    records = []
    for loss, ref_fn, ours_fn in (("ce", megatron_ce, ours_ce), ("rl", megatron_rl, ours_rl)):
        ref_ms, ref_peak = _timed(ref_fn, args.repeats)
        print(
            f"{n:>7} {loss:>4} {'megatron (logits)':<22} {ref_ms:>8.1f} {ref_peak / 2**20:>9.0f} {'1.00':>11}"
        )
        for chunk in args.chunks:
            ms, peak = _timed(ours_fn(chunk), args.repeats)
            name = f"ours, chunk {chunk or 'default'}"
            print(f"{n:>7} {loss:>4} {name:<22} {ms:>8.1f} {peak / 2**20:>9.0f} {ref_ms / ms:>10.2f}x")
            records.append({"tokens": n, "loss": loss, "chunk": chunk, "ms": round(ms, 2),
                            "peak_mib": round(peak / 2**20), "megatron_ms": round(ref_ms, 2),
                            "megatron_peak_mib": round(ref_peak / 2**20)})  # fmt: skip
    weight.grad = None
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hidden", type=int, default=3584)
    parser.add_argument("--vocab", type=int, default=152_064)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16_384])
    parser.add_argument(
        "--chunks", type=int, nargs="+", default=[0, 2048, 8192], help="0 = the default (by bytes)"
    )
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks/output_layer_gpu.py needs CUDA (the CPU figures are benchmarks/train_step.py's)")
    from vepo_mcore.config import ParallelConfig
    from vepo_mcore.parallel import destroy, init_distributed, init_model_parallel

    init_distributed("nccl", rank=0, world_size=1)
    init_model_parallel(ParallelConfig(), seed=0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    g = torch.Generator(device="cuda").manual_seed(0)
    weight = (
        (torch.randn(args.vocab, args.hidden, device="cuda", generator=g) * 0.02).to(dtype).requires_grad_()
    )
    print(f"{torch.cuda.get_device_name()}: hidden {args.hidden}, vocabulary {args.vocab:,}, {args.dtype}")
    print(f"{'tokens':>7} {'loss':>4} {'path':<22} {'ms':>8} {'peak MiB':>9} {'vs megatron':>11}")
    records = []
    for n in args.tokens:
        records += _measure(n, weight, args, g)
        torch.cuda.empty_cache()
    destroy()
    longest = [
        r for r in records if r["tokens"] == max(args.tokens) and r["loss"] == "ce" and r["chunk"] == 0
    ]
    ratio = longest[0]["ms"] / longest[0]["megatron_ms"]
    print(json.dumps({"bench": "output_layer_gpu", "ratio": round(ratio, 3), "goal": None,
                      "higher_is_better": False, "device": torch.cuda.get_device_name(), "dtype": args.dtype,
                      "hidden": args.hidden, "vocab": args.vocab, "records": records}))  # fmt: skip


if __name__ == "__main__":
    main()
