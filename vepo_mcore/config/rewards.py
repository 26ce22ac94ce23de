"""Reward and filtering section (SPEC.md section 5 and the RLVR filtering rule)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class RewardsConfig:
    """R = R_mt + w_len r_len + w_fmt r_fmt + w_lid r_lid + w_mix r_mix, each term clipped."""

    mt: str = "chrf"
    """Translation-quality term, a registered reward term: 'chrf' (chrF++/100), 'chrf_contrast'
    (chrF++ above other sentences of the target language: rewards/contrast.py), 'bleu' (sentence
    BLEU/100), 'comet' (COMET-22), 'rm' (the reward model), or 'none'."""
    weights: dict[str, float] = field(
        default_factory=lambda: {"mt": 1.0, "length": 0.3, "format": 0.2, "lid": 0.4, "mixing": 0.3}
    )
    """Weight per registered reward term."""
    clip: float = 5.0
    """Each term is clipped to [-clip, clip]."""
    normalize: bool = True
    """z-normalise the final reward across the batch."""
    normalize_eps: float = 1e-6
    """Added to the batch std in the z-normalisation."""
    length_interval: tuple[float, float] = (0.5, 2.0)
    """Accepted normalised length ratio rho."""
    sigma_len: float = 1.0
    """Length penalty per unit distance outside the interval."""
    length_taper: float | None = None
    """Not in the paper (the toy recipe sets it): rho above which r_len falls linearly from +1 to 0 at the
    interval's upper end, where the term outside begins, so an answer growing past the typical length
    meets a slope before the edge instead of a step at it. None: flat inside the interval (SPEC)."""
    format_w_preserve: float = 1.0
    """w_p: weight of structural-token preservation."""
    format_w_broken: float = 0.5
    """w_b: penalty per broken-syntax item."""
    format_min_preserve: float = 1.0
    """Format check passes when this share of the source's structure is kept and nothing is broken."""
    lid_threshold: float = 0.8
    """LID confidence (summed over accepted labels) needed to pass."""
    eta_lid: float = 1.0
    """Penalty for a wrong or unconfident language."""
    mix_threshold: float = 0.15
    """Tolerated share of foreign-script letters / foreign words."""
    zeta_mix: float = 5.0
    """Slope of the code-mixing penalty above the threshold."""
    rep_threshold: float = 0.1
    """Tolerated share of characters that repeat a looping unit (the `repetition` term, off unless
    weighted)."""
    zeta_rep: float = 2.0
    """Slope of the repetition penalty above the threshold."""
    contrast_references: int = 8
    """mt = 'chrf_contrast': K, the other target-language sentences (FLORES dev) each response is also
    scored against."""
    contrast_weight: float = 1.0
    """mt = 'chrf_contrast': w, the weight of their mean chrF++ (0 gives plain chrF++)."""
    comet_checkpoint: str | None = None
    """COMET-22 checkpoint path (needed when mt = 'comet')."""
    comet_batch_size: int = 16
    """COMET scoring batch size."""
    rm_checkpoint: str | None = None
    """Reward-model checkpoint (needed when mt = 'rm')."""
    rm_placement: str = "offload"
    """Where the RM's weights live between scoring calls (mt = 'rm'): 'offload' in pinned host memory,
    on the GPU only while scoring (one H2D copy a step: 3.5 GB, ~0.14 s, for a 7B RM at TP 4), or
    'resident' on the training GPUs all run long (3.3 GiB more on the rollout and training peaks).
    docs/DESIGN.md, "The reward model at 7B", has the numbers behind the default."""
    rm_batch_size: int = 16
    """Rows per RM forward micro-batch when scoring (the scoring phase of the memory plan)."""

    def validate(self) -> None:
        """ValueErrors naming the field (called from the RL config's validate)."""
        low, high = self.length_interval
        if not 0 < low < high:
            raise ValueError(
                "rl.rewards.length_interval must be (low, high) with 0 < low < high, "
                f"got {self.length_interval}"
            )
        if self.length_taper is not None and not low < self.length_taper < high:
            raise ValueError(
                f"rl.rewards.length_taper must lie inside length_interval {self.length_interval}, "
                f"got {self.length_taper}"
            )
        if self.clip <= 0:
            raise ValueError(f"rl.rewards.clip must be positive, got {self.clip}")
        if not 0 <= self.lid_threshold < 1:
            raise ValueError(f"rl.rewards.lid_threshold must be in [0, 1), got {self.lid_threshold}")
        if not 0 <= self.mix_threshold <= 1 or not 0 <= self.format_min_preserve <= 1:
            raise ValueError("rl.rewards.mix_threshold and rl.rewards.format_min_preserve must be in [0, 1]")
        if not 0 <= self.rep_threshold < 1:
            raise ValueError(f"rl.rewards.rep_threshold must be in [0, 1), got {self.rep_threshold}")
        if self.mt == "comet" and not self.comet_checkpoint:
            raise ValueError(
                "rl.rewards.mt = 'comet' needs rl.rewards.comet_checkpoint (wmt22-comet-da model.ckpt)"
            )
        if self.rm_placement not in ("resident", "offload"):
            raise ValueError(
                f"rl.rewards.rm_placement must be 'resident' or 'offload', got {self.rm_placement!r}"
            )
        if self.rm_batch_size < 1:
            raise ValueError(f"rl.rewards.rm_batch_size must be >= 1, got {self.rm_batch_size}")
        if self.contrast_references < 1 or self.contrast_weight < 0:
            raise ValueError(
                "rl.rewards.contrast_references must be >= 1 and rl.rewards.contrast_weight >= 0, "
                f"got {self.contrast_references} and {self.contrast_weight}"
            )
        if self.comet_batch_size < 1:
            raise ValueError(f"rl.rewards.comet_batch_size must be >= 1, got {self.comet_batch_size}")


@dataclass(kw_only=True)
class FilterConfig:
    """Per prompt: sample K >= G candidates, drop non-compliant ones, keep the top G by reward."""

    num_candidates: int = 8
    """K candidates sampled per prompt."""
    group_size: int = 4
    """G responses kept per prompt."""
    enabled: bool = True
    """Apply RLVR filtering (off = keep the first G)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling in the trainer, for any loss: drop prompt groups whose rewards are all
    equal and sample more prompts until the step's batch is full. (The 'dapo' loss also leaves out of
    its loss and token count any group its overlong shaping left constant; that is part of the loss.)"""
