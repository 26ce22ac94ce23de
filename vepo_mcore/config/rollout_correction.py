"""Rollout-correction section (rl.rollout_correction; SPEC.md section 4, "Rollout correction").

The rollout engine (SGLang's bf16 kernels, FP8 rollouts) and the trainer's recomputation give the
same tokens slightly different log-probs, so the responses were sampled from pi_rollout, not from
the pi_old the PPO ratio divides by. This section weighs each token's policy-gradient term by the
importance ratio rho = pi_old / pi_rollout, truncated (TIS) or masked outside a band (MIS), as
verl's rollout_corr (rollout_is / rollout_rs) and slime's --use-tis / MIS (mis_level, mis_mode) do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class RolloutCorrectionConfig:
    """Importance weights pi_old / pi_rollout from the engine's log-probs on the policy-gradient term."""

    mode: Literal["off", "truncate", "mask"] = "off"
    """'off': no weights (the mismatch is still logged as rollout_corr/* when the engine returns
    log-probs). 'truncate' (TIS): w = clamp(rho, lower, upper). 'mask' (MIS): w = rho where
    lower <= rho <= upper, 0 elsewhere (those tokens leave the policy-gradient term)."""
    level: Literal["token", "sequence", "geometric"] = "token"
    """What rho is: 'token' = pi_old(o_t) / pi_rollout(o_t) per token; 'sequence' = the product of a
    response's token ratios (unbiased, high variance); 'geometric' = their geometric mean
    exp(mean_t log ratio_t), one weight per response (verl's and slime's level names)."""
    upper: float = 2.0
    """Upper bound on rho (verl's rollout_is_threshold, slime's tis_clip / mis_upper_bound); >= 1."""
    lower: float | None = None
    """Lower bound on rho, <= 1. None: 0 for 'truncate' (slime's tis_clip_low default), 1 / upper for
    'mask' (verl's and slime's default)."""

    def lower_bound(self) -> float:
        """The lower bound in effect for this mode."""
        if self.lower is not None:
            return self.lower
        return 1.0 / self.upper if self.mode == "mask" else 0.0

    def validate(self) -> None:
        if self.mode not in ("off", "truncate", "mask"):
            raise ValueError(
                f"rl.rollout_correction.mode must be 'off', 'truncate' or 'mask', got {self.mode!r}"
            )
        if self.level not in ("token", "sequence", "geometric"):
            raise ValueError(
                f"rl.rollout_correction.level must be 'token', 'sequence' or 'geometric', got {self.level!r}"
            )
        if not self.upper >= 1.0:
            raise ValueError(
                f"rl.rollout_correction.upper must be >= 1 (a bound below 1 would also cut the tokens on "
                f"which engine and trainer agree), got {self.upper}"
            )
        if self.lower is not None and not 0.0 <= self.lower <= 1.0:
            raise ValueError(f"rl.rollout_correction.lower must be in [0, 1] or null, got {self.lower}")
        if self.mode == "mask" and self.lower_bound() >= self.upper:
            raise ValueError(
                f"rl.rollout_correction.lower ({self.lower_bound()}) must be below "
                f"rl.rollout_correction.upper ({self.upper}) in mode 'mask': the band would keep no token"
            )
