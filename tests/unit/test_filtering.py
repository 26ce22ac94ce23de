"""RLVR filtering (K -> drop non-compliant -> top G, fill rule, compliance rate) and DAPO dynamic sampling."""

import pytest

from vepo_mcore.rl.filtering import dynamic_sampling, filter_candidates, select_group
from vepo_mcore.translation.sample import Sample


def _group(group_id: int, rewards: list[float], compliant: list[bool]) -> list[Sample]:
    return [
        Sample(group_id=group_id, reward=r, compliant=c, response=f"g{group_id}-{i}")
        for i, (r, c) in enumerate(zip(rewards, compliant))
    ]


def test_top_g_among_compliant():
    group = _group(0, [0.1, 0.9, 0.5, 2.0, 0.7, -1.0], [True, True, True, False, True, True])
    kept, fills = select_group(group, 3)
    assert [s.reward for s in kept] == [0.9, 0.7, 0.5] and fills == 0  # 2.0 is non-compliant: dropped


def test_fill_with_best_non_compliant():
    group = _group(0, [0.1, 3.0, 0.5, 2.0], [True, False, False, False])
    kept, fills = select_group(group, 3)
    assert [s.reward for s in kept] == [0.1, 3.0, 2.0] and fills == 2


def test_filter_candidates_metrics():
    samples = _group(0, [1, 2, 3, 4], [True, True, True, True]) + _group(
        1, [1, 2, 3, 4], [False, True, False, False]
    )
    kept, metrics = filter_candidates(samples, group_size=2)
    assert [s.response for s in kept] == ["g0-3", "g0-2", "g1-1", "g1-3"]
    assert metrics["filter/compliance_rate"] == pytest.approx(5 / 8)
    assert metrics["filter/fill_rate"] == pytest.approx(1 / 4)
    assert metrics["filter/groups_filled"] == 1.0 and metrics["filter/kept"] == 4.0
    # K = 4 -> G = 2 removes half; of the removed, g1-0 and g1-2 broke a constraint
    assert metrics["filter/filtered_share"] == 0.5 and metrics["filter/noncompliant_removed"] == 2 / 8


def test_disabled_keeps_the_first_g():
    samples = _group(0, [1, 5, 3], [True, False, True])
    kept, metrics = filter_candidates(samples, group_size=2, enabled=False)
    assert [s.response for s in kept] == ["g0-0", "g0-1"]
    assert metrics["filter/compliance_rate"] == pytest.approx(2 / 3) and metrics["filter/fill_rate"] == 0.0
    assert metrics["filter/filtered_share"] == metrics["filter/noncompliant_removed"] == 0.0


def test_too_few_candidates_is_an_error():
    with pytest.raises(
        ValueError, match="prompt group 7 has 2 candidates, fewer than rl.filtering.group_size = 3"
    ):
        select_group(_group(7, [1, 2], [True, True]), 3)


def test_dynamic_sampling_drops_constant_groups():
    samples = (
        _group(0, [1.0, 1.0, 1.0], [True] * 3)
        + _group(1, [0.0, 1.0, 0.0], [True] * 3)
        + _group(2, [-2.0] * 3, [True] * 3)
    )
    kept, metrics = dynamic_sampling(samples)
    assert {s.group_id for s in kept} == {1} and len(kept) == 3
    assert metrics == {"filter/groups_dropped_constant": 2.0, "filter/groups_kept": 1.0}
