"""The builder's TP/PP invariances: the same weights give the same logits, losses and optimizer
updates whatever the parallel layout (weights move between layouts through dist_checkpointing)."""

from __future__ import annotations

import torch

from tests.dist.model_utils import (
    VOCAB,
    batch,
    gather_logits,
    load_model,
    megatron_step,
    positions,
    save_model,
    tiny_cfg,
    wrap_ddp,
)
from vepo_mcore.parallel.launch import run_processes


def _build(cfg, seed=1):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    init_model_parallel(cfg.parallel, seed=seed)
    return build_model(cfg)


def _tp_logits(rank, world, tmp, tied):
    b = batch(0)
    ref_model = _build(tiny_cfg(tp=1, tie_word_embeddings=tied))
    save_model(ref_model, f"{tmp}/tp1")
    with torch.no_grad():
        ref = ref_model(b["tokens"], positions(b["tokens"]), None)
    model = _build(tiny_cfg(tp=2, tie_word_embeddings=tied), seed=7)
    load_model(model, f"{tmp}/tp1")
    with torch.no_grad():
        out = gather_logits(model(b["tokens"], positions(b["tokens"]), None))
    assert out.shape == ref.shape
    diff = (out[..., :VOCAB] - ref[..., :VOCAB]).abs().max().item()
    assert diff <= 1e-5, f"TP=2 logits differ from TP=1 by {diff}"


def test_tp2_logits_equal_tp1(tmp_path):
    run_processes(_tp_logits, 2, args=(str(tmp_path), False))


def test_tp2_logits_equal_tp1_tied_embeddings(tmp_path):
    run_processes(_tp_logits, 2, args=(str(tmp_path), True))


def _pp_loss(rank, world, tmp):
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    batches = [batch(1), batch(2)]
    ref_model = _build(tiny_cfg(pp=1))
    save_model(ref_model, f"{tmp}/pp1")
    with torch.no_grad():
        ref = torch.stack(
            [ref_model(b["tokens"], positions(b["tokens"]), None, labels=b["labels"]).mean() for b in batches]
        )

    model = _build(tiny_cfg(pp=2), seed=7)
    load_model(model, f"{tmp}/pp1")

    def forward_step(data_iterator, module):
        b = next(data_iterator)
        out = module(b["tokens"], positions(b["tokens"]), None, labels=b["labels"])
        return out, lambda t: (t.float().mean(), {"loss": t.float().mean().detach()})

    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(batches),
        model=[model],
        num_microbatches=2,
        seq_length=16,
        micro_batch_size=2,
        forward_only=True,
    )
    if parallel_state.is_pipeline_last_stage():
        got = torch.stack([x["loss"] for x in losses])
        assert torch.allclose(got, ref, atol=1e-6, rtol=0), (got, ref)
    else:
        assert not losses


def test_pp2_loss_equals_pp1(tmp_path):
    run_processes(_pp_loss, 2, args=(str(tmp_path),))


def _one_step(rank, world, tmp):
    from megatron.core import parallel_state

    batches = [batch(3), batch(4)]
    # SGD makes the update proportional to the gradient, so the comparison checks gradients
    # tightly (Adam's first step is ~lr * sign(g) and amplifies float round-off of tiny grads).
    step = dict(lr=0.5, optimizer="sgd")
    # Reference: TP=1, PP=1 (DP=4 with identical data on every rank == one process).
    ref_model = _build(tiny_cfg())
    save_model(ref_model, f"{tmp}/init")
    ref_loss = megatron_step(wrap_ddp(ref_model), batches, tiny_cfg(), **step)
    save_model(ref_model, f"{tmp}/ref_after")

    model = _build(tiny_cfg(tp=2, pp=2), seed=7)
    load_model(model, f"{tmp}/init")
    loss = megatron_step(wrap_ddp(model), batches, tiny_cfg(tp=2, pp=2), **step)
    if parallel_state.is_pipeline_last_stage():
        assert abs(loss - ref_loss) < 1e-5, (loss, ref_loss)
    save_model(model, f"{tmp}/tp2pp2_after")

    # Compare the updated weights in the TP=1 layout.
    after_ref, after = _build(tiny_cfg()), _build(tiny_cfg())
    load_model(after_ref, f"{tmp}/ref_after")
    load_model(after, f"{tmp}/tp2pp2_after")
    init = _build(tiny_cfg())
    load_model(init, f"{tmp}/init")
    moved = 0.0
    for (name, p_ref), (_, p), (_, p0) in zip(
        after_ref.named_parameters(), after.named_parameters(), init.named_parameters()
    ):
        assert torch.allclose(p, p_ref, atol=1e-6, rtol=0), f"{name}: max diff {(p - p_ref).abs().max()}"
        moved = max(moved, (p_ref - p0).abs().max().item())
    assert moved > 1e-3, "the optimizer step did not change the weights"


def test_tp2_pp2_optimizer_step_equals_single_layout(tmp_path):
    run_processes(_one_step, 4, args=(str(tmp_path),))


def _loss_goes_down(rank, world):
    cfg = tiny_cfg(num_layers=2)
    model = wrap_ddp(_build(cfg))
    fixed = [batch(5)]
    losses = [megatron_step(model, fixed, cfg, lr=3e-3) for _ in range(8)]
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_few_steps_lower_the_loss():
    run_processes(_loss_goes_down, 1)
