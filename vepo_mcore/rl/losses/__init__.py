"""RL policy losses behind one interface: `compute_loss(batch, cfg, kl) -> (loss, metrics)`.

Registered: vepo, ppo, grpo, dapo, rloo, reinforce_pp (one file each). Importing this package
registers them all. Losses are pure functions of tensors and never import megatron. A loss's own
options (rl.loss.<name>, e.g. VEPOOptions) are a dataclass in its file, registered with it.
"""

from vepo_mcore.rl.losses import dapo, grpo, ppo, reinforce_pp, rloo, vepo  # noqa: F401  (registration)
from vepo_mcore.rl.losses.registry import (
    LOSSES,
    check_loss_options,
    compute_advantages,
    compute_keep,
    compute_loss,
    get_loss,
    register_loss,
)

__all__ = [
    "LOSSES",
    "check_loss_options",
    "compute_advantages",
    "compute_keep",
    "compute_loss",
    "get_loss",
    "register_loss",
]
