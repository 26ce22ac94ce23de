"""r_rep: the share of an answer that repeats a looping unit, and its penalty."""

import pytest

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards import rlvr_reward
from vepo_mcore.rewards.repetition import repeated_share, repetition_reward, repetition_term
from vepo_mcore.translation.sample import Sample


def test_share_against_a_hand_count():
    # "สวนงาน" (6 characters) four times: the 2nd-4th copies are 18 of 24 characters.
    assert repeated_share("สวนงานสวนงานสวนงานสวนงาน") == pytest.approx(18 / 24)
    # "Tôi đi đi đi đi học" is 19 characters; the unit "đi " runs 4 times: 3 copies x 3 characters.
    assert repeated_share("Tôi đi đi đi đi học") == pytest.approx(9 / 19)
    assert repeated_share("Hello world, hello again.") == 0.0
    assert repeated_share("ab ab") == 0.0  # two copies are not a loop
    assert repeated_share("   ") == 0.0


@pytest.mark.parametrize("code", LANGS)
def test_references_do_not_loop(code):
    shares = [repeated_share(s) for s in load_flores(code, "dev") + load_flores(code, "devtest")]
    assert max(shares) <= RewardsConfig().rep_threshold


def test_term_and_registration():
    assert repetition_term(0.05) == 0.0 and repetition_term(0.1) == 0.0
    assert repetition_term(0.6, threshold=0.1, zeta=2.0) == pytest.approx(-1.0)
    samples = [Sample(prompt="", response=r, source="x", reference="", src_lang="en", tgt_lang="th")
               for r in ("สวนงานสวนงานสวนงานสวนงาน", "สวัสดีครับ")]  # fmt: skip
    result = repetition_reward(samples)
    assert result.raw == pytest.approx([0.75, 0.0]) and result.values[1] == 0.0 and result.passed is None
    # Weighted in the RLVR sum it lowers the looping answer's total and sets no constraint.
    cfg = RewardsConfig(mt="none", weights={"repetition": 0.5}, normalize=False)
    rewards = rlvr_reward(samples, cfg)
    assert rewards[0] == pytest.approx(0.5 * -2.0 * (0.75 - 0.1)) and rewards[1] == 0.0
    assert "repetition" not in samples[0].passed and samples[0].reward_terms["repetition_raw"] == 0.75


def test_rep_threshold_is_validated():
    with pytest.raises(ValueError, match="rl.rewards.rep_threshold"):
        RewardsConfig(rep_threshold=1.5).validate()
