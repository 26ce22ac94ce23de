"""Registry of reward terms: a user adds a reward in one file with ``@register_reward("name")``.

A reward function takes ``(samples)`` or ``(samples, cfg: RewardsConfig)`` and returns either a
plain ``list[float]`` (one value per sample) or a :class:`TermResult`, which also carries the raw
measurement (rho, LID confidence, foreign share, ...) and pass/fail per sample, so the same code
scores RL samples and builds the constraint table. ``rlvr.py`` combines the terms named in
``RewardsConfig.weights``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.translation.sample import Sample


@dataclass
class TermResult:
    """What one reward term computed for a batch of N samples."""

    values: list[float]
    """[N] term reward before weighting and clipping."""
    raw: list[float] | None = None
    """[N] raw measurement behind the reward (None: same as values)."""
    passed: list[bool] | None = None
    """[N] constraint pass/fail, for terms that are hard constraints (None otherwise)."""
    applicable: list[bool] | None = None
    """[N] whether the constraint applies at all (format: only when the source has structure)."""


RewardFn = Callable[..., "list[float] | TermResult"]


@dataclass(frozen=True)
class RegisteredReward:
    name: str
    fn: RewardFn
    constraint: str | None
    """Key written into Sample.passed (lang, length, format, mixing) or None."""
    takes_cfg: bool


_REWARDS: dict[str, RegisteredReward] = {}


def register_reward(name: str, *, constraint: str | None = None) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering ``fn`` under ``name``; ``constraint`` names its Sample.passed key. A name
    already registered is refused."""

    def decorator(fn: RewardFn) -> RewardFn:
        if name in _REWARDS:
            raise ValueError(f"reward {name!r} is already registered by {_REWARDS[name].fn.__module__}")
        positional = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        _REWARDS[name] = RegisteredReward(name, fn, constraint, takes_cfg=len(positional) >= 2)
        return fn

    return decorator


def get_reward(name: str) -> RegisteredReward:
    """The registered reward ``name``; unknown names list the known ones."""
    try:
        return _REWARDS[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; registered: {', '.join(sorted(_REWARDS))}") from None


def registered_rewards() -> list[str]:
    return sorted(_REWARDS)


def run_reward(name: str, samples: list[Sample], cfg: RewardsConfig) -> TermResult:
    """Call reward ``name`` on ``samples`` and check it returned one finite-or-inf value per sample."""
    entry = get_reward(name)
    out = entry.fn(samples, cfg) if entry.takes_cfg else entry.fn(samples)
    result = out if isinstance(out, TermResult) else TermResult(values=[float(v) for v in out])
    if len(result.values) != len(samples):
        raise ValueError(f"reward {name!r} returned {len(result.values)} values for {len(samples)} samples")
    if any(v != v for v in result.values):  # NaN is a bug in the term, not a score
        raise ValueError(f"reward {name!r} returned NaN")
    return result
