"""Monte-Carlo KL estimators k1, k2, k3 (Schulman's "Approximating KL divergence"; paper appendix).

For tokens sampled from the policy pi, with log_ratio = log pi_ref(x) - log pi(x):
    k1 = -log_ratio                     unbiased, high variance, can be negative
    k2 = 0.5 * log_ratio ** 2           biased, low variance
    k3 = exp(log_ratio) - 1 - log_ratio unbiased, low variance, >= 0
All functions are elementwise on tensors of any shape and differentiate through `logp`.

k3 is bounded as verl bounds its "low_var_kl": the log-ratio is clamped to [-20, 20] and k3 to
[-10, 10] (zero gradient beyond). Unbounded, a log-ratio of 25 gives k3 = 7e10 with a gradient of
2e9, and one such token swamps a batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp - logp) ** 2


K3_LOG_RATIO_BOUND = 20.0
K3_BOUND = 10.0


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_logp - logp).clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return (torch.expm1(log_ratio) - log_ratio).clamp(-K3_BOUND, K3_BOUND)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_estimate(name: str, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate `name` (k1/k2/k3) of pi (logp) from pi_ref (ref_logp)."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; known: {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name](logp, ref_logp)


def kl_metrics(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Masked token means of all three estimators, detached: {'rl/kl_k1': ..., 'rl/kl_k2': ..., 'rl/kl_k3': ...}."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp_min(1)
    with torch.no_grad():
        return {f"rl/kl_{k}": (fn(logp, ref_logp) * m).sum() / n for k, fn in KL_ESTIMATORS.items()}
