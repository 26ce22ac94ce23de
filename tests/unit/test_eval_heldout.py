"""eval/heldout.py summaries and the paired-bootstrap interval of a mean difference."""

from __future__ import annotations

import numpy as np
import pytest

from vepo_mcore.eval.bootstrap import paired_mean_diff_ci
from vepo_mcore.eval.heldout import (
    by_direction,
    mismatched_chrf,
    paired_deltas,
    read_records,
    same_opening_share,
    summarize,
    write_records,
)
from vepo_mcore.rewards.mt import chrf_score


def _record(direction: str, index: int, stop: bool, overall: bool, chrf: float) -> dict:
    return {"direction": direction, "index": index, "source": "s", "reference": "r", "hypothesis": "h",
            "response_tokens": 10 if stop else 96, "stop": stop, "lang": overall, "length": True,
            "format": True, "mixing": True, "overall": overall, "chrf": chrf}  # fmt: skip


def test_interval_of_a_constant_shift_is_that_shift():
    base = np.linspace(0, 10, 40)
    assert paired_mean_diff_ci(base, base) == (0.0, 0.0)
    lo, hi = paired_mean_diff_ci(base, base + 1.5)
    assert lo == pytest.approx(1.5) and hi == pytest.approx(1.5)


def test_interval_covers_the_true_difference_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    widths = []
    for n in (50, 800):
        base = rng.normal(size=n)
        system = base + 0.3 + rng.normal(scale=1.0, size=n)
        lo, hi = paired_mean_diff_ci(base, system)
        assert lo < 0.3 < hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 3  # ~ 1 / sqrt(16)


def test_interval_refuses_unpaired_input():
    with pytest.raises(ValueError, match="differ in shape"):
        paired_mean_diff_ci([1.0, 2.0], [1.0])


def test_summary_and_deltas(tmp_path):
    sft = [_record("en-th", i, stop=i % 2 == 0, overall=False, chrf=10.0) for i in range(20)]
    rl = [_record("en-th", i, stop=True, overall=True, chrf=12.0) for i in range(20)]
    summary = summarize(rl)
    assert summary["stop_rate"] == 100.0 and summary["overall_pass"] == 100.0 and summary["chrf"] == 12.0
    assert summarize(sft)["stop_rate"] == 50.0 and summarize(sft)["response_tokens"] == 53.0
    deltas = paired_deltas(sft, rl)
    assert deltas["overall_pass"] == [100.0, 100.0] and deltas["chrf"] == [2.0, 2.0]
    lo, hi = deltas["stop_rate"]
    assert 20.0 < lo <= 50.0 <= hi < 80.0
    broken = rl + [_record("th-en", i, stop=True, overall=i == 0, chrf=4.0) for i in range(4)]
    assert by_direction(broken) == {"en-th/overall_pass": 100.0, "en-th/chrf": 12.0,
                                    "th-en/overall_pass": 25.0, "th-en/chrf": 4.0}  # fmt: skip
    write_records(rl, tmp_path / "r.jsonl")
    assert read_records(tmp_path / "r.jsonl") == rl


SENTENCES = ["The cat sat on the mat near the door.", "Rain fell over the northern hills all night.",
             "Engineers repaired the old bridge in March.", "Children played football in the park."]  # fmt: skip


def _translations(direction: str, hypotheses: list[str]) -> list[dict]:
    return [{**_record(direction, i, True, True, 100.0 * chrf_score(h, SENTENCES[i])),
             "reference": SENTENCES[i], "hypothesis": h} for i, h in enumerate(hypotheses)]  # fmt: skip


def test_source_measures_tell_a_translator_from_a_policy_that_ignores_its_source():
    faithful = _translations("de-en", SENTENCES)
    generic = _translations("de-en", ["The old man sat in the park all night."] * 4)
    # Each hypothesis against the next sentence's reference (cyclic), computed with sacreBLEU here.
    expected = [100.0 * chrf_score(SENTENCES[i], SENTENCES[(i + 1) % 4]) for i in range(4)]
    assert mismatched_chrf(faithful) == pytest.approx(expected)
    exact, ignores = summarize(faithful), summarize(generic)
    assert exact["chrf"] == pytest.approx(100.0)
    assert exact["chrf_source"] == pytest.approx(100.0 - sum(expected) / 4)
    # The same text for every prompt scores equally against every reference on average: no source gain.
    assert ignores["chrf"] > 10.0 and ignores["chrf_source"] == pytest.approx(0.0, abs=1e-9)
    assert exact["same_opening"] == 25.0 and ignores["same_opening"] == 100.0
    lo, hi = paired_deltas(generic, faithful)["chrf_source"]
    assert lo > 50.0 and hi > lo


def test_mismatched_references_stay_inside_a_direction_and_follow_the_index():
    records = _translations("de-en", SENTENCES[:2]) + _translations("fr-en", SENTENCES[2:4])
    shuffled = [records[1], records[3], records[0], records[2]]
    scores = dict(zip((id(r) for r in shuffled), mismatched_chrf(shuffled)))
    assert scores[id(records[0])] == pytest.approx(100.0 * chrf_score(SENTENCES[0], SENTENCES[1]))
    assert scores[id(records[1])] == pytest.approx(100.0 * chrf_score(SENTENCES[1], SENTENCES[0]))
    # fr-en's references are SENTENCES[0:2]: each direction is scored against its own references.
    assert scores[id(records[2])] == pytest.approx(100.0 * chrf_score(SENTENCES[2], SENTENCES[1]))
    assert same_opening_share(shuffled, chars=4) == 50.0  # "The " / "Rain", "Engi" / "Chil": 1 of 2 each
    records[1]["hypothesis"] = "The rain fell."
    assert same_opening_share(shuffled, chars=4) == 75.0  # de-en now opens alike twice
    with pytest.raises(ValueError, match="no held-out records"):
        same_opening_share([])


def test_deltas_refuse_different_sentences(tmp_path):
    a = [_record("en-th", i, True, True, 1.0) for i in range(3)]
    b = [_record("en-vi", i, True, True, 1.0) for i in range(3)]
    with pytest.raises(ValueError, match="different sentences"):
        paired_deltas(a, b)
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_records(tmp_path / "bad.jsonl")


def test_copy_rate_counts_only_what_the_reference_keeps():
    from vepo_mcore.eval.heldout import carried_share

    rows = [  # items the reference keeps: XHR; 2 and 3 (It opens a sentence: the reference drops it)
        {
            "source": "Remove all XHR breakpoints. It stops.",
            "reference": "ลบ XHR ทั้งหมด หยุด",
            "hypothesis": "ลบ XHR",
        },
        {"source": "Open 2 of 3 tabs", "reference": "เปิด 2 จาก 3 แท็บ", "hypothesis": "เปิด 2 แท็บ"},
    ]
    assert carried_share(rows) == pytest.approx(100.0 * 2 / 3)
    assert carried_share(rows, "numbers") == pytest.approx(50.0)  # 2 kept, 3 dropped
    assert carried_share(rows, "names") == pytest.approx(100.0)  # XHR
    with pytest.raises(ValueError, match="'dates' is not one of"):
        carried_share(rows, "dates")
    assert np.isnan(carried_share([{"source": "Go to Paris", "reference": "ไปปารีส", "hypothesis": "Paris"}]))
