"""Metrics the RL step logs about its rollout batch."""

from __future__ import annotations

from vepo_mcore.rl.trainer import groups_with_spread
from vepo_mcore.translation.sample import Sample


def test_groups_with_spread_counts_groups_whose_rewards_differ():
    samples = [Sample(group_id=g, reward=r) for g, r in [(0, 1.0), (0, 1.0), (1, 0.5), (1, 0.2), (2, 3.0)]]
    assert groups_with_spread(samples) == 1 / 3  # group 0 constant, group 2 a single response
    assert groups_with_spread([Sample(group_id=0, reward=0.0), Sample(group_id=0, reward=1e-3)]) == 1.0


def test_entropy_length_correlation_over_the_batch_responses():
    import numpy as np
    import torch

    from vepo_mcore.rl.trainer import entropy_length_correlation

    lengths = [2, 5, 3, 4]
    mask = torch.arange(6).expand(4, 6) < torch.tensor(lengths).unsqueeze(1)
    entropy = torch.tensor([[1.0, 2.0], [0.5, 3.0], [2.0, 0.0], [1.0, 1.5]]).repeat_interleave(3, 1)
    entropy = torch.where(mask, entropy, torch.full_like(entropy, float("nan")))  # padding never read
    mean_entropy = [float(entropy[i, :n].mean()) for i, n in enumerate(lengths)]
    expected = np.corrcoef(lengths, mean_entropy)[0, 1]
    assert abs(entropy_length_correlation(entropy, mask) - expected) < 1e-12
    assert (
        entropy_length_correlation(torch.ones(3, 4), torch.ones(3, 4, dtype=torch.bool)) == 0.0
    )  # no spread


def test_direction_means_average_each_directions_masked_tokens():
    import torch

    from vepo_mcore.rl.trainer import direction_means

    samples = [
        Sample(src_lang=s, tgt_lang=t) for s, t in [("en", "th"), ("th", "en"), ("en", "th"), ("th", "en")]
    ]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([[-1.0, -3.0, 9.0], [2.0, 9.0, 9.0], [-2.0, 0.0, -4.0], [1.0, 0.0, 9.0]])
    means = direction_means(samples, adv, mask)  # 9.0 sits on padding and must not count
    assert means == {"en-th": (-1 - 3 - 2 + 0 - 4) / 5, "th-en": (2 + 1 + 0) / 3}
    assert direction_means(samples[:1], adv[:1], torch.zeros(1, 3, dtype=torch.bool)) == {}
