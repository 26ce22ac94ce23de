"""Advantage estimators against scalar Python loops."""

from __future__ import annotations

import math
import random

import pytest
import torch

from vepo_mcore.rl import advantages as A


def _ragged(seed, b=5, t=7):
    rng = random.Random(seed)
    lengths = [rng.randint(1, t) for _ in range(b)]
    mask = torch.tensor([[1 if j < n else 0 for j in range(t)] for n in lengths], dtype=torch.bool)
    return rng, lengths, mask


def test_gae_matches_hand_loop():
    rng, lengths, mask = _ragged(0)
    rewards = [[rng.uniform(-1, 1) for _ in range(7)] for _ in range(5)]
    values = [[rng.uniform(-1, 1) for _ in range(7)] for _ in range(5)]
    gamma, lam = 0.97, 0.9
    adv, ret = A.gae(torch.tensor(rewards), torch.tensor(values), mask, gamma, lam)
    for i, n in enumerate(lengths):
        running = 0.0
        for t in range(n - 1, -1, -1):
            next_v = values[i][t + 1] if t + 1 < n else 0.0
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            running = delta + gamma * lam * running
            assert abs(adv[i, t].item() - running) < 1e-5
            assert abs(ret[i, t].item() - (running + values[i][t])) < 1e-5
        assert torch.all(adv[i, n:] == 0) and torch.all(ret[i, n:] == 0)


def test_discounted_returns_and_last_token_rewards():
    _, lengths, mask = _ragged(1)
    seq = torch.tensor([1.0, -2.0, 0.5, 3.0, 0.0])
    r = A.last_token_rewards(seq, mask)
    for i, n in enumerate(lengths):
        assert r[i, n - 1] == seq[i] and r[i].sum() == seq[i]
    g = A.discounted_returns(r, mask, gamma=0.5)
    for i, n in enumerate(lengths):
        for t in range(n):
            assert abs(g[i, t].item() - seq[i].item() * 0.5 ** (n - 1 - t)) < 1e-6


def test_group_normalisation_std_scopes():
    rewards = torch.tensor([1.0, 3.0, 0.0, 10.0])
    groups = torch.tensor([7, 7, 2, 2])
    mask = torch.ones(4, 2, dtype=torch.bool)
    by_group = A.group_normalized_advantages(rewards, mask, groups, "group", eps=0.0)
    # group 7: mean 2, std sqrt(2); group 2: mean 5, std sqrt(50)
    expected = [-1 / math.sqrt(2), 1 / math.sqrt(2), -5 / math.sqrt(50), 5 / math.sqrt(50)]
    torch.testing.assert_close(by_group[:, 0], torch.tensor(expected))
    micro = A.group_normalized_advantages(rewards, mask, groups, "microbatch", eps=0.0)
    std = statistics_stdev([1.0, 3.0, 0.0, 10.0])
    torch.testing.assert_close(micro[:, 1], torch.tensor([-1 / std, 1 / std, -5 / std, 5 / std]))
    given = A.group_normalized_advantages(rewards, mask, groups, "global", eps=0.0, reward_std=2.0)
    torch.testing.assert_close(given[:, 0], torch.tensor([-0.5, 0.5, -2.5, 2.5]))
    # without a process group 'global' is the std of what is here
    torch.testing.assert_close(A.group_normalized_advantages(rewards, mask, groups, "global", eps=0.0), micro)
    with pytest.raises(ValueError, match="known"):
        A.group_normalized_advantages(rewards, mask, groups, "batch")


def statistics_stdev(xs):
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))


def test_group_normalisation_per_token_rewards_and_padding():
    rewards = torch.tensor([[1.0, 2.0, 99.0], [0.0, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = A.group_normalized_advantages(rewards, mask, torch.tensor([0, 0]), "group", eps=0.0)
    vals = [1.0, 2.0, 0.0, 1.0, 5.0]  # the 99 is padding
    mean, std = sum(vals) / 5, statistics_stdev(vals)
    assert adv[0, 2] == 0
    torch.testing.assert_close(adv[1], torch.tensor([(v - mean) / std for v in (0.0, 1.0, 5.0)]))


def test_entropy_shaping_positions_and_stop_gradient():
    base = torch.tensor([[2.0, 2.0, 2.0, 0.0]])
    ent = torch.tensor([[1.0, 0.5, 3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    out = A.entropy_shaped_advantages(base, ent, mask, alpha=0.1, gamma=0.9)
    expected = [2 * (1 + 0.1 * 1.0), 2 * (1 + 0.1 * 0.5 * 0.9), 2 * (1 + 0.1 * 3.0 * 0.81), 0.0]
    torch.testing.assert_close(out[0], torch.tensor(expected))
    assert not out.requires_grad


def test_rloo_leave_one_out():
    rewards = torch.tensor([1.0, 2.0, 6.0, 4.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1, 2])
    adv = A.rloo_advantages(rewards, torch.ones(5, 1, dtype=torch.bool), groups)[:, 0]
    torch.testing.assert_close(adv, torch.tensor([1 - 4.0, 2 - 3.5, 6 - 1.5, 0.0, 0.0]))


def test_whiten_is_over_masked_tokens():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, 5.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    w = A.whiten(x, mask, eps=0.0)
    vals = [1.0, 2.0, 3.0, 4.0, 5.0]
    torch.testing.assert_close(
        w[1], torch.tensor([(v - 3.0) / statistics_stdev(vals) for v in (3.0, 4.0, 5.0)])
    )
    assert w[0, 2] == 0


def test_dynamic_sampling_keep_and_overlong_penalty():
    keep = A.dynamic_sampling_keep(torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0]), torch.tensor([0, 0, 1, 1, 2]))
    assert keep.tolist() == [False, False, True, True, False]  # a group of one is constant too
    pen = A.overlong_penalty(torch.tensor([10, 12, 14, 16, 20]), max_length=16, buffer=4, penalty=2.0)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -1.0, -2.0, -2.0]))
    with pytest.raises(ValueError, match="buffer"):
        A.overlong_penalty(torch.tensor([1]), max_length=4, buffer=0)


def test_a_group_of_one_response_gets_advantage_zero():
    """SPEC section 4: no baseline, no group-relative signal (verl would keep the raw score)."""
    from vepo_mcore.rl.advantages import group_normalized_advantages, rloo_advantages

    rewards = torch.tensor([2.0, 1.0, 3.0])
    mask = torch.ones(3, 2)
    groups = torch.tensor([0, 0, 1])
    for scope in ("microbatch", "group", "global"):
        adv = group_normalized_advantages(rewards, mask, groups, scope, reward_std=1.0)
        assert adv[2].tolist() == [0.0, 0.0] and adv[0, 0] > 0 > adv[1, 0]
    assert rloo_advantages(rewards, mask, groups)[2].tolist() == [0.0, 0.0]
