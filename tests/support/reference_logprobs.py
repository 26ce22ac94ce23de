"""The naive log-prob + entropy reference for tests of vepo_mcore.rl.logprobs and models/output_loss."""

from __future__ import annotations

import math

import torch


def reference_logprobs_and_entropy(
    full_logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    vocab_size: int | None = None,
    topk_frac: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive full-vocab computation the fused kernels are checked against: log_softmax + gather +
    entropy.

    full_logits: [..., V_pad] (all columns, one process); computed in the input's dtype.
    """
    z = full_logits[..., : (vocab_size or full_logits.shape[-1])] / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    p = logp_all.exp()
    if topk_frac is None:
        return logp, -(p * logp_all).sum(-1)
    k = max(1, math.ceil(topk_frac * z.shape[-1]))
    top = logp_all.topk(k, dim=-1).values
    return logp, -(top.exp() * top).sum(-1)
