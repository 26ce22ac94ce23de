"""Fused vocab-parallel log-prob + entropy (vepo_mcore.rl.logprobs) against the naive computation a
user would write: log_softmax over the full [T, V] fp32 logits / tau, gather, entropy -(p * logp).sum,
backward through autograd. Forward + backward through both outputs, at temperature 0.7.

    .venv/bin/python benchmarks/logprob_entropy.py                     # T=2048, V=152,064, fp32
    .venv/bin/python benchmarks/logprob_entropy.py --tokens 512 --dtype bf16 --chunk-size 256

Prints, for each method:
- copies: its peak memory above the inputs, in copies of the [T, V] logits (the logits' gradient,
  which every method must produce, is one copy). Each method runs once in a fresh subprocess; on CPU
  the peak is ru_maxrss minus the RSS once the inputs exist, on CUDA max_memory_allocated minus the
  memory allocated then. Goal for fused: <= 1.05.
- time: fused and naive timed round-robin in one process (the load of a shared machine drifts, and
  alternating exposes both to the same drift), after one warm-up round; the minimum and the median of
  the repeats. time_vs_naive (the JSON line's ratio) is min(fused) / min(naive): the least-disturbed
  run of each. Goal: <= 0.25.
- the largest error of log-prob and entropy against a float64 computation on the same logits (fused
  and naive fp32). Goal for fused: <= 1e-5.

Ends with one JSON line: {"bench": "logprob_entropy", "ratio": time_vs_naive, "goal": 0.25, ...}.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEMPERATURE = 0.7
TIME_GOAL, COPIES_GOAL, ERROR_GOAL = 0.25, 1.05, 1e-5


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def naive(logits, targets):
    import torch

    logp_all = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def fused(logits, targets, chunk_size):
    from vepo_mcore.rl.logprobs import logprobs_and_entropy

    return logprobs_and_entropy(logits, targets, TEMPERATURE, chunk_size)


def _inputs(args):
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(args.tokens, args.vocab, generator=g, device=dev).mul_(args.logit_scale)
    logits = logits.to(dtype).requires_grad_(True)
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g, device=dev)
    weights = torch.randn(args.tokens, generator=g, device=dev)
    return logits, targets, weights


def _step(fn, logits, weights) -> tuple[float, tuple]:
    """Seconds for one forward (fn) + backward of the weighted log-prob and entropy sums; the outputs."""
    import torch

    logits.grad = None
    start = time.perf_counter()
    logp, entropy = fn()
    ((logp * weights).sum() + (entropy * weights).sum()).backward()
    if logits.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, (logp.detach(), entropy.detach())


def _methods(args, logits, targets):
    return {
        "fused": lambda: fused(logits, targets, args.chunk_size),
        "naive": lambda: naive(logits, targets),
    }


def measure_memory(args) -> dict:
    """One step of args.method in this (fresh) process: its peak memory above the inputs, in bytes."""
    import torch

    import vepo_mcore.rl.logprobs  # noqa: F401  imported before the baseline: the step's memory, not the module's

    logits, targets, weights = _inputs(args)
    fn = _methods(args, logits, targets)[args.method]
    if logits.is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_bytes()
    _step(fn, logits, weights)
    if logits.is_cuda:
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak_bytes": peak - base, "device": str(logits.device)}


def float64_errors(logits, targets, outputs, rows: int = 64) -> tuple[float, float]:
    """Largest |logp - ref| and |entropy - ref| against float64, computed a few rows at a time."""
    import torch

    logp, entropy = outputs
    err_lp = err_h = 0.0
    for start in range(0, logits.shape[0], rows):
        sl = slice(start, start + rows)
        logp_all = torch.log_softmax(logits[sl].detach().double() / TEMPERATURE, dim=-1)
        ref_lp = logp_all.gather(-1, targets[sl].unsqueeze(-1)).squeeze(-1)
        ref_h = -(logp_all.exp() * logp_all).sum(-1)
        err_lp = max(err_lp, (logp[sl].double() - ref_lp).abs().max().item())
        err_h = max(err_h, (entropy[sl].double() - ref_h).abs().max().item())
    return err_lp, err_h


def _worker_cmd(args, method: str) -> list[str]:
    return [
        sys.executable, __file__, "--memory-of", method, f"--tokens={args.tokens}", f"--vocab={args.vocab}",
        f"--dtype={args.dtype}", f"--chunk-size={args.chunk_size or 0}", f"--logit-scale={args.logit_scale}",
    ]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="fp32")
    p.add_argument("--chunk-size", type=int, default=None, help="tokens per chunk (default: sized by bytes)")
    p.add_argument("--logit-scale", type=float, default=4.0, help="std of the random logits")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--memory-of", help=argparse.SUPPRESS)  # internal: measure one method in this process
    args = p.parse_args()
    args.chunk_size = args.chunk_size or None
    if args.memory_of:
        args.method = args.memory_of
        print(json.dumps(measure_memory(args)))
        return
    import torch

    from vepo_mcore.rl.logprobs import chunk_rows

    copies = {}
    logits_bytes = args.tokens * args.vocab * 4  # one fp32 copy of the [T, V] logits
    for method in ("fused", "naive"):
        proc = subprocess.run(_worker_cmd(args, method), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{method}: memory run failed:\n{proc.stderr[-2000:]}")
        copies[method] = json.loads(proc.stdout.strip().splitlines()[-1])["peak_bytes"] / logits_bytes

    logits, targets, weights = _inputs(args)
    fns = _methods(args, logits, targets)
    times = {name: [] for name in fns}
    outputs = {}
    for i in range(args.repeats + 1):
        for name, fn in fns.items():
            elapsed, outputs[name] = _step(fn, logits, weights)
            if i > 0:  # the first round warms up
                times[name].append(elapsed)
    errors = {name: float64_errors(logits, targets, out) for name, out in outputs.items()}

    chunk = args.chunk_size or chunk_rows(args.vocab, logits.dtype)
    print(
        f"tokens={args.tokens} vocab={args.vocab} dtype={args.dtype} tau={TEMPERATURE} "
        f"logit std={args.logit_scale} fused chunk={chunk} tokens device={logits.device} "
        f"threads={torch.get_num_threads()}"
    )
    for name in fns:
        t, (e_lp, e_h) = times[name], errors[name]
        print(
            f"  {name:6s} copies of [T, V] {copies[name]:5.3f}   time min {min(t):6.3f} s "
            f"median {statistics.median(t):6.3f} s   max error vs float64: logp {e_lp:.1e}, entropy {e_h:.1e}"
        )
    time_vs_naive = min(times["fused"]) / min(times["naive"])
    median_vs_naive = statistics.median(times["fused"]) / statistics.median(times["naive"])
    print(
        f"fused: {copies['fused']:.3f} copies (goal <= {COPIES_GOAL}), time {time_vs_naive:.3f}x naive "
        f"(medians {median_vs_naive:.3f}x; goal <= {TIME_GOAL}), error vs float64 "
        f"{max(errors['fused']):.1e} (goal <= {ERROR_GOAL:g})"
    )
    record = {
        "bench": "logprob_entropy",
        "ratio": round(time_vs_naive, 4),
        "goal": TIME_GOAL,
        "higher_is_better": False,
        "copies": round(copies["fused"], 4),
        "copies_goal": COPIES_GOAL,
        "time_vs_naive": round(time_vs_naive, 4),
        "time_vs_naive_median": round(median_vs_naive, 4),
        "max_err_logp": errors["fused"][0],
        "max_err_entropy": errors["fused"][1],
        "err_goal": ERROR_GOAL,
        "naive_copies": round(copies["naive"], 4),
        "naive_max_err_logp": errors["naive"][0],
        "naive_max_err_entropy": errors["naive"][1],
        "tokens": args.tokens,
        "vocab": args.vocab,
        "dtype": args.dtype,
        "chunk_tokens": chunk,
        "device": str(logits.device),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
