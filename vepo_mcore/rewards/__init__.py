"""Verifiable rewards for translation RL (SPEC section 5) and the constraint table built from them.

Add a reward in one file: decorate ``fn(samples, cfg) -> list[float] | TermResult`` with
``@register_reward("name")``, import the module, and give it a weight in ``rl.rewards.weights``.
"""

# The built-in terms register when imported. Terms of the layers above (the reward model's `rm`,
# vepo_mcore/rm/reward.py) register when their module is imported: the RL trainer imports it.
from vepo_mcore.rewards import contrast, format, length, lid, mixing, mt, repetition  # noqa: E402, F401, I001  (registration)
from vepo_mcore.rewards.registry import (
    TermResult,
    get_reward,
    register_reward,
    registered_rewards,
    run_reward,
)
from vepo_mcore.rewards.rlvr import rlvr_reward

__all__ = ["TermResult", "get_reward", "register_reward", "registered_rewards", "rlvr_reward", "run_reward"]
