"""Each loss on a hand-computed 2x3 example (scalar Python loops as the reference), VEPO's reductions
to DAPO, micro-batch split invariance, the entropy bonus on a tiny policy, clip fractions, KL regimes."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.logprobs import logprobs_and_entropy
from vepo_mcore.rl.losses import LOSSES, compute_advantages, compute_loss, get_loss
from vepo_mcore.rl.losses.dapo import DAPOOptions
from vepo_mcore.rl.losses.ppo import PPOOptions
from vepo_mcore.rl.losses.vepo import VEPOOptions

# the 2x3 example: two responses to one prompt, the second one token shorter
MASK = [[1, 1, 1], [1, 1, 0]]
RATIO = [[1.0, 1.5, 0.7], [0.5, 1.1, 3.0]]  # the 3.0 sits on padding and must not count
ENT = [[0.5, 1.0, 2.0], [0.2, 0.4, 9.9]]
REWARDS = [1.0, 0.0]
OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.3, -2.0]]
REF = [[-1.2, -1.8, -0.9], [-1.0, -0.3, -1.0]]
TOKENS = [(i, t) for i in range(2) for t in range(3) if MASK[i][t]]


def _batch(**extra) -> RLBatch:
    old = torch.tensor(OLD, dtype=torch.float64)
    logp = (old + torch.log(torch.tensor(RATIO, dtype=torch.float64))).requires_grad_(True)
    fields = dict(
        logp=logp,
        old_logp=old,
        mask=torch.tensor(MASK, dtype=torch.bool),
        entropy=torch.tensor(ENT, dtype=torch.float64, requires_grad=True),
        rewards=torch.tensor(REWARDS),
        group_ids=torch.tensor([0, 0]),
    )
    fields.update(extra)
    return RLBatch(**fields)


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _surrogate(r, a, lo, hi):
    return min(r * a, _clip(r, 1 - lo, 1 + hi) * a)


def _group_norm(rewards):
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / (len(rewards) - 1))
    return [(x - mean) / (std + 1e-6) for x in rewards]


def _close(a, b, tol=1e-6):
    assert abs(float(a) - b) <= tol, (float(a), b)


def test_vepo_hand_2x3():
    cfg = LossConfig(name="vepo")  # alpha .1, gamma .995, beta .001, eps .2/.28, std microbatch
    loss, m = compute_loss(_batch(), cfg)
    norm = _group_norm(REWARDS)
    objective = entropy = 0.0
    for i, t in TOKENS:
        adv = norm[i] * (1 + 0.1 * ENT[i][t] * 0.995**t)
        objective += _surrogate(RATIO[i][t], adv, 0.2, 0.28)
        entropy += ENT[i][t]
    _close(loss, -objective / 5 - 0.001 * entropy / 5)
    # token (0,1): r=1.5 > 1.28 with A > 0 -> clipped high; token (1,0): r=0.5 < 0.8 with A < 0 -> clipped low
    _close(m["rl/clip_frac_high"], 1 / 5)
    _close(m["rl/clip_frac_low"], 1 / 5)
    _close(m["rl/ratio_max"], 1.5)
    _close(m["rl/ratio_min"], 0.5)
    _close(m["rl/ratio_mean"], (1.0 + 1.5 + 0.7 + 0.5 + 1.1) / 5)
    _close(m["rl/entropy"], entropy / 5)
    assert "rl/kl_k3" not in m  # no reference policy in this batch


def test_vepo_entropy_gradient_is_only_the_bonus():
    batch = _batch()
    loss, _ = compute_loss(batch, LossConfig(name="vepo", options={"vepo": VEPOOptions(beta=0.01)}))
    loss.backward()
    # the shaping uses sg(H): d loss / d H = -beta / N on response tokens, 0 on padding
    expected = torch.tensor([[-0.002, -0.002, -0.002], [-0.002, -0.002, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(batch.entropy.grad, expected, atol=1e-12, rtol=0)
    # clipped tokens get no policy gradient
    assert batch.logp.grad[0, 1] == 0 and batch.logp.grad[1, 0] == 0 and batch.logp.grad[1, 2] == 0


def test_grpo_hand_2x3():
    loss, m = compute_loss(_batch(), LossConfig(name="grpo"))
    norm = _group_norm(REWARDS)
    per_seq = []
    for i in range(2):
        toks = [t for t in range(3) if MASK[i][t]]
        per_seq.append(sum(_surrogate(RATIO[i][t], norm[i], 0.2, 0.2) for t in toks) / len(toks))
    _close(loss, -sum(per_seq) / 2)
    _close(m["rl/clip_frac_high"], 1 / 5)  # symmetric clip: 1.5 > 1.2


def test_dapo_hand_2x3_and_kl_in_loss():
    kl = KLConfig(estimator="k3", coef=0.1)
    loss, m = compute_loss(
        _batch(ref_logp=torch.tensor(REF, dtype=torch.float64)), LossConfig(name="dapo"), kl
    )
    norm = _group_norm(REWARDS)
    objective = k3 = k1 = k2 = 0.0
    for i, t in TOKENS:
        objective += _surrogate(RATIO[i][t], norm[i], 0.2, 0.28)
        logp = OLD[i][t] + math.log(RATIO[i][t])
        lr = REF[i][t] - logp
        k1 += -lr
        k2 += 0.5 * lr**2
        k3 += math.exp(lr) - 1 - lr
    _close(loss, -objective / 5 + 0.1 * k3 / 5)
    _close(m["rl/kl_k1"], k1 / 5)
    _close(m["rl/kl_k2"], k2 / 5)
    _close(m["rl/kl_k3"], k3 / 5)


def test_rloo_hand_2x3_with_kl_in_reward():
    kl = KLConfig(estimator="k2", coef=0.5)
    loss, _ = compute_loss(
        _batch(ref_logp=torch.tensor(REF, dtype=torch.float64)), LossConfig(name="rloo"), kl
    )
    # KL in the reward uses the rollout policy (old_logp), summed over each response
    penalised = [
        REWARDS[i] - sum(0.5 * 0.5 * (REF[i][t] - OLD[i][t]) ** 2 for t in range(3) if MASK[i][t])
        for i in range(2)
    ]
    adv = [penalised[0] - penalised[1], penalised[1] - penalised[0]]
    objective = sum(_surrogate(RATIO[i][t], adv[i], 0.2, 0.2) for i, t in TOKENS)
    _close(loss, -objective / 5)


def test_reinforce_pp_hand_2x3():
    kl = KLConfig(estimator="k1", coef=0.2)
    loss, _ = compute_loss(
        _batch(ref_logp=torch.tensor(REF, dtype=torch.float64)), LossConfig(name="reinforce_pp"), kl
    )
    returns = {}
    for i in range(2):
        last = max(t for t in range(3) if MASK[i][t])
        running = 0.0
        for t in range(last, -1, -1):
            r = (REWARDS[i] if t == last else 0.0) - 0.2 * (OLD[i][t] - REF[i][t])
            running = r + running
            returns[i, t] = running
    vals = [returns[k] for k in TOKENS]
    mean = sum(vals) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 4)
    objective = sum(
        _surrogate(RATIO[i][t], (returns[i, t] - mean) / (std + 1e-6), 0.2, 0.2) for i, t in TOKENS
    )
    _close(loss, -objective / 5, tol=1e-5)


def test_reinforce_pp_group_baseline_compares_each_response_with_its_own_prompt():
    """Two prompts, the second earning less: without a baseline every answer to it gets A < 0; with
    baseline 'group' each group holds one A > 0 and one A < 0, and the returns are (R - group mean)
    plus the KL penalties, whitened over the batch's tokens (the 2x3 hand loop on four responses)."""
    rewards, groups = [1.0, 0.6, 0.3, 0.1], [0, 0, 1, 1]
    mask = [[1, 1], [1, 0], [1, 1], [1, 1]]
    old = [[-1.0, -2.0], [-0.5, -1.0], [-1.5, -0.3], [-0.7, -0.2]]
    ref = [[-1.2, -1.8], [-0.9, -1.0], [-1.0, -0.3], [-0.4, -0.6]]
    batch = RLBatch(
        logp=torch.tensor(old, dtype=torch.float64),
        old_logp=torch.tensor(old, dtype=torch.float64),
        mask=torch.tensor(mask, dtype=torch.bool),
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor(groups),
        ref_logp=torch.tensor(ref, dtype=torch.float64),
    )
    plain = compute_advantages(batch, LossConfig(name="reinforce_pp"))
    assert (plain[2:][batch.mask[2:]] < 0).all()  # the weaker prompt: every token pushed down
    cfg = LossConfig(name="reinforce_pp", options={"reinforce_pp": {"baseline": "group"}})
    kl = KLConfig(estimator="k1", coef=0.2)
    adv = compute_advantages(batch, cfg, kl)
    means = {g: sum(r for r, h in zip(rewards, groups) if h == g) / 2 for g in set(groups)}
    tokens = [(i, t) for i in range(4) for t in range(2) if mask[i][t]]
    returns = {}
    for i in range(4):
        last = max(t for t in range(2) if mask[i][t])
        running = 0.0
        for t in range(last, -1, -1):
            running += (rewards[i] - means[groups[i]] if t == last else 0.0) - 0.2 * (old[i][t] - ref[i][t])
            returns[i, t] = running
    mean = sum(returns.values()) / len(tokens)
    std = math.sqrt(sum((v - mean) ** 2 for v in returns.values()) / (len(tokens) - 1))
    for i, t in tokens:
        _close(adv[i, t], (returns[i, t] - mean) / (std + 1e-6), tol=1e-5)
    no_kl = compute_advantages(batch, cfg)
    for group in (0, 1):
        firsts = [float(no_kl[i, 0]) for i in range(4) if groups[i] == group]
        assert max(firsts) > 0 > min(firsts)


def _hand_gae(rewards, values, mask, gamma, lam):
    adv = [[0.0] * len(rewards[0]) for _ in rewards]
    for i in range(len(rewards)):
        toks = [t for t in range(len(mask[i])) if mask[i][t]]
        next_v = next_a = 0.0
        for t in reversed(toks):
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            next_a = delta + gamma * lam * next_a
            next_v = values[i][t]
            adv[i][t] = next_a
    return adv


def test_ppo_hand_2x3_policy_and_value_loss():
    old_values = [[0.3, 0.1, 0.6], [-0.2, 0.4, 0.0]]
    values = [[0.5, 0.0, 0.9], [-0.2, 0.1, 0.0]]
    cfg = LossConfig(name="ppo", options={"ppo": PPOOptions(gamma=0.9, lam=0.8)})
    batch = _batch(
        old_values=torch.tensor(old_values, dtype=torch.float64),
        values=torch.tensor(values, dtype=torch.float64, requires_grad=True),
    )
    loss, m = compute_loss(batch, cfg)
    token_r = [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]  # the reward sits on each response's last token
    raw = _hand_gae(token_r, old_values, MASK, 0.9, 0.8)
    vals = [raw[i][t] for i, t in TOKENS]
    mean = sum(vals) / 5
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 4)
    pg = -sum(_surrogate(RATIO[i][t], (raw[i][t] - mean) / (std + 1e-6), 0.2, 0.2) for i, t in TOKENS) / 5
    vl = 0.0
    for i, t in TOKENS:
        ret = raw[i][t] + old_values[i][t]
        clipped = old_values[i][t] + _clip(values[i][t] - old_values[i][t], -0.2, 0.2)
        vl += 0.5 * max((values[i][t] - ret) ** 2, (clipped - ret) ** 2)
    _close(m["rl/pg_loss"], pg, tol=1e-5)
    _close(m["rl/value_loss"], vl / 5)
    _close(loss, pg + 0.5 * vl / 5, tol=1e-5)


def test_vepo_without_entropy_terms_equals_dapo_when_no_group_is_constant():
    torch.manual_seed(0)
    b, t = 8, 6
    old = torch.randn(b, t, dtype=torch.float64) - 1
    mask = torch.arange(t).expand(b, t) < torch.randint(2, t + 1, (b, 1))
    fields = dict(
        old_logp=old,
        mask=mask,
        entropy=torch.rand(b, t, dtype=torch.float64),
        rewards=torch.tensor([1.0, 0.0, 0.3, 0.6, 2.0, -1.0, 0.5, 0.1]),
        group_ids=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]),
    )
    grads = []
    for name, extra in (
        ("vepo", dict(options={"vepo": VEPOOptions(alpha=0.0, beta=0.0, std_scope="group")})),
        ("dapo", dict()),
    ):
        logp = old + 0.4 * torch.randn(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        logp.requires_grad_(True)
        loss, _ = compute_loss(RLBatch(logp=logp, **fields), LossConfig(name=name, **extra))
        loss.backward()
        grads.append((loss.detach(), logp.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-12, rtol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-12, rtol=0)


def test_ratio_modes():
    batch = _batch()
    loss_t, _ = compute_loss(batch, LossConfig(name="vepo", ratio_mode="tempered"))
    loss_s, _ = compute_loss(batch, LossConfig(name="vepo", ratio_mode="scaled"))
    _close(loss_t, float(loss_s), tol=1e-12)
    _, m = compute_loss(_batch(temperature=2.0), LossConfig(name="vepo", ratio_mode="scaled"))
    _close(m["rl/ratio_max"], math.sqrt(1.5))  # exp(log(1.5) / 2)


def test_dapo_dynamic_sampling_masks_constant_reward_groups():
    old = torch.zeros(4, 2, dtype=torch.float64)
    batch = RLBatch(
        logp=old.clone().requires_grad_(True),
        old_logp=old,
        mask=torch.ones(4, 2, dtype=torch.bool),
        rewards=torch.tensor([1.0, 1.0, 0.0, 2.0]),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    loss, m = compute_loss(batch, LossConfig(name="dapo"))
    loss.backward()
    _close(m["rl/dynamic_sampling_kept"], 0.5)
    _close(m["rl/num_tokens"], 4)
    assert torch.all(batch.logp.grad[:2] == 0) and torch.all(batch.logp.grad[2:] != 0)
    # with r = 1 the loss is -mean(A) over the 4 kept tokens: (-0.707, -0.707, 0.707, 0.707) -> 0
    _close(loss, 0.0)


def test_dapo_overlong_shaping_changes_advantages():
    old = torch.zeros(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    batch = RLBatch(
        logp=old,
        old_logp=old,
        mask=mask,
        rewards=torch.tensor([1.0, 1.0]),
        group_ids=torch.tensor([0, 0]),
        max_response_length=4,
    )
    cfg = LossConfig(name="dapo", options={"dapo": DAPOOptions(overlong_buffer=2, overlong_penalty=1.0)})
    adv = compute_advantages(batch, cfg)
    # lengths 2 (no penalty) and 4 (= L_max: -1): rewards 1 and 0 -> +-0.707
    assert adv[0, 0] > 0.7 and adv[1, 0] < -0.7


def test_clip_fractions_count_only_response_tokens_on_the_clipping_side():
    old = torch.zeros(1, 8, dtype=torch.float64)
    ratios = torch.tensor([[0.5, 0.5, 1.5, 1.5, 1.0, 0.79, 1.29, 1.5]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    batch = RLBatch(logp=torch.log(ratios), old_logp=old, mask=mask, advantages=adv)
    _, m = compute_loss(batch, LossConfig(name="vepo", options={"vepo": VEPOOptions(alpha=0.0, beta=0.0)}))
    # low: (0.5, A<0) and (0.79, A<0); high: (1.5, A>0) and (1.29, A>0); the last 1.5 is padding
    _close(m["rl/clip_frac_low"], 2 / 7)
    _close(m["rl/clip_frac_high"], 2 / 7)
    _close(m["rl/clip_frac"], 4 / 7)


def _random_batch(seed=0, groups=4, per_group=3, t=5):
    g = torch.Generator().manual_seed(seed)
    b = groups * per_group
    old = torch.randn(b, t, generator=g, dtype=torch.float64) - 1
    return (
        dict(
            old_logp=old,
            mask=torch.arange(t).expand(b, t) < torch.randint(1, t + 1, (b, 1), generator=g),
            ref_logp=old + 0.1 * torch.randn(b, t, generator=g, dtype=torch.float64),
            rewards=torch.randn(b, generator=g),
            group_ids=torch.arange(groups).repeat_interleave(per_group),
            old_values=torch.randn(b, t, generator=g, dtype=torch.float64),
        ),
        old + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64),
        torch.rand(b, t, generator=g, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    "name,precompute",
    [(n, True) for n in sorted(LOSSES) if n != "grpo"] + [("vepo", False), ("dapo", False), ("rloo", False)],
)
def test_micro_batch_split_invariance_under_global_tokens(name, precompute):
    """Sum of micro-batch gradients == gradient of the whole batch (GRPO is sequence-mean by definition).

    With precompute=False each micro-batch computes its own group-normalised advantages, which is
    invariant because the split keeps whole groups (3 responses each) together."""
    fields, logp0, ent0 = _random_batch()
    # only the vepo section is read (by vepo); the other losses ignore it
    cfg = LossConfig(name=name, loss_agg="global_tokens", options={"vepo": VEPOOptions(std_scope="group")})
    kl = KLConfig(estimator="k3", coef=0.05)
    n_tokens = float(fields["mask"].sum())
    whole = RLBatch(logp=logp0, entropy=ent0, global_num_tokens=n_tokens, **fields)
    adv = compute_advantages(whole, cfg, kl) if precompute else None
    assert adv is None or adv.abs().sum() > 0

    def grads(slices):
        logp = logp0.clone().requires_grad_(True)
        ent = ent0.clone().requires_grad_(True)
        values = (fields["old_values"] + 0.3).requires_grad_(True)
        total = 0.0
        for sl in slices:
            part = RLBatch(
                logp=logp[sl],
                entropy=ent[sl],
                values=values[sl],
                global_num_tokens=n_tokens,
                advantages=None if adv is None else adv[sl],
                **{k: v[sl] for k, v in fields.items()},
            )
            loss, _ = compute_loss(part, cfg, kl)
            total = total + loss
        total.backward()
        return total.detach(), logp.grad, ent.grad, values.grad

    one = grads([slice(0, 12)])
    split = grads([slice(0, 3), slice(3, 9), slice(9, 12)])
    assert one[1].abs().sum() > 0
    for a, b in zip(one, split):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("beta,direction", [(0.5, 1), (-0.5, -1)])
def test_entropy_bonus_moves_entropy_of_a_tiny_policy(beta, direction):
    torch.manual_seed(0)
    policy = torch.nn.Linear(4, 7, bias=False)
    states = torch.randn(6, 4)
    actions = torch.randint(0, 7, (6,))

    def entropy_of_policy():
        with torch.no_grad():
            return logprobs_and_entropy(policy(states), actions, 0.8, 4)[1].mean().item()

    before = entropy_of_policy()
    logp, ent = logprobs_and_entropy(policy(states), actions, 0.8, 4)
    batch = RLBatch(
        logp=logp.view(2, 3),
        old_logp=logp.detach().view(2, 3),
        entropy=ent.view(2, 3),
        mask=torch.ones(2, 3, dtype=torch.bool),
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 1]),
        temperature=0.8,
    )
    loss, _ = compute_loss(
        batch, LossConfig(name="vepo", options={"vepo": VEPOOptions(beta=beta, std_scope="group")})
    )
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = entropy_of_policy()
    assert (after - before) * direction > 1e-4, (before, after)


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("estimator", ["none", "k2", "k3"])
def test_every_algorithm_runs_every_kl_regime(name, estimator):
    fields, logp0, ent0 = _random_batch(seed=2)
    logp = logp0.clone().requires_grad_(True)
    batch = RLBatch(
        logp=logp, entropy=ent0.clone().requires_grad_(True), values=fields["old_values"] + 0.1, **fields
    )
    loss, m = compute_loss(batch, LossConfig(name=name), KLConfig(estimator=estimator, coef=0.5))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    for k in (
        "rl/kl_k1",
        "rl/kl_k2",
        "rl/kl_k3",
        "rl/clip_frac_low",
        "rl/clip_frac_high",
        "rl/ratio_mean",
        "rl/adv_mean",
        "rl/loss",
    ):
        assert k in m, k
    base, _ = compute_loss(
        dataclasses.replace(batch, logp=logp0), LossConfig(name=name), KLConfig(estimator="none")
    )
    if estimator == "none":
        _close(loss, float(base), tol=1e-12)
    else:
        assert abs(float(loss) - float(base)) > 1e-6, "the KL term must change the loss"


def test_kl_placement_override():
    fields, logp0, _ = _random_batch(seed=3)
    batch = RLBatch(logp=logp0, **fields)
    in_loss, m1 = compute_loss(
        batch, LossConfig(name="grpo"), KLConfig(estimator="k3", coef=1.0, placement="loss")
    )
    in_reward, m2 = compute_loss(
        batch, LossConfig(name="grpo"), KLConfig(estimator="k3", coef=1.0, placement="reward")
    )
    assert "rl/kl_loss" in m1 and "rl/kl_loss" not in m2
    assert abs(float(in_loss) - float(in_reward)) > 1e-6


def test_unknown_loss_lists_known_names():
    with pytest.raises(ValueError, match="known: .*'dapo'.*'vepo'"):
        get_loss("vepoo")


def test_missing_inputs_raise_value_errors():
    with pytest.raises(ValueError, match="global_num_tokens"):
        compute_loss(_batch(), LossConfig(name="vepo", loss_agg="global_tokens"))
    with pytest.raises(ValueError, match="ref_logp"):
        compute_loss(_batch(), LossConfig(name="vepo"), KLConfig(estimator="k2"))
    with pytest.raises(ValueError, match="old_values"):
        compute_loss(_batch(), LossConfig(name="ppo"))
    with pytest.raises(ValueError, match="entropy"):
        compute_loss(_batch(entropy=None), LossConfig(name="vepo"))
    with pytest.raises(ValueError, match="shape"):
        _batch(old_logp=torch.zeros(2, 4))


def test_an_unknown_loss_name_fails_at_start_up_naming_the_field_and_known_losses():
    from vepo_mcore.config import JobConfig
    from vepo_mcore.rl.trainer import rl_job_config

    cfg = JobConfig()
    rl_job_config(cfg)
    cfg.rl.loss.name = "vepo2"
    with pytest.raises(ValueError, match=r"rl\.loss\.name .*known: .*'reinforce_pp'"):
        rl_job_config(cfg)


def test_dual_clip_bounds_negative_advantage_tokens():
    """c = 3: a token with A < 0 and r = 10 contributes c * A, not r * A, and no gradient; off, r * A."""
    from vepo_mcore.rl.losses.common import clipped_surrogate

    ratio = torch.tensor([10.0, 10.0, 0.5, 2.0], requires_grad=True)
    adv = torch.tensor([-1.0, 1.0, -1.0, -1.0])
    plain = clipped_surrogate(ratio, adv, 0.2, 0.28)
    dual = clipped_surrogate(ratio, adv, 0.2, 0.28, dual_clip=3.0)
    assert plain.tolist() == pytest.approx([-10.0, 1.28, -0.8, -2.0])
    assert dual.tolist() == pytest.approx([-3.0, 1.28, -0.8, -2.0])  # only r > c with A < 0 changes
    dual.sum().backward()
    assert ratio.grad.tolist() == pytest.approx([0.0, 0.0, 0.0, -1.0])
    cfg = LossConfig(name="grpo", dual_clip=3.0)
    _, metrics = compute_loss(_batch(), cfg)
    assert "rl/clip_frac_dual" in metrics


def test_dual_clip_must_exceed_one():
    from vepo_mcore.config.rl import RLConfig

    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        RLConfig(loss=LossConfig(dual_clip=0.5)).validate()


def test_dapo_dynamic_sampling_decides_on_the_whole_batch_not_the_micro_batch():
    """Micro-batches of one response never hold a whole group: decided per micro-batch, every group
    looks constant and DAPO never trains. The trainer decides once (compute_keep) and passes it on."""
    from vepo_mcore.rl.losses import compute_keep

    cfg = LossConfig(name="dapo")
    old = torch.tensor([[-1.0, -1.0]] * 4)
    full = RLBatch(logp=old.clone(), old_logp=old, mask=torch.ones(4, 2, dtype=torch.bool),
                   rewards=torch.tensor([1.0, 0.0, 0.5, 0.5]), group_ids=torch.tensor([0, 0, 1, 1]))  # fmt: skip
    keep = compute_keep(full, cfg)
    assert keep.tolist() == [True, True, False, False]
    adv = compute_advantages(full, cfg)
    for row, trains in enumerate([True, True, False, False]):
        logp = old[row : row + 1].clone().requires_grad_(True)
        micro = dataclasses.replace(full, logp=logp, old_logp=old[row : row + 1], mask=full.mask[row : row + 1],
                                    rewards=full.rewards[row : row + 1], group_ids=full.group_ids[row : row + 1],
                                    advantages=adv[row : row + 1], keep=keep[row : row + 1])  # fmt: skip
        loss, metrics = compute_loss(micro, cfg)
        loss.backward()
        assert bool(logp.grad.abs().sum() > 0) == trains, row
        assert metrics["rl/dynamic_sampling_kept"].item() == float(trains)
    assert compute_keep(full, LossConfig(name="vepo")) is None
