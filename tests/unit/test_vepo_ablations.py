"""Each VEPO ablation switch (recipes/toy/grid.py ABLATIONS) changes only its part of the loss: the
ablated loss equals VEPO's formula with that one piece swapped, and every other piece (advantages,
ratios, clip range, aggregation, entropy bonus) is the full loss's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vepo_mcore.config.rl import LossConfig
from vepo_mcore.rl.advantages import entropy_shaped_advantages, group_normalized_advantages
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.logprobs import policy_logprobs_and_entropy
from vepo_mcore.rl.losses import compute_loss
from vepo_mcore.rl.losses.common import policy_loss, policy_ratio
from vepo_mcore.rl.losses.vepo import VEPOOptions

FULL = LossConfig(name="vepo")
VEPO = VEPOOptions()
"""The full loss's own options (rl.loss.vepo); FULL holds the shared ones (rl.loss)."""
LENGTHS = [5, 3, 4, 5, 2, 4]
RATIOS = [0.6, 0.85, 1.0, 1.1, 1.25, 1.4]


def _batch(lengths=LENGTHS) -> RLBatch:
    """Two prompts x three responses; ratios spread across both clip bounds (1.25 lies between
    1 + eps_low and 1 + eps_high), entropies and rewards varied."""
    g = torch.Generator().manual_seed(0)
    b, t = len(lengths), max(lengths)
    mask = torch.arange(t).expand(b, t) < torch.tensor(lengths).unsqueeze(1)
    old = -2.0 + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64)
    ratio = torch.tensor(RATIOS, dtype=torch.float64)[torch.randint(0, len(RATIOS), (b, t), generator=g)]
    return RLBatch(
        logp=(old + ratio.log()).requires_grad_(True),
        old_logp=old,
        mask=mask,
        entropy=(0.1 + 3.0 * torch.rand(b, t, generator=g, dtype=torch.float64)).requires_grad_(True),
        rewards=torch.tensor([1.0, 0.2, 0.5, 0.9, 0.0, 0.3], dtype=torch.float64),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
    )


def _loss(batch: RLBatch, **change):
    """The full loss with one field changed, of rl.loss (eps_high, loss_agg) or rl.loss.vepo (alpha, ...)."""
    own = {key: change.pop(key) for key in list(change) if hasattr(VEPO, key)}
    options = {"vepo": dataclasses.replace(VEPO, **own)}
    return compute_loss(batch, dataclasses.replace(FULL, options=options, **change))


def _shaped(batch: RLBatch, std_scope: str = "microbatch") -> torch.Tensor:
    base = group_normalized_advantages(batch.rewards, batch.mask, batch.group_ids, std_scope, FULL.adv_eps)
    return entropy_shaped_advantages(base, batch.entropy, batch.mask, VEPO.alpha, VEPO.gamma)


def _same(a, b, keys):
    for key in keys:
        torch.testing.assert_close(a[key], b[key], atol=1e-12, rtol=0, msg=key)


RATIO_KEYS = ("rl/ratio_mean", "rl/ratio_min", "rl/ratio_max")
ADV_KEYS = ("rl/adv_mean", "rl/adv_std", "rl/adv_min", "rl/adv_max")


def test_full_vepo_is_the_formula_the_ablations_change():
    batch = _batch()
    loss, _ = _loss(batch)
    ref, _ = policy_loss(batch, FULL, None, _shaped(batch), entropy_coef=VEPO.beta)
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)


def test_no_entropy_shaping_gives_grpo_advantages_with_the_micro_batch_std():
    batch = _batch()
    loss, metrics = _loss(batch, alpha=0.0)
    grpo_microbatch = group_normalized_advantages(batch.rewards, batch.mask, batch.group_ids, "microbatch")
    ref, ref_metrics = policy_loss(batch, FULL, None, grpo_microbatch, entropy_coef=VEPO.beta)
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)
    _same(metrics, ref_metrics, ADV_KEYS)
    full_loss, full_metrics = _loss(batch)
    assert abs(float(full_loss - loss)) > 1e-4
    _same(metrics, full_metrics, (*RATIO_KEYS, "rl/entropy_bonus"))


def test_no_entropy_bonus_removes_only_the_bonus():
    batch = _batch()
    loss, metrics = _loss(batch, beta=0.0)
    full_loss, full_metrics = _loss(batch)
    assert "rl/entropy_bonus" not in metrics
    torch.testing.assert_close(loss, full_metrics["rl/pg_loss"], atol=1e-12, rtol=0)
    torch.testing.assert_close(full_loss, loss - full_metrics["rl/entropy_bonus"], atol=1e-12, rtol=0)
    _same(metrics, full_metrics, (*RATIO_KEYS, *ADV_KEYS, "rl/pg_loss", "rl/clip_frac"))
    (grad_logp, grad_h) = torch.autograd.grad(loss, [batch.logp, batch.entropy], allow_unused=True)
    (full_grad_logp, full_grad_h) = torch.autograd.grad(full_loss, [batch.logp, batch.entropy])
    torch.testing.assert_close(grad_logp, full_grad_logp, atol=1e-12, rtol=0)
    assert grad_h is None or not grad_h.any()
    assert full_grad_h.abs().sum() > 0


def test_symmetric_clip_is_eps_high_equal_to_eps_low():
    batch = _batch()
    loss, metrics = _loss(batch, eps_high=FULL.eps_low)
    ref, ref_metrics = policy_loss(
        batch, FULL, None, _shaped(batch), symmetric_clip=True, entropy_coef=VEPO.beta
    )
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)
    full_loss, full_metrics = _loss(batch)
    assert abs(float(full_loss - loss)) > 1e-6  # the ratio 1.25 is clipped now, with A > 0
    assert metrics["rl/clip_frac_high"] > full_metrics["rl/clip_frac_high"]
    _same(metrics, full_metrics, (*RATIO_KEYS, *ADV_KEYS, "rl/clip_frac_low", "rl/entropy_bonus"))


def test_group_std_changes_only_the_advantage_scale():
    batch = _batch()
    loss, metrics = _loss(batch, std_scope="group")
    ref, _ = policy_loss(batch, FULL, None, _shaped(batch, "group"), entropy_coef=VEPO.beta)
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)
    _, full_metrics = _loss(batch)
    assert abs(float(metrics["rl/adv_std"] - full_metrics["rl/adv_std"])) > 1e-4
    _same(metrics, full_metrics, (*RATIO_KEYS, "rl/entropy_bonus"))


def test_sequence_mean_equals_token_mean_on_equal_lengths_only():
    equal = _batch(lengths=[4] * 6)
    torch.testing.assert_close(_loss(equal, loss_agg="seq_mean")[0], _loss(equal)[0], atol=1e-12, rtol=0)
    batch = _batch()
    loss, metrics = _loss(batch, loss_agg="seq_mean")
    ref, _ = policy_loss(batch, FULL, None, _shaped(batch), agg="seq_mean", entropy_coef=VEPO.beta)
    torch.testing.assert_close(loss, ref, atol=1e-12, rtol=0)
    full_loss, full_metrics = _loss(batch)
    assert abs(float(full_loss - loss)) > 1e-4
    _same(metrics, full_metrics, (*RATIO_KEYS, *ADV_KEYS, "rl/clip_frac"))


@pytest.mark.parametrize("tau", [0.4, 1.0])
def test_tau1_ratio_reads_untempered_logprobs_and_keeps_the_tempered_entropy(tau):
    g = torch.Generator().manual_seed(1)
    vocab = 30
    old_logits = torch.randn(12, 32, generator=g, dtype=torch.float64)
    logits = old_logits + 0.3 * torch.randn(12, 32, generator=g, dtype=torch.float64)
    targets = torch.randint(0, vocab, (12,), generator=g)
    untempered = dataclasses.replace(FULL, ratio_mode="untempered")
    logp_t, h_t = policy_logprobs_and_entropy(logits, targets, FULL, vocab, tau)
    old_t, _ = policy_logprobs_and_entropy(old_logits, targets, FULL, vocab, tau)
    logp_u, h_u = policy_logprobs_and_entropy(logits, targets, untempered, vocab, tau)
    old_u, _ = policy_logprobs_and_entropy(old_logits, targets, untempered, vocab, tau)
    torch.testing.assert_close(h_u, h_t, atol=1e-12, rtol=0)  # shaping and bonus see the same entropy
    expected = torch.log_softmax(logits[:, :vocab], -1).gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(logp_u, expected, atol=1e-10, rtol=0)
    mask = torch.ones(1, 12, dtype=torch.bool)
    ratio_u = policy_ratio(RLBatch(logp=logp_u[None], old_logp=old_u[None], mask=mask), untempered)
    ratio_t = policy_ratio(RLBatch(logp=logp_t[None], old_logp=old_t[None], mask=mask), FULL)
    torch.testing.assert_close(ratio_u[0], (logp_u - old_u).exp(), atol=1e-12, rtol=0)
    assert (ratio_u - ratio_t).abs().max() > 1e-3 if tau != 1.0 else (ratio_u - ratio_t).abs().max() < 1e-12
    # the rest of the loss is VEPO's on those ratios: same advantages (same rewards, same entropy)
    fields = dict(mask=torch.ones(2, 6, dtype=torch.bool), rewards=torch.tensor([1.0, 0.0]),
                  group_ids=torch.tensor([0, 0]))  # fmt: skip
    _, m_u = compute_loss(RLBatch(logp=logp_u.view(2, 6), old_logp=old_u.view(2, 6), entropy=h_u.view(2, 6),
                                  **fields), untempered)  # fmt: skip
    _, m_t = compute_loss(RLBatch(logp=logp_t.view(2, 6), old_logp=old_t.view(2, 6), entropy=h_t.view(2, 6),
                                  **fields), FULL)  # fmt: skip
    _same(m_u, m_t, (*ADV_KEYS, "rl/entropy_bonus"))


def test_entropy_shaped_advantages_do_not_sum_to_zero_within_a_group():
    """docs/SPEC.md: the per-token factor (1 + alpha sg(H) gamma^t) breaks the appendix's zero sum;
    alpha = 0 on equal lengths keeps it."""
    batch = _batch(lengths=[4] * 6)
    groups = batch.group_ids == 0
    shaped = _shaped(batch)
    assert shaped[groups].sum(0).abs().max() > 1e-3
    base = group_normalized_advantages(batch.rewards, batch.mask, batch.group_ids, "microbatch")
    assert base[groups].sum(0).abs().max() < 1e-6  # float32 advantages
