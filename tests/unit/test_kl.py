"""KL estimators k1/k2/k3 against their definitions, and their Monte-Carlo behaviour."""

from __future__ import annotations

import math

import pytest
import torch

from vepo_mcore.rl.kl import kl_estimate, kl_metrics


def test_estimators_on_hand_values():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    lr = [-0.5, 1.0]  # ref - logp
    torch.testing.assert_close(kl_estimate("k1", logp, ref), torch.tensor([0.5, -1.0]))
    torch.testing.assert_close(kl_estimate("k2", logp, ref), torch.tensor([0.5 * x * x for x in lr]))
    torch.testing.assert_close(kl_estimate("k3", logp, ref), torch.tensor([math.exp(x) - 1 - x for x in lr]))
    with pytest.raises(ValueError, match="known"):
        kl_estimate("k4", logp, ref)


def test_monte_carlo_estimates_of_true_kl():
    """Sampling from q: k1 and k3 are unbiased for KL(q || p); k3 is never negative."""
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(6, generator=g), 0).double()
    p = torch.softmax(torch.randn(6, generator=g), 0).double()
    true_kl = (q * (q.log() - p.log())).sum()
    x = torch.multinomial(q, 200_000, replacement=True, generator=g)
    logq, logp = q.log()[x], p.log()[x]
    assert abs(kl_estimate("k1", logq, logp).mean() - true_kl) < 0.02
    assert abs(kl_estimate("k3", logq, logp).mean() - true_kl) < 0.02
    assert kl_estimate("k3", logq, logp).min() >= 0


def test_kl_metrics_are_masked_means():
    logp = torch.tensor([[-1.0, -2.0, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    m = kl_metrics(logp, ref, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(m["rl/kl_k1"], torch.tensor(-0.25))
    assert set(m) == {"rl/kl_k1", "rl/kl_k2", "rl/kl_k3"}


def test_k3_is_bounded_like_verl():
    """Unbounded, a log-ratio of 25 gives k3 = 7e10 with a gradient of 2e9 (verl clamps to [-10, 10])."""
    logp = torch.tensor([-25.0, 0.0, -1.0], requires_grad=True)
    ref = torch.tensor([0.0, -25.0, 0.0])
    k3 = kl_estimate("k3", logp, ref)
    assert k3[0].item() == 10.0 and k3[1].item() == 10.0  # 7e10 and exp(-25) - 1 + 25 = 24, bounded
    assert k3[2].item() == pytest.approx(math.exp(1) - 2)  # inside the bounds: the exact value
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0] == 0.0
    assert logp.grad[2].item() == pytest.approx(1 - math.exp(1))
