"""`Sample`: the one record a rollout flows in, from the engine through rewards and filtering
into the training batch (slime-style). Fields are filled stage by stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(kw_only=True)
class Sample:
    """One prompt + one response, with everything computed about it."""

    prompt: str = ""
    """The full prompt text (ChatML) given to the engine."""
    prompt_ids: list[int] = field(default_factory=list)
    """Tokenised prompt."""
    response: str = ""
    """Decoded response text (special tokens stripped)."""
    response_ids: list[int] = field(default_factory=list)
    """Generated token ids, including the stop token if one was produced."""
    rollout_logprobs: list[float] | None = None
    """Per-response-token log-probs from the engine under the sampling temperature."""
    finish_reason: str = ""
    """'stop' (stop token), 'length' (max_new_tokens reached) or 'abort'."""
    source: str = ""
    """Source sentence to translate."""
    reference: str | None = None
    """Reference translation, if known."""
    src_lang: str = ""
    """Source language code (en, zh, th, ...)."""
    tgt_lang: str = ""
    """Target language code."""
    group_id: int = 0
    """Index of the prompt this sample answers (samples of one prompt share it)."""
    reward: float = 0.0
    """Final scalar reward (after weighting, clipping and normalisation)."""
    reward_terms: dict[str, float] = field(default_factory=dict)
    """Raw value of each reward term (mt, length, format, lid, mixing, ...)."""
    passed: dict[str, bool] = field(default_factory=dict)
    """Pass/fail of each verifiable constraint (lang, length, format, mixing)."""
    compliant: bool = True
    """All hard constraints passed (set by filtering)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything else (direction, prompt index, ...)."""

    @property
    def direction(self) -> str:
        return f"{self.src_lang}-{self.tgt_lang}"
