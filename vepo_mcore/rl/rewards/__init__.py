"""Verifiable rewards for translation RL (SPEC section 5) and the constraint table built from them.

Add a reward in one file: decorate ``fn(samples, cfg) -> list[float] | TermResult`` with
``@register_reward("name")``, import the module, and give it a weight in ``rl.rewards.weights``.
"""

from vepo_mcore.rl.rewards.registry import (
    TermResult,
    get_reward,
    register_reward,
    registered_rewards,
    run_reward,
)
from vepo_mcore.rl.rewards.rlvr import rlvr_reward

__all__ = ["TermResult", "get_reward", "register_reward", "registered_rewards", "rlvr_reward", "run_reward"]
