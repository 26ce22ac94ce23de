"""r_len: the shipped FLORES-dev ratio table, rho ~ 1 for references in all 90 directions."""

import json
import statistics

import pytest

from tools.build_length_table import build_table
from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.length import LENGTH_TABLE, length_ratio, length_reward, length_term, typical_ratio
from vepo_mcore.translation.sample import Sample

DIRECTIONS = [(s, t) for s in LANGS for t in LANGS if s != t]


def test_shipped_table_is_what_the_generator_builds():
    shipped = json.loads(LENGTH_TABLE.read_text(encoding="utf-8"))["ratios"]
    assert len(shipped) == 90
    assert shipped == build_table("dev")


def test_table_entry_is_the_naive_median_of_dev_ratios():
    src, tgt = load_flores("en", "dev"), load_flores("th", "dev")
    ratios = sorted(len(b.strip()) / len(a.strip()) for a, b in zip(src, tgt))
    n = len(ratios)
    median = ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2
    assert typical_ratio("en", "th") == pytest.approx(median, abs=1e-4)
    assert typical_ratio("en", "zh") < 0.5 < 2.0 < typical_ratio("zh", "en")  # why the table is needed


def test_references_have_rho_near_one_in_all_90_directions():
    devtest = {code: load_flores(code, "devtest") for code in LANGS}
    for src, tgt in DIRECTIONS:
        rhos = [length_ratio(x, y, src, tgt) for x, y in zip(devtest[src], devtest[tgt])]
        assert 0.9 <= statistics.median(rhos) <= 1.1, (src, tgt, statistics.median(rhos))
        assert sum(0.5 <= r <= 2.0 for r in rhos) / len(rhos) >= 0.97, (src, tgt)


def test_length_term_formula():
    assert length_term(1.0) == length_term(0.5) == length_term(2.0) == 1.0
    assert length_term(0.25) == pytest.approx(-0.25)
    assert length_term(3.5, sigma=2.0) == pytest.approx(-3.0)
    assert length_term(0.0) == pytest.approx(-0.5)


def test_doubled_and_empty_outputs_fail():
    src, ref = load_flores("en")[0], load_flores("vi")[0]
    result = length_reward(
        [
            Sample(source=src, response=ref, src_lang="en", tgt_lang="vi"),
            Sample(source=src, response=f"{ref} {ref} {ref}", src_lang="en", tgt_lang="vi"),
            Sample(source=src, response="", src_lang="en", tgt_lang="vi"),
        ],
        RewardsConfig(),
    )
    assert result.passed == [True, False, False]
    assert result.values[0] == 1.0 and result.values[1] < 0 and result.values[2] == pytest.approx(-0.5)
    assert result.raw[1] == pytest.approx(3 * result.raw[0], rel=0.01)


def test_unknown_direction_lists_the_known_ones():
    with pytest.raises(ValueError, match="known directions: en-fil"):
        typical_ratio("en", "xx")


def test_taper_slopes_down_to_the_outside_term():
    interval = (0.5, 1.7)
    assert length_term(1.2, interval, taper=1.2) == 1.0
    assert length_term(1.45, interval, taper=1.2) == pytest.approx(0.5)
    assert length_term(1.7, interval, taper=1.2) == pytest.approx(0.0)
    # continuous at the upper end: just outside, the SPEC term starts from 0 as well
    assert length_term(1.7 + 1e-9, interval, taper=1.2) == pytest.approx(0.0, abs=1e-8)
    assert length_term(0.5, interval, taper=1.2) == 1.0  # the lower side is unchanged
    assert length_term(1.6, interval) == 1.0  # no taper: flat, as SPEC section 5


def test_taper_outside_the_interval_is_refused():
    with pytest.raises(ValueError, match="length_taper"):
        RewardsConfig(length_interval=(0.5, 1.7), length_taper=1.8).validate()


def test_length_reward_applies_the_configured_taper():
    src, ref = load_flores("en")[0], load_flores("vi")[0]
    long = Sample(source=src, response=f"{ref} {ref[: len(ref) // 2]}", src_lang="en", tgt_lang="vi")
    cfg = RewardsConfig(length_interval=(0.5, 2.0), length_taper=1.0)
    result = length_reward([long], cfg)
    assert result.passed == [True] and 0 < result.values[0] < 1
