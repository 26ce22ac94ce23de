"""rl.logprobs with the vocabulary split over 2 gloo processes (TP=2) vs the naive float64 full-vocab
computation on one process; padded vocab columns (global index >= vocab_size) included."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.support.reference_logprobs import reference_logprobs_and_entropy
from vepo_mcore.parallel.launch import run_processes
from vepo_mcore.rl.logprobs import logprobs_and_entropy

N = 11


def _data(padded: int, vocab: int, scale: float = 3.0):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(N, padded, generator=g, dtype=torch.float64) * scale
    logits[:, vocab:] = 40.0  # padding must not leak in
    targets = torch.randint(0, vocab, (N,), generator=g)
    w_lp, w_h = (
        torch.randn(N, generator=g, dtype=torch.float64),
        torch.randn(N, generator=g, dtype=torch.float64),
    )
    return logits, targets, w_lp, w_h


def _check(rank, world, padded, vocab, temperature, topk_frac, use_megatron_group, scale=3.0, chunk=4):
    logits, targets, w_lp, w_h = _data(padded, vocab, scale)
    shard = padded // world
    group = dist.group.WORLD
    if use_megatron_group:
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
        group = None  # must default to megatron's TP group
    x = logits[:, rank * shard : (rank + 1) * shard].float().clone().requires_grad_(True)
    lp, h = logprobs_and_entropy(x, targets, temperature, chunk, vocab, group=group, topk_frac=topk_frac)
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
    # Qwen-sized vocabulary, logits spread over ~50 (fp32 sums of 76k terms per shard), chunk by bytes
    _check(rank, world, 152_064, 151_665, 0.7, None, False, scale=5.5, chunk=None)
    _check(rank, world, 152_064, 151_665, 1.0, 0.2, False, scale=5.5, chunk=None)
    _global_std(rank)


def _global_std(rank):
    """std_scope 'global': the reward std all-reduced over the group equals the std of all rewards."""
    from vepo_mcore.rl.advantages import global_std, group_normalized_advantages

    everything = torch.tensor([0.5, 2.0, -1.0, 4.0, 3.0])
    mine = everything[:2] if rank == 0 else everything[2:]
    torch.testing.assert_close(global_std(mine, group=dist.group.WORLD), everything.std())
    mask = torch.ones(len(mine), 3, dtype=torch.bool)
    adv = group_normalized_advantages(mine, mask, torch.tensor([rank] * len(mine)), "global", eps=0.0)
    torch.testing.assert_close(adv[:, 0], (mine - mine.mean()) / everything.std())


def test_tp2_matches_float64_reference():
    run_processes(_all_cases, 2)


def _rl_micro_batches():
    import math

    from tests.dist.model_utils import VOCAB, batch
    from vepo_mcore.rl.experience import Experience

    out = []
    for seed in (11, 12):
        b = batch(seed, batch_size=2, seq=16)
        g = torch.Generator().manual_seed(seed)
        mask = torch.zeros(2, 16, dtype=torch.bool)
        mask[0, 8:] = True
        mask[1, 8:13] = True  # a shorter response
        exp = Experience(
            **b,
            position_ids=torch.arange(16).expand(2, 16),
            loss_mask=mask,
            old_logp=-math.log(VOCAB) + 0.3 * torch.randn(2, 16, generator=g),
            ref_logp=-math.log(VOCAB) + 0.3 * torch.randn(2, 16, generator=g),
            rewards=torch.randn(2, generator=g),
            group_ids=torch.tensor([seed, seed]),
            response_lengths=mask.sum(1),
            temperature=0.8,
        )
        out.append(exp)
    return out


def _rl_step(model, pp: int):
    """Forward + backward of the VEPO loss through megatron's schedule; (per-micro-batch losses, grads)."""
    from functools import partial

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from tests.dist.model_utils import VOCAB
    from vepo_mcore.config.rl import KLConfig, LossConfig
    from vepo_mcore.rl.losses.loss_func import rl_forward_step
    from vepo_mcore.rl.losses.vepo import VEPOOptions

    cfg = LossConfig(name="vepo", loss_agg="global_tokens", logprob_chunk_size=5,
                     options={"vepo": VEPOOptions(beta=0.01)})  # fmt: skip
    step = partial(rl_forward_step, cfg=cfg, kl=KLConfig(estimator="k3", coef=0.1), vocab_size=VOCAB)
    model.config.calculate_per_token_loss = True
    model.zero_grad()
    out = get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter(_rl_micro_batches()),
        model=[model],
        num_microbatches=2,
        seq_length=16,
        micro_batch_size=2,
        forward_only=False,
    )
    if not parallel_state.is_pipeline_last_stage():
        return None, None
    losses = torch.stack([x["loss"] for x in out])
    return losses, (model.decoder.final_layernorm.weight.grad.clone(), model.output_layer.weight.grad.clone())


def _rl_layouts(rank, world, tmp):
    from megatron.core import parallel_state

    from tests.dist.model_utils import load_model, save_model, tiny_cfg
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    def build(cfg, seed):
        init_model_parallel(cfg.parallel, seed=seed)
        return build_model(cfg)

    ref_model = build(tiny_cfg(tp=1), 1)
    save_model(ref_model, f"{tmp}/tp1")
    ref_losses, (ref_norm_grad, ref_out_grad) = _rl_step(ref_model, 1)
    assert ref_norm_grad.abs().sum() > 0 and torch.isfinite(ref_losses).all()
    for layout in (dict(tp=2), dict(pp=2)):
        model = build(tiny_cfg(**layout), 7)
        load_model(model, f"{tmp}/tp1")
        losses, grads = _rl_step(model, layout.get("pp", 1))
        if losses is None:
            continue
        torch.testing.assert_close(losses, ref_losses, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(grads[0], ref_norm_grad, atol=1e-5, rtol=1e-4)
        tp_rank, rows = parallel_state.get_tensor_model_parallel_rank(), grads[1].shape[0]
        torch.testing.assert_close(
            grads[1], ref_out_grad[tp_rank * rows : (tp_rank + 1) * rows], atol=1e-5, rtol=1e-4
        )


def test_rl_loss_in_megatron_schedule_tp2_and_pp2_equal_tp1(tmp_path):
    """The VEPO loss through megatron's forward_step/loss_func contract: logits stay vocab-parallel
    until rl.logprobs; TP=2 and PP=2 give TP=1's losses and gradients."""
    run_processes(_rl_layouts, 2, args=(str(tmp_path),))
