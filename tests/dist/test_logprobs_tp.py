"""rl.logprobs with the vocabulary split over 2 gloo processes (TP=2) vs the naive float64 full-vocab
computation on one process; padded vocab columns (global index >= vocab_size) included."""

from __future__ import annotations

import torch
import torch.distributed as dist

from vepo_mcore.parallel.launch import run_processes
from vepo_mcore.rl.logprobs import logprobs_and_entropy, reference_logprobs_and_entropy

N = 11


def _data(padded: int, vocab: int):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(N, padded, generator=g, dtype=torch.float64) * 3
    logits[:, vocab:] = 40.0  # padding must not leak in
    targets = torch.randint(0, vocab, (N,), generator=g)
    w_lp, w_h = (
        torch.randn(N, generator=g, dtype=torch.float64),
        torch.randn(N, generator=g, dtype=torch.float64),
    )
    return logits, targets, w_lp, w_h


def _check(rank, world, padded, vocab, temperature, topk_frac, use_megatron_group):
    logits, targets, w_lp, w_h = _data(padded, vocab)
    shard = padded // world
    group = dist.group.WORLD
    if use_megatron_group:
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        group = None  # must default to megatron's TP group
    x = logits[:, rank * shard : (rank + 1) * shard].float().clone().requires_grad_(True)
    lp, h = logprobs_and_entropy(x, targets, temperature, 4, vocab, group=group, topk_frac=topk_frac)
    ((lp * w_lp.float()).sum() + (h * w_h.float()).sum()).backward()

    y = logits.clone().requires_grad_(True)
    ref_lp, ref_h = reference_logprobs_and_entropy(y, targets, temperature, vocab, topk_frac)
    ((ref_lp * w_lp).sum() + (ref_h * w_h).sum()).backward()
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(h.double(), ref_h, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        x.grad.double(), y.grad[:, rank * shard : (rank + 1) * shard], atol=1e-5, rtol=0
    )


def _all_cases(rank, world):
    # rank 1 holds 7 real + 3 padding columns
    _check(rank, world, 20, 17, 0.7, None, False)
    _check(rank, world, 20, 17, 1.0, 0.2, False)
    # rank 1 holds padding only
    _check(rank, world, 20, 9, 1.3, None, False)
    _check(rank, world, 20, 9, 1.0, 0.5, False)
    _check(rank, world, 20, 17, 0.7, None, True)


def test_tp2_matches_float64_reference():
    run_processes(_all_cases, 2)
