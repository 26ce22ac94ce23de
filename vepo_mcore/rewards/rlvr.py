"""R_RLVR (SPEC section 5): the weighted sum of the registered reward terms.

    R = sum_k w_k * clip(r_k, -clip, clip),  k over RewardsConfig.weights (mt, length, format, lid, mixing)

then z-normalised across the batch (option, default on). ``rlvr_reward`` writes into every Sample:
``reward`` (final), ``reward_terms`` (each term's value, its raw measurement as ``<name>_raw`` and the
unnormalised total as ``total``), ``passed`` (lang / length / format / mixing) and ``compliant``.
"""

from __future__ import annotations

import math

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.registry import get_reward, registered_rewards, run_reward
from vepo_mcore.translation.sample import Sample


def clip(value: float, bound: float) -> float:
    """Clip to [-bound, bound]; +-inf map to the bounds."""
    return max(-bound, min(bound, value))


def z_normalize(values: list[float], eps: float = 1e-6) -> list[float]:
    """(v - mean) / (population std + eps) over the list; [N] -> [N]."""
    if not values:
        return []
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + eps) for v in values]


def active_terms(cfg: RewardsConfig) -> list[tuple[str, float]]:
    """(name, weight) of the terms that contribute: nonzero weight, and mt unless cfg.mt == 'none'."""
    return [
        (name, float(weight))
        for name, weight in cfg.weights.items()
        if weight != 0 and not (name == "mt" and cfg.mt == "none")
    ]


def check_weights(cfg: RewardsConfig) -> None:
    """Every key of rl.rewards.weights names a registered reward term (a typo would otherwise fail at
    the first step's scoring, or never when its weight is 0): a ValueError listing the known ones."""
    unknown = sorted(set(cfg.weights) - set(registered_rewards()))
    if unknown:
        raise ValueError(
            f"rl.rewards.weights: unknown reward term(s) {unknown}; registered: {', '.join(registered_rewards())}"
        )


def rlvr_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> list[float]:
    """Score ``samples`` in place and return their final rewards [N]."""
    cfg = cfg or RewardsConfig()
    totals = [0.0] * len(samples)
    for name, weight in active_terms(cfg):
        result = run_reward(name, samples, cfg)
        constraint = get_reward(name).constraint
        raw = result.raw if result.raw is not None else result.values
        for i, sample in enumerate(samples):
            value = result.values[i]
            sample.reward_terms[name] = value
            sample.reward_terms[f"{name}_raw"] = raw[i]
            totals[i] += weight * clip(value, cfg.clip)
            if constraint is not None and result.passed is not None:
                sample.passed[constraint] = bool(result.passed[i])
    rewards = z_normalize(totals, cfg.normalize_eps) if cfg.normalize else totals
    for sample, total, reward in zip(samples, totals, rewards):
        sample.reward_terms["total"] = total
        sample.reward = reward
        sample.compliant = all(sample.passed.values())
    return rewards
