"""Rollout correction (rl/rollout_correction.py) against a per-element Python computation, its config
section, how the losses apply the weights and how the engine's log-probs reach the batch."""

from __future__ import annotations

import math

import pytest
import torch

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.config.rl import LossConfig
from vepo_mcore.config.rollout_correction import RolloutCorrectionConfig
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.experience import make_experience
from vepo_mcore.rl.losses import compute_loss
from vepo_mcore.rl.losses.vepo import VEPOOptions
from vepo_mcore.rl.rollout_correction import rollout_correction
from vepo_mcore.rl.trainer import rollout_is_weights
from vepo_mcore.translation.sample import Sample


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    # Mostly small disagreements, a few large ones either way, so every bound is crossed somewhere.
    rollout = old + torch.randn(5, 7, generator=g, dtype=torch.float64) * 0.4
    rollout[1, 2] += 3.0
    rollout[3, 0] -= 2.0
    lengths = [7, 4, 1, 6, 0]  # ragged responses, one with no token
    mask = torch.tensor([[t < n for t in range(7)] for n in lengths])
    return old, rollout, mask


def _naive(old, rollout, mask, cfg: RolloutCorrectionConfig):
    """One Python float at a time: rho per token or per response, then the mode's weight."""
    rows, cols = mask.shape
    weights = [[0.0] * cols for _ in range(rows)]
    rhos, k3s, hit_tokens, hit_rows, n = [], [], 0, 0, 0
    lower = cfg.lower if cfg.lower is not None else (1 / cfg.upper if cfg.mode == "mask" else 0.0)
    for i in range(rows):
        tokens = [t for t in range(cols) if mask[i, t]]
        diffs = [float(old[i, t] - rollout[i, t]) for t in tokens]
        row_hit = False
        for t, d in zip(tokens, diffs):
            n += 1
            k3s.append(math.exp(d) - d - 1)
            log_rho = {"token": d, "sequence": sum(diffs), "geometric": sum(diffs) / len(diffs)}[cfg.level]
            rho = math.exp(max(-20.0, min(20.0, log_rho)))
            rhos.append(rho)
            outside = rho < lower or rho > cfg.upper
            hit_tokens += outside
            row_hit |= outside
            if cfg.mode == "truncate":
                weights[i][t] = min(max(rho, lower), cfg.upper)
            elif cfg.mode == "mask":
                weights[i][t] = 0.0 if outside else rho
            else:
                weights[i][t] = 1.0
        hit_rows += row_hit
    rows_with_tokens = sum(1 for i in range(rows) if mask[i].any())
    metrics = {"rollout_corr/k3": sum(k3s) / n, "rollout_corr/ratio_max": max(rhos),
               "rollout_corr/ratio_min": min(rhos)}  # fmt: skip
    if cfg.mode != "off":
        action = "truncated" if cfg.mode == "truncate" else "masked"
        metrics["rollout_corr/weight_mean"] = sum(sum(row) for row in weights) / n
        metrics[f"rollout_corr/{action}_token_frac"] = hit_tokens / n
        metrics[f"rollout_corr/{action}_seq_frac"] = hit_rows / rows_with_tokens
    return weights, metrics


CASES = [
    RolloutCorrectionConfig(mode=mode, level=level, upper=upper, lower=lower)
    for mode in ("off", "truncate", "mask")
    for level in ("token", "sequence", "geometric")
    for upper, lower in ((2.0, None), (1.2, 0.9))
]


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.mode}-{c.level}-{c.upper}-{c.lower}")
def test_weights_and_metrics_match_a_per_element_computation(cfg):
    old, rollout, mask = _inputs()
    weights, metrics = rollout_correction(old, rollout, mask, cfg)
    expected_weights, expected_metrics = _naive(old, rollout, mask, cfg)
    assert weights.shape == old.shape and weights.dtype == old.dtype
    assert torch.allclose(weights, torch.tensor(expected_weights, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    assert set(metrics) == set(expected_metrics)
    for key, value in expected_metrics.items():
        assert metrics[key].item() == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_the_example_crosses_both_bounds_so_the_counts_are_exercised():
    old, rollout, mask = _inputs()
    _, metrics = rollout_correction(
        old, rollout, mask, RolloutCorrectionConfig(mode="mask", upper=1.2, lower=0.9)
    )
    assert 0 < metrics["rollout_corr/masked_token_frac"].item() < 1
    assert 0 < metrics["rollout_corr/masked_seq_frac"].item() <= 1


def test_agreeing_engine_gives_unit_weights_and_zero_mismatch():
    old, _, mask = _inputs()
    for mode in ("truncate", "mask"):
        weights, metrics = rollout_correction(
            old, old.clone(), mask, RolloutCorrectionConfig(mode=mode, level="sequence")
        )
        assert torch.equal(weights, mask.to(old.dtype))
        assert metrics["rollout_corr/k3"].item() == 0.0 and metrics["rollout_corr/ratio_max"].item() == 1.0


def test_huge_sequence_ratios_stay_finite():
    old = torch.zeros(1, 400)
    weights, metrics = rollout_correction(
        old, old - 1.0, torch.ones(1, 400), RolloutCorrectionConfig(mode="truncate", level="sequence")
    )
    assert torch.all(weights == 2.0) and math.isfinite(metrics["rollout_corr/ratio_max"].item())


def test_shapes_must_agree():
    with pytest.raises(ValueError, match=r"one \[B, T\] shape"):
        rollout_correction(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), RolloutCorrectionConfig())


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"upper": 0.5}, "rl.rollout_correction.upper must be >= 1"),
        ({"lower": 1.5}, r"rl.rollout_correction.lower must be in \[0, 1\]"),
        ({"mode": "mask", "upper": 1.0}, "must be below rl.rollout_correction.upper"),
        ({"mode": "tis"}, "rl.rollout_correction.mode must be"),
        ({"level": "seq"}, "rl.rollout_correction.level must be"),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        RolloutCorrectionConfig(**overrides).validate()


def test_the_section_loads_from_dotted_flags_and_is_off_by_default():
    assert load_config(JobConfig, None, []).rl.rollout_correction.mode == "off"
    cfg = load_config(JobConfig, None, ["--rl.rollout_correction.mode", "mask",
                                        "--rl.rollout_correction.level", "geometric"])  # fmt: skip
    assert (cfg.rl.rollout_correction.mode, cfg.rl.rollout_correction.lower_bound()) == ("mask", 0.5)
    with pytest.raises(ValueError, match="rl.rollout_correction.mode"):
        load_config(JobConfig, None, ["--rl.rollout_correction.mode", "clip"])
    with pytest.raises(ValueError, match="rl.rollout_correction.upper"):
        load_config(JobConfig, None, ["--rl.rollout_correction.upper", "0.9"])


@pytest.mark.parametrize("name", ["vepo", "grpo", "dapo", "rloo", "reinforce_pp"])
def test_losses_weigh_each_tokens_surrogate(name):
    """Weights w on every token: the policy-gradient term is -agg(w * min(r A, clip(r) A)), and
    unit weights change nothing."""
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 5, generator=g)
    old = logp + torch.randn(4, 5, generator=g) * 0.3
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2, 3:] = False
    adv = torch.randn(4, 5, generator=g)
    weights = torch.rand(4, 5, generator=g) * 2 * mask
    cfg = LossConfig(name=name, options={"vepo": VEPOOptions(alpha=0.0, beta=0.0)})  # read by vepo only

    def pg(w):
        batch = RLBatch(logp=logp, old_logp=old, mask=mask, advantages=adv, entropy=torch.zeros(4, 5),
                        group_ids=torch.tensor([0, 0, 1, 1]), rewards=torch.tensor([0.0, 1.0, 0.0, 1.0]),
                        rollout_is_weights=w)  # fmt: skip
        return compute_loss(batch, cfg)[1]["rl/pg_loss"].item()

    eps_high = cfg.eps_high if name in ("vepo", "dapo") else cfg.eps_low
    ratio = torch.exp(logp - old)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - cfg.eps_low, 1 + eps_high) * adv)
    m = mask.float()
    if name == "grpo":  # sequence mean of token means
        expected = -(((weights * surrogate * m).sum(1) / m.sum(1)).mean())
    else:
        expected = -((weights * surrogate * m).sum() / m.sum())
    assert pg(weights) == pytest.approx(expected.item(), rel=1e-5)
    assert pg(m) == pytest.approx(pg(None), rel=1e-6)


def _sample(prompt, response, logprobs):
    return Sample(prompt_ids=prompt, response_ids=response, rollout_logprobs=logprobs, group_id=0)


def test_make_experience_places_the_engine_logprobs_on_the_response_positions():
    exp = make_experience(
        [_sample([1, 2, 3], [4, 5], [-0.1, -0.2]), _sample([1], [6, 7, 8], [-1.0, -2.0, -3.0])], 0
    )
    assert torch.equal(exp.rollout_logp != 0, exp.loss_mask.bool())
    assert exp.rollout_logp[exp.loss_mask.bool()].tolist() == pytest.approx([-0.1, -0.2, -1.0, -2.0, -3.0])
    assert make_experience([_sample([1], [2], None), _sample([1], [2], [-0.5])], 0).rollout_logp is None
    with pytest.raises(ValueError, match="2 response tokens but 1 rollout log-probs"):
        make_experience([_sample([1], [2, 3], [-0.5])], 0)


def test_the_trainer_logs_the_mismatch_and_refuses_a_mode_without_engine_logprobs():
    exp = make_experience([_sample([1, 2], [3, 4], [-0.5, -0.7])], 0)
    exp.old_logp = torch.tensor([[0.0, -0.4, -0.9]])
    metrics: dict[str, float] = {}
    assert rollout_is_weights(exp, RolloutCorrectionConfig(), metrics) is None
    assert metrics["rollout_corr/ratio_max"] == pytest.approx(math.exp(0.1))
    weights = rollout_is_weights(exp, RolloutCorrectionConfig(mode="truncate", upper=1.05), metrics)
    assert weights[0].tolist() == pytest.approx([0.0, 1.05, math.exp(-0.2)])
    assert metrics["rollout_corr/truncated_token_frac"] == 0.5
    exp.rollout_logp = None
    with pytest.raises(
        ValueError, match="rl.rollout_correction.mode 'mask' needs the rollout engine's log-probs"
    ):
        rollout_is_weights(exp, RolloutCorrectionConfig(mode="mask"), {})
