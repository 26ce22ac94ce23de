"""Peak memory and time of the fused vocab-parallel log-prob + entropy (vepo_mcore.rl.logprobs) against
the naive fp32 log_softmax + gather + entropy and against megatron.core's vocab_parallel_cross_entropy
followed by a separate entropy. Forward + backward through both outputs, at temperature 0.7.

    .venv/bin/python benchmarks/logprob_entropy_memory.py --tokens 2048 --chunk-size 256 --dtype bf16

Each method runs in a fresh subprocess. On CPU, peak memory is the peak RSS (ru_maxrss) minus the RSS
after the inputs exist; on CUDA it is torch.cuda.max_memory_allocated minus the memory allocated after
the inputs exist. Both include the logits' gradient, which every method must produce. Time is the median
of --repeats runs after one warm-up. Prints the ratios naive/fused and megatron/fused (goal: >= 4x less
peak memory, <= 1.2x time).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

METHODS = ("fused", "naive", "megatron")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _naive(logits, targets, temperature, vocab_size):
    import torch

    z = logits[:, :vocab_size].float() / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _megatron(logits, targets, temperature, vocab_size):
    import torch
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # megatron's function modifies its input in place and has no temperature: give it its own tempered copy
    z = logits.float() / temperature
    logp = -vocab_parallel_cross_entropy(z[:, :vocab_size], targets)
    logp_all = torch.log_softmax(logits[:, :vocab_size].float() / temperature, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def _fused(logits, targets, temperature, vocab_size, chunk_size):
    from vepo_mcore.rl.logprobs import logprobs_and_entropy

    return logprobs_and_entropy(logits, targets, temperature, chunk_size, vocab_size)


def worker(args) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    if args.method in ("megatron", "interleaved"):
        from megatron.core import parallel_state

        from vepo_mcore.parallel.init import init_distributed

        init_distributed("nccl" if cuda else "gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, generator=g, device=dev, dtype=dtype).requires_grad_(True)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g, device=dev)
    w = torch.randn(args.tokens, generator=g, device=dev)
    fns = {
        "fused": lambda: _fused(logits, targets, 0.7, args.vocab, args.chunk_size),
        "naive": lambda: _naive(logits, targets, 0.7, args.vocab),
        "megatron": lambda: _megatron(logits, targets, 0.7, args.vocab),
    }
    if args.method == "interleaved":
        return _interleaved_times(fns, logits, w, args.repeats, cuda)
    fn = fns[args.method]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    times = [_timed_step(fn, logits, w, cuda) for _ in range(args.repeats + 1)][1:]  # the first warms up
    peak = (
        torch.cuda.max_memory_allocated()
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        "method": args.method,
        "peak_bytes": peak - base,
        "time_s": statistics.median(times),
        "device": str(dev),
    }


def _timed_step(fn, logits, w, cuda: bool) -> float:
    """Seconds for one forward (fn) + backward of the weighted log-prob and entropy sums."""
    import torch

    logits.grad = None
    start = time.perf_counter()
    logp, entropy = fn()
    ((logp * w).sum() + (entropy * w).sum()).backward()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _interleaved_times(fns, logits, w, repeats, cuda) -> dict:
    """Time every method round-robin in one process: on a shared machine the load drifts, and
    alternating the methods exposes them to the same drift."""

    times = {name: [] for name in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            elapsed = _timed_step(fn, logits, w, cuda)
            if i > 0:  # the first round warms up
                times[name].append(elapsed)
    return {"method": "interleaved", "times": {k: statistics.median(v) for k, v in times.items()}}


def _worker_cmd(args, method: str) -> list[str]:
    """This script re-run for one method in a fresh process (its own peak-memory counter)."""
    return [
        sys.executable, __file__, "--method", method, f"--tokens={args.tokens}", f"--vocab={args.vocab}",
        f"--dtype={args.dtype}", f"--chunk-size={args.chunk_size}", f"--repeats={args.repeats}",
    ]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument(
        "--interleaved-time",
        action="store_true",
        help="also time all methods round-robin in one process (fairer on a loaded machine)",
    )
    p.add_argument("--method", help=argparse.SUPPRESS)  # internal: run one method in this process
    args = p.parse_args()
    if args.method:
        print(json.dumps(worker(args)))
        return
    results = {}
    for method in args.methods.split(","):
        proc = subprocess.run(_worker_cmd(args, method), capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{method}: failed (skipped in the ratios):\n{proc.stderr[-2000:]}")
            continue
        results[method] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"tokens={args.tokens} vocab={args.vocab} dtype={args.dtype} chunk={args.chunk_size} "
        f"device={next(iter(results.values()))['device'] if results else '?'}"
    )
    for method, r in results.items():
        print(f"  {method:9s} peak {r['peak_bytes'] / 2**30:7.3f} GiB   time {r['time_s']:7.3f} s")
    if args.interleaved_time:
        proc = subprocess.run(_worker_cmd(args, "interleaved"), capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"interleaved timing failed:\n{proc.stderr[-2000:]}")
        else:
            t = json.loads(proc.stdout.strip().splitlines()[-1])["times"]
            print(
                "  interleaved times (one process, round-robin): "
                + ", ".join(f"{k} {v:.3f} s" for k, v in t.items())
            )
            for ref in ("naive", "megatron"):
                print(f"  interleaved time fused/{ref} {t['fused'] / t[ref]:.2f}x")
    if "fused" in results:
        f = results["fused"]
        for ref in ("naive", "megatron"):
            if ref in results:
                r = results[ref]
                print(
                    f"  {ref}/fused: peak memory {r['peak_bytes'] / f['peak_bytes']:.2f}x less with fused, "
                    f"time fused/{ref} {f['time_s'] / r['time_s']:.2f}x"
                )


if __name__ == "__main__":
    main()
