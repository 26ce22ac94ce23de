"""`RLBatch`: the typed record of tensors a policy loss consumes (one micro-batch).

Rows are responses, columns response-token positions ([B, T], right-padded); `mask` marks the
real response tokens. Tensors that carry gradient: `logp`, `entropy` (from
rl.logprobs.logprobs_and_entropy of the current policy) and `values` (the critic). Everything
else is data from the rollout. Fields a loss does not need may stay None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

TOKEN_FIELDS = ("old_logp", "mask", "entropy", "ref_logp", "advantages", "values", "old_values", "returns",
                "rollout_is_weights")  # fmt: skip
"""Fields that must have logp's [B, T] shape."""


@dataclass(kw_only=True)
class RLBatch:
    """One micro-batch of responses, [B, T] unless stated."""

    logp: torch.Tensor
    """Log-probs of the taken tokens under the current tempered policy (with gradient)."""
    old_logp: torch.Tensor
    """Log-probs under the policy that sampled the rollout (same temperature), no gradient."""
    mask: torch.Tensor
    """1 for response tokens that count in the loss, 0 for padding (bool or float)."""
    entropy: torch.Tensor | None = None
    """Entropy of the current tempered policy at each position (with gradient)."""
    ref_logp: torch.Tensor | None = None
    """Log-probs under the frozen reference policy (for KL), no gradient."""
    rewards: torch.Tensor | None = None
    """[B] sequence rewards, or [B, T] per-token rewards."""
    group_ids: torch.Tensor | None = None
    """[B] prompt index of each response (responses to one prompt share it)."""
    advantages: torch.Tensor | None = None
    """[B, T] precomputed advantages (e.g. on the whole global batch); None = computed by the loss
    from `rewards` on this micro-batch. For VEPO these are the normalised rewards before entropy
    shaping (the shaping needs the current entropy and is applied inside the loss)."""
    values: torch.Tensor | None = None
    """PPO: current critic values (with gradient)."""
    old_values: torch.Tensor | None = None
    """PPO: critic values at rollout time (for GAE and the value clip)."""
    returns: torch.Tensor | None = None
    """PPO: value targets (advantages + old values)."""
    rollout_is_weights: torch.Tensor | None = None
    """Rollout correction (rl.rollout_correction): weight of each token's policy-gradient term,
    pi_old / pi_rollout truncated or masked, no gradient; None = 1."""
    response_lengths: torch.Tensor | None = None
    """[B] response lengths in tokens (DAPO overlong shaping); None = mask.sum(1)."""
    max_response_length: int | None = None
    """DAPO overlong shaping: the generation cap L_max."""
    keep: torch.Tensor | None = None
    """[B] bool: responses the loss trains on, decided once over the whole rollout batch (DAPO's
    dynamic sampling: groups with equal rewards are dropped); None = the loss decides, or all."""
    temperature: float = 1.0
    """The sampling temperature tau the responses were drawn at (rl.rollout.sampling.temperature):
    logp and old_logp are tempered by it; ratio_mode 'scaled' divides by it."""
    global_num_tokens: float | None = None
    """Response-token count of the whole global batch (loss_agg 'global_tokens')."""
    reward_std: torch.Tensor | float | None = None
    """Reward std for std_scope 'global' (already all-reduced); None = computed with `std_group`."""
    std_group: Any = None
    """Process group over which std_scope 'global' all-reduces (None = the default group if any)."""

    def __post_init__(self) -> None:
        shape = self.logp.shape
        if self.logp.dim() != 2:
            raise ValueError(f"RLBatch.logp must be [B, T], got shape {tuple(shape)}")
        for name in TOKEN_FIELDS:
            value = getattr(self, name)
            if value is not None and value.shape != shape:
                raise ValueError(
                    f"RLBatch.{name} has shape {tuple(value.shape)}, expected {tuple(shape)} like logp"
                )
        if self.rewards is not None and self.rewards.shape not in (shape[:1], shape):
            raise ValueError(
                f"RLBatch.rewards must be [B] or [B, T] for logp {tuple(shape)}, got {tuple(self.rewards.shape)}"
            )
        for name in ("group_ids", "keep"):
            value = getattr(self, name)
            if value is not None and value.shape != shape[:1]:
                raise ValueError(f"RLBatch.{name} must be [B]={shape[0]}, got {tuple(value.shape)}")

    @property
    def fmask(self) -> torch.Tensor:
        """The mask as a float tensor in logp's dtype."""
        return self.mask.to(self.logp.dtype)
