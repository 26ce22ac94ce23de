"""The LID report: confusion matrix and rates agree with a direct count."""

from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.lid import predict
from vepo_mcore.rewards.lid_report import lid_report, lid_report_markdown


def test_report_counts_match_a_direct_count():
    report = lid_report(max_lines=15)
    for code in LANGS:
        row = report["confusion"][code]
        assert sum(row.values()) == 15
        assert report["languages"][code]["lines"] == 15
    ms_tops = [predict(line, k=1)[0][0] for line in load_flores("ms")[:15]]
    assert report["confusion"]["ms"]["id"] == ms_tops.count("id")
    assert report["languages"]["ms"]["top1_exact"] == ms_tops.count("ms") / 15
    assert report["languages"]["ms"]["top1_joint"] == sum(t in ("ms", "id") for t in ms_tops) / 15
    md = lid_report_markdown(report)
    assert "| true \\ predicted | en | zh |" in md and "Goal: top-1 accuracy >= 0.99" in md
