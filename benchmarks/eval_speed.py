"""Time BLEU + chrF + chrF++ over all 90 FLORES-200 directions x 1,012 sentences (no COMET), serial vs parallel.

  .venv/bin/python benchmarks/eval_speed.py [--workers N] [--max-sentences N] [--bootstrap]

Hypotheses are deterministic degradations of the references (so every metric has real work to
do). Prints the serial time (the reference, one process), the parallel time and their ratio,
and checks both give identical scores.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from vepo_mcore.eval.metrics import DEFAULT_METRICS
from vepo_mcore.eval.runner import DirectionTask, score_all
from vepo_mcore.languages import load_flores
from vepo_mcore.translation.directions import ALL_DIRECTIONS


def degrade(lines: list[str]) -> list[str]:
    return [line[: len(line) * (60 + 10 * (i % 4)) // 100] for i, line in enumerate(lines)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-sentences", type=int, default=None)
    parser.add_argument(
        "--bootstrap", action="store_true", help="also 1,000 paired resamples vs the source copy"
    )
    args = parser.parse_args()
    tasks = []
    for d in ALL_DIRECTIONS:
        sources, refs = load_flores(d.src)[: args.max_sentences], load_flores(d.tgt)[: args.max_sentences]
        baseline = sources if args.bootstrap else None
        tasks.append(
            DirectionTask(d, sources, refs, degrade(refs), baseline, DEFAULT_METRICS, None, 1000, 12345)
        )
    n = sum(len(t.references) for t in tasks)
    print(
        f"{len(tasks)} directions, {n} sentences, metrics {', '.join(DEFAULT_METRICS)}, bootstrap={args.bootstrap}"
    )
    start, cpu = time.perf_counter(), time.process_time()
    serial = score_all(tasks, workers=1, progress=True)
    t_serial, cpu_serial = time.perf_counter() - start, time.process_time() - cpu
    start, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    parallel = score_all(tasks, workers=args.workers, progress=True)
    t_parallel = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_parallel = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    if [r.scores for r in serial] != [r.scores for r in parallel]:
        raise SystemExit("serial and parallel scores differ")
    print(f"serial (1 process):      {t_serial:7.2f} s  ({n / t_serial:,.0f} sentences/s)")
    print(f"parallel ({args.workers} processes): {t_parallel:7.2f} s  ({n / t_parallel:,.0f} sentences/s)")
    print(f"speed-up parallel/serial: {t_serial / t_parallel:.2f}x (wall clock)")
    # CPU seconds show the work itself, independent of other load on a shared machine
    print(
        f"CPU seconds: serial {cpu_serial:.1f}, parallel workers {cpu_parallel:.1f} (overhead {cpu_parallel / cpu_serial:.2f}x)"
    )
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
