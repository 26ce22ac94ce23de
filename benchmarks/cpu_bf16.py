"""The project's train step in bf16 (fp32 master weights) against the same step in fp32, on CPU.

    .venv/bin/python benchmarks/cpu_bf16.py                 # the toy's SFT shape: 8 x 256 tokens
    .venv/bin/python benchmarks/cpu_bf16.py --steps 6 --vocab 151665

One process, the threads torch starts with, the toy recipe's model (4 layers, hidden 256, tied
embeddings, its 26,547-id vocabulary by default) and micro batch (8 sequences of 256 tokens). Two
LMTrainers from the same seed, one with training.bf16, train on the same tokens, their steps
alternating after a warm-up step each. Prints:
- ratio: fp32 step time / bf16 step time (medians; higher is faster in bf16). On a CPU with AMX the
  bf16 GEMMs run on its tile unit; without AMX or AVX512-BF16 this reads below 1.
- the loss of both after the last step and their difference (bf16 rounding, not a drift).
Ends with one JSON line {"bench": "cpu_bf16", "ratio": r, "higher_is_better": true, ...}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.train_step import _config, _dataset  # noqa: E402


def _trainer(seq: int, vocab: int, micro: int, bf16: bool):
    from vepo_mcore.training.forward import forward_step
    from vepo_mcore.training.trainer import LMTrainer

    cfg = _config(seq, vocab)
    cfg.training.micro_batch_size = cfg.training.global_batch_size = micro
    cfg.training.bf16 = bf16
    return LMTrainer(cfg, _dataset(seq, vocab, n=4 * micro), None, forward_step, None, None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--vocab", type=int, default=26_547, help="the toy recipe's vocabulary")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    import torch

    from vepo_mcore.parallel import init_model_parallel

    init_model_parallel(_config(args.seq, args.vocab).parallel, seed=1234)  # one process, gloo
    trainers = {
        dtype: _trainer(args.seq, args.vocab, args.micro, dtype == "bf16") for dtype in ("fp32", "bf16")
    }
    times: dict[str, list[float]] = {dtype: [] for dtype in trainers}
    losses: dict[str, float] = {}
    for trainer in trainers.values():
        trainer.step()  # warm-up: gradients and Adam state exist before anything is measured
    for _ in range(args.steps):
        for dtype, trainer in trainers.items():
            start = time.perf_counter()
            row, _ = trainer.step()
            times[dtype].append(time.perf_counter() - start)
            losses[dtype] = row["train/loss"]
    median = {dtype: statistics.median(values) for dtype, values in times.items()}
    ratio = median["fp32"] / median["bf16"]
    amx = torch.cpu._is_amx_tile_supported()
    print(f"threads {torch.get_num_threads()}, AMX {'yes' if amx else 'no'}, {args.micro} x {args.seq} tokens a step, "
          f"vocabulary {args.vocab:,}, {args.steps} steps each after a warm-up")  # fmt: skip
    print(
        f"step time, median: fp32 {median['fp32']:.3f} s, bf16 {median['bf16']:.3f} s -> ratio {ratio:.2f}x"
    )
    print(f"loss after the last step: fp32 {losses['fp32']:.4f}, bf16 {losses['bf16']:.4f} "
          f"(difference {losses['bf16'] - losses['fp32']:+.4f})")  # fmt: skip
    record = {"bench": "cpu_bf16", "ratio": round(ratio, 3), "higher_is_better": True, "amx": amx,
              "step_s": {k: round(v, 4) for k, v in median.items()},
              "loss": {k: round(v, 4) for k, v in losses.items()}}  # fmt: skip
    print(json.dumps(record))


if __name__ == "__main__":
    main()
