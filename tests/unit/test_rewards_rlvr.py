"""R_RLVR: weights, per-term clipping, batch z-normalisation (float64 reference), the registry."""

import math

import numpy as np
import pytest

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import load_flores
from vepo_mcore.rewards import TermResult, get_reward, register_reward, rlvr_reward
from vepo_mcore.rewards.rlvr import active_terms, z_normalize
from vepo_mcore.translation.sample import Sample


def _samples() -> list[Sample]:
    en, th, zh = load_flores("en"), load_flores("th"), load_flores("zh")
    good = [
        Sample(source=en[i], response=th[i], reference=th[i], src_lang="en", tgt_lang="th") for i in range(3)
    ]
    wrong_lang = Sample(source=en[3], response=en[3], reference=th[3], src_lang="en", tgt_lang="th")
    doubled = Sample(source=en[4], response=(th[4] + " ") * 6, reference=th[4], src_lang="en", tgt_lang="th")
    mixed = Sample(
        source=en[5], response=th[5] + " " + en[5].lower(), reference=th[5], src_lang="en", tgt_lang="th"
    )
    formatted = Sample(
        source="<b>" + en[6] + "</b>", response=th[6], reference=th[6], src_lang="en", tgt_lang="th"
    )
    other = Sample(source=en[7], response=zh[7], reference=th[7], src_lang="en", tgt_lang="th")
    return good + [wrong_lang, doubled, mixed, formatted, other]


def test_total_is_the_weighted_sum_of_clipped_terms_and_normalised():
    cfg = RewardsConfig()
    samples = _samples()
    rewards = rlvr_reward(samples, cfg)
    weights = cfg.weights
    totals = np.array(
        [sum(weights[k] * float(np.clip(s.reward_terms[k], -5, 5)) for k in weights) for s in samples],
        dtype=np.float64,
    )
    expected = (totals - totals.mean()) / (totals.std() + 1e-6)
    np.testing.assert_allclose(rewards, expected, atol=1e-9)
    np.testing.assert_allclose([s.reward_terms["total"] for s in samples], totals, atol=1e-12)
    assert [s.reward for s in samples] == rewards


def test_each_corruption_fails_its_own_check():
    samples = _samples()
    rlvr_reward(samples, RewardsConfig())
    assert all(s.compliant and all(s.passed.values()) for s in samples[:3])
    assert set(samples[0].passed) == {"lang", "length", "format", "mixing"}
    wrong_lang, doubled, mixed, formatted, other = samples[3:]
    assert not wrong_lang.passed["lang"] and not wrong_lang.compliant
    assert not doubled.passed["length"] and doubled.reward_terms["length"] < 0
    assert not mixed.passed["mixing"] and mixed.reward_terms["mixing"] < 0
    assert not formatted.passed["format"] and formatted.reward_terms["format"] == 0.0
    assert not other.passed["lang"] and not other.passed["mixing"]
    # A lost structure scores r_fmt = 0 like an unstructured source (SPEC), so only the others rank lower.
    assert max(s.reward for s in (wrong_lang, doubled, mixed, other)) < min(s.reward for s in samples[:3])


def test_per_term_clipping_bounds_a_huge_penalty():
    cfg = RewardsConfig(normalize=False, mt="none")
    en, th = load_flores("en")[0], load_flores("th")[0]
    sample = Sample(source=en, response=th * 40, src_lang="en", tgt_lang="th")  # rho ~ 40 -> r_len ~ -38
    rlvr_reward([sample], cfg)
    assert sample.reward_terms["length"] < -30
    terms = sample.reward_terms
    expected = 0.3 * -5.0 + 0.2 * terms["format"] + 0.4 * terms["lid"] + 0.3 * max(-5.0, terms["mixing"])
    assert sample.reward == pytest.approx(expected)


def test_z_normalize_reference_and_edge_cases():
    values = [0.3, -1.2, 4.0, 0.0]
    ref = (np.array(values) - np.mean(values)) / (np.std(values) + 1e-6)
    np.testing.assert_allclose(z_normalize(values), ref, atol=1e-12)
    assert z_normalize([]) == [] and z_normalize([2.0]) == [0.0] and z_normalize([1.0, 1.0]) == [0.0, 0.0]


def test_active_terms_follow_the_weights():
    assert [name for name, _ in active_terms(RewardsConfig())] == ["mt", "length", "format", "lid", "mixing"]
    assert "mt" not in dict(active_terms(RewardsConfig(mt="none")))
    assert dict(active_terms(RewardsConfig(weights={"length": 0.0, "lid": 1.0}))) == {"lid": 1.0}


def test_a_user_reward_in_one_decorator():
    @register_reward("test_politeness")
    def politeness(samples):  # the one-argument contract: samples -> list[float]
        return [float("please" in s.response) for s in samples]

    @register_reward("test_short", constraint="short")
    def short(samples, cfg):
        return TermResult(values=[1.0] * len(samples), passed=[len(s.response) < 10 for s in samples])

    cfg = RewardsConfig(mt="none", normalize=False, weights={"test_politeness": 2.0, "test_short": 0.5})
    samples = [Sample(response="please"), Sample(response="no thanks at all")]
    assert rlvr_reward(samples, cfg) == [2.5, 0.5]
    assert samples[0].passed == {"short": True} and not samples[1].compliant


def test_registry_errors():
    with pytest.raises(
        ValueError, match="unknown reward 'nope'; registered: .*format.*length.*lid.*mixing.*mt"
    ):
        get_reward("nope")

    @register_reward("test_nan")
    def nan_reward(samples):
        return [math.nan] * len(samples)

    with pytest.raises(ValueError, match="'test_nan' returned NaN"):
        rlvr_reward([Sample()], RewardsConfig(mt="none", weights={"test_nan": 1.0}))

    @register_reward("test_wrong_len")
    def wrong_len(samples):
        return [0.0]

    with pytest.raises(ValueError, match="returned 1 values for 2 samples"):
        rlvr_reward([Sample(), Sample()], RewardsConfig(mt="none", weights={"test_wrong_len": 1.0}))


def test_config_validation_names_the_field():
    RewardsConfig().validate()
    for bad, match in [
        (dict(length_interval=(2.0, 0.5)), "length_interval"),
        (dict(clip=0.0), "clip"),
        (dict(lid_threshold=1.5), "lid_threshold"),
        (dict(mt="comet"), "comet_checkpoint"),
        (dict(mix_threshold=2.0), "mix_threshold"),
    ]:
        with pytest.raises(ValueError, match=match):
            RewardsConfig(**bad).validate()


def test_builtin_terms_follow_the_one_argument_contract():
    sample = Sample(
        source=load_flores("en")[0],
        response=load_flores("vi")[0],
        reference=load_flores("vi")[0],
        src_lang="en",
        tgt_lang="vi",
    )
    for name in ("length", "format", "lid", "mixing", "mt"):
        out = get_reward(name).fn([sample])  # cfg defaults to RewardsConfig()
        values = out.values if isinstance(out, TermResult) else out
        assert len(values) == 1 and math.isfinite(values[0])
