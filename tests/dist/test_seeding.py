"""init_model_parallel seeds every RNG a checkpoint saves: two processes given one seed start from
the same python, numpy, torch and megatron-tracker states (unseeded, each process draws its own
from OS entropy, and a resumed run could never end in an uninterrupted run's RNG states)."""

from __future__ import annotations

import torch

from harness.faults import same_value
from vepo_mcore.parallel.launch import run_processes


def _save_rng_state(rank, world, out: str, seed: int):
    from vepo_mcore.config import JobConfig
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training.checkpointing import rng_state

    init_model_parallel(JobConfig().parallel, seed=seed)
    torch.save(rng_state(), out)


def test_one_seed_gives_one_rng_state_in_every_process(tmp_path):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        run_processes(_save_rng_state, 1, args=(str(tmp_path / f"{name}.pt"), seed))
    a, b, c = (torch.load(tmp_path / f"{name}.pt", weights_only=False) for name in "abc")
    assert a.keys() == {"random", "numpy", "torch", "cuda", "tracker"}
    differ = [key for key in a if not same_value(a[key], b[key])]
    assert not differ, f"one seed, two processes: {differ} differ"
    assert not any(same_value(a[key], c[key]) for key in ("random", "numpy", "torch"))
