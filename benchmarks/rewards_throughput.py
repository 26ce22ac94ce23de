"""Throughput of the RLVR reward terms on 1,000 FLORES pairs, single process.

    python benchmarks/rewards_throughput.py [--pairs 1000] [--repeats 3]

Prints samples/s of each verifiable term (length, format, lid, mixing), of all four together, and of
chrF++ (sacreBLEU, the default R_mt), and the ratio to chrF++ measured in the same run. Goal: the
verifiable terms together >= 1,000 samples/s so rewards never bottleneck a rollout step.
Model/lexicon loading happens once per process and is timed separately (warm-up).
"""

from __future__ import annotations

import argparse
import time

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.registry import run_reward
from vepo_mcore.translation.sample import Sample

VERIFIABLE = ("length", "format", "lid", "mixing")


def flores_pairs(n: int) -> list[Sample]:
    """n pairs cycling over the 90 directions (line i of direction i % 90)."""
    text = {code: load_flores(code, "devtest") for code in LANGS}
    directions = [(s, t) for s in LANGS for t in LANGS if s != t]
    samples = []
    for i in range(n):
        src, tgt = directions[i % len(directions)]
        line = i % len(text[src])
        samples.append(
            Sample(
                source=text[src][line],
                response=text[tgt][line],
                reference=text[tgt][line],
                src_lang=src,
                tgt_lang=tgt,
            )
        )
    return samples


def best_rate(fn, n: int, repeats: int) -> float:
    """Best samples/s over ``repeats`` runs (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = RewardsConfig()
    samples = flores_pairs(args.pairs)

    start = time.perf_counter()
    for term in VERIFIABLE + ("mt",):  # loads lid.176, the wordfreq lexicons, the length table
        run_reward(term, samples[:200], cfg)
    print(f"warm-up (model and lexicon loading): {time.perf_counter() - start:.2f} s")

    rates = {
        term: best_rate(lambda t=term: run_reward(t, samples, cfg), len(samples), args.repeats)
        for term in VERIFIABLE
    }
    together = best_rate(
        lambda: [run_reward(t, samples, cfg) for t in VERIFIABLE], len(samples), args.repeats
    )
    chrf = best_rate(lambda: run_reward("mt", samples, cfg), len(samples), args.repeats)
    print(f"{args.pairs} FLORES pairs over 90 directions, single process, best of {args.repeats}")
    for term, rate in rates.items():
        print(f"  {term:<8s} {rate:10.0f} samples/s")
    print(f"  verifiable terms together: {together:10.0f} samples/s  ({together / chrf:.2f}x chrF++)")
    print(f"  chrF++ (sacreBLEU):        {chrf:10.0f} samples/s  (reference)")
    print(f"  goal >= 1,000 samples/s for the verifiable terms: {'met' if together >= 1000 else 'NOT met'}")


if __name__ == "__main__":
    main()
