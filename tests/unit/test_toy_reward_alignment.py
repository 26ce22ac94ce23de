"""recipes/toy/reward_alignment.py: the within-group correlation of each reward term with an answer's
source dependence, on synthetic rows (the statistic) and on FLORES answers with the real reward terms."""

from __future__ import annotations

import pytest

from recipes.toy.reward_alignment import alignment, answer_rows, within_group_r
from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import load_flores
from vepo_mcore.translation.sample import Sample


def _rows(sign: float) -> list[dict]:
    rows = []
    for group in range(6):
        for k in range(4):
            measure = float(k + group % 2)
            rows.append({"group": group, "key": sign * measure + 0.1 * ((k * 7 + group) % 3), "m": measure})
    return rows


def test_the_within_group_r_follows_the_sign_and_skips_groups_that_do_not_vary():
    up, down = within_group_r(_rows(1.0), "m", "key"), within_group_r(_rows(-1.0), "m", "key")
    assert up["r"] > 0.9 and down["r"] < -0.9 and up["groups"] == down["groups"] == 6
    assert up["low"] <= up["r"] <= up["high"]
    flat = _rows(1.0) + [{"group": 9, "key": 1.0, "m": float(k)} for k in range(4)]  # key constant: no r
    flat += [{"group": 10, "key": float(k), "m": None} for k in range(4)]  # no measure: left out
    assert within_group_r(flat, "m", "key")["groups"] == 6
    assert within_group_r([{"group": 0, "key": 1.0, "m": 1.0}], "m", "key")["r"] is None


def test_answers_closer_to_their_own_reference_earn_more_mt_reward():
    en, th = load_flores("en", "dev"), load_flores("th", "dev")
    samples = []
    for group, i in enumerate((800, 801, 802)):
        other = th[800 + (group + 1) % 3]
        answers = [th[i], th[i][: len(th[i]) // 2], other, th[i][: len(th[i]) // 3] + " " + other[:20]]
        samples += [Sample(source=en[i], reference=th[i], response=a, src_lang="en", tgt_lang="th", group_id=group)
                    for a in answers]  # fmt: skip
    rows = answer_rows(samples, RewardsConfig())
    assert rows[0]["src_chrf"] > 50 and rows[2]["src_chrf"] < 0  # its own reference / the next prompt's
    assert all(abs(r["total"] - sum(v for k, v in r.items() if k.startswith("term/"))) < 1e-9 for r in rows)
    assert {"term/mt", "term/lid", "term/mixing", "term/length"} <= set(rows[0])
    table = alignment(rows)
    assert table["src_chrf"]["term/mt"]["r"] > 0.5 and table["src_chrf"]["term/mt"]["groups"] == 3
    with pytest.raises(ValueError, match="en-th has one prompt"):
        answer_rows(samples[:4], RewardsConfig())
