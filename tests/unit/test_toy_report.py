"""toy.report.one_seed_wall: the recipe's cost comes only from a seed that timed every stage."""

from __future__ import annotations

from vepo_mcore.toy.report import SEED_STAGES, one_seed_wall


def test_one_seed_wall_takes_the_fastest_complete_seed_and_skips_copied_stages():
    full = {stage: 100.0 for stage in SEED_STAGES}
    slow = {stage: 300.0 for stage in SEED_STAGES}
    copied = {"sft": 50.0, "rl": 60.0, "eval_sft": 1.0, "eval_rl": 1.0}  # base/resize/cpt copied in
    shared = {"tokenizer_expand": 40.0, "data_and_trim": 5.0}
    wall, index = one_seed_wall(shared, [slow, copied, full])
    assert index == 2 and wall == 45.0 + 100.0 * len(SEED_STAGES)
    assert one_seed_wall(shared, [copied]) == (None, None)
