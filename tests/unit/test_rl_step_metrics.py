"""Metrics the RL step logs about its rollout batch."""

from __future__ import annotations

from vepo_mcore.rl.trainer import groups_with_spread
from vepo_mcore.translation.sample import Sample


def test_groups_with_spread_counts_groups_whose_rewards_differ():
    samples = [Sample(group_id=g, reward=r) for g, r in [(0, 1.0), (0, 1.0), (1, 0.5), (1, 0.2), (2, 3.0)]]
    assert groups_with_spread(samples) == 1 / 3  # group 0 constant, group 2 a single response
    assert groups_with_spread([Sample(group_id=0, reward=0.0), Sample(group_id=0, reward=1e-3)]) == 1.0
