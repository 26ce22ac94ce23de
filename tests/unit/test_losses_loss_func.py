"""rl_loss_func: megatron's (loss, num_tokens, metrics) contract on top of rl.logprobs + the registry."""

from __future__ import annotations

import torch

from tests.support.reference_logprobs import reference_logprobs_and_entropy
from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.experience import Experience
from vepo_mcore.rl.losses import compute_loss
from vepo_mcore.rl.losses.loss_func import rl_loss_func

VOCAB, PADDED = 30, 32


def _micro(seed=0, temperature=1.0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[:, 2:] = True
    mask[2, 5] = False
    return Experience(
        tokens=torch.randint(0, VOCAB, (3, 6), generator=g),
        labels=torch.randint(0, VOCAB, (3, 6), generator=g),
        position_ids=torch.arange(6).expand(3, 6),
        loss_mask=mask,
        old_logp=-3.4 + 0.2 * torch.randn(3, 6, generator=g),
        ref_logp=-3.4 + 0.2 * torch.randn(3, 6, generator=g),
        rewards=torch.tensor([1.0, 0.0, 0.5]),
        group_ids=torch.tensor([0, 0, 0]),
        response_lengths=mask.sum(1),
        temperature=temperature,
    ), torch.randn(3, 6, PADDED, generator=g, dtype=torch.float64)


def _selected(logits, micro):
    """What QwenGPTModel returns for output_mask=loss_mask: the masked positions' logits, [1, N, V]."""
    return logits[micro.loss_mask].unsqueeze(0)


def _reference(micro, logits, cfg, kl, **batch_extra):
    x = logits.clone().requires_grad_(True)
    logp, ent = reference_logprobs_and_entropy(x, micro.labels, micro.temperature, VOCAB)
    fields = {k: getattr(micro, k) for k in ("old_logp", "ref_logp", "rewards", "group_ids", "temperature")}
    loss, _ = compute_loss(
        RLBatch(logp=logp, entropy=ent, mask=micro.loss_mask, **fields, **batch_extra), cfg, kl
    )
    loss.backward()
    return loss.detach(), x.grad


def test_global_tokens_returns_the_token_sum_and_count():
    micro, logits = _micro(temperature=0.7)
    cfg = LossConfig(name="vepo", loss_agg="global_tokens", logprob_chunk_size=4)
    kl = KLConfig(estimator="k2", coef=0.1)
    x = logits.clone().requires_grad_(True)
    loss, num_tokens, metrics = rl_loss_func(micro, cfg, kl, VOCAB, _selected(x, micro))
    loss.backward()
    n = int(micro.loss_mask.sum())
    assert int(num_tokens) == n
    # megatron (calculate_per_token_loss) divides by the global token count: here the global batch is this one
    ref_loss, ref_grad = _reference(micro, logits, cfg, kl, global_num_tokens=float(n))
    torch.testing.assert_close(loss / n, ref_loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(x.grad / n, ref_grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        metrics["loss"].double(), torch.tensor([float(loss), float(n)], dtype=torch.float64)
    )
    assert "rl/kl_k3" in metrics and "rl/clip_frac_high" in metrics


def test_token_mean_counts_as_one():
    micro, logits = _micro(1)
    cfg = LossConfig(name="grpo")
    loss, num_tokens, _ = rl_loss_func(micro, cfg, None, VOCAB, _selected(logits.float(), micro))
    assert int(num_tokens) == 1
    ref_loss, _ = _reference(micro, logits, cfg, None)
    torch.testing.assert_close(loss.double(), ref_loss, atol=1e-5, rtol=0)


def test_scaled_ratio_uses_untempered_logprobs_but_the_entropy_at_the_sampling_tau():
    """ratio_mode 'scaled': r = exp((logp - old) / tau) on log softmax(z); the entropy (VEPO shaping and
    bonus) is the sampling policy's, softmax(z / tau), not softmax(z)."""
    micro, logits = _micro(1, temperature=0.5)
    cfg = LossConfig(name="vepo", ratio_mode="scaled", logprob_chunk_size=4)
    x = logits.clone().requires_grad_(True)
    loss, _, metrics = rl_loss_func(micro, cfg, None, VOCAB, _selected(x, micro))
    loss.backward()
    y = logits.clone().requires_grad_(True)
    logp, _ = reference_logprobs_and_entropy(y, micro.labels, 1.0, VOCAB)
    _, ent = reference_logprobs_and_entropy(y, micro.labels, 0.5, VOCAB)
    fields = {k: getattr(micro, k) for k in ("old_logp", "ref_logp", "rewards", "group_ids", "temperature")}
    ref_loss, ref_metrics = compute_loss(RLBatch(logp=logp, entropy=ent, mask=micro.loss_mask, **fields), cfg)
    ref_loss.backward()
    torch.testing.assert_close(loss.detach().double(), ref_loss.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(x.grad, y.grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        metrics["rl/entropy"].double(), ref_metrics["rl/entropy"].double(), atol=1e-6, rtol=0
    )
    _, ent_tau1 = reference_logprobs_and_entropy(logits, micro.labels, 1.0, VOCAB)
    m = micro.loss_mask
    assert abs(float((ent_tau1 * m).sum() / m.sum()) - float(metrics["rl/entropy"])) > 0.1
