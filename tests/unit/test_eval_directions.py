"""Direction parsing and the groups of the paper's Table 3; published baselines match SPEC."""

from __future__ import annotations

from pathlib import Path

import pytest

from vepo_mcore.eval.baselines import PAPER_TABLE3, paper_systems
from vepo_mcore.translation.directions import ALL_DIRECTIONS, Direction, group_members, parse_directions


def test_all_directions_and_groups():
    assert len(ALL_DIRECTIONS) == 90 == len(set(ALL_DIRECTIONS))
    assert str(ALL_DIRECTIONS[0]) == "en-zh"
    groups = group_members(list(ALL_DIRECTIONS))
    assert {k: len(v) for k, v in groups.items()} == {"x2e": 9, "e2x": 9, "x2x": 72, "avg": 90}
    assert all(d.tgt == "en" for d in groups["x2e"]) and all(d.src == "en" for d in groups["e2x"])


def test_parse_directions_pairs_groups_and_order():
    assert [str(d) for d in parse_directions("th-en, en-th")] == ["en-th", "th-en"]
    assert len(parse_directions("x2e,e2x")) == 18
    assert len(parse_directions("all")) == 90
    assert len(parse_directions("x2x,km-lo")) == 72  # km-lo is already in x2x
    assert parse_directions("fil-id") == [Direction("fil", "id")]


@pytest.mark.parametrize(
    "spec,match",
    [("en-xx", "unknown language 'xx'"), ("en-en", "into itself"), ("x3e", "unknown direction or group"),
     (" , ", "selects nothing"), ("en-th-vi", "src-tgt")],
)  # fmt: skip
def test_parse_directions_errors(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_directions(spec)


def test_paper_avg_numbers_match_spec():
    # SPEC section 7: Avg over 90 directions (BLEU / COMET / chrF)
    spec = {
        "VEPO-7B (Full)": (24.9, 0.859, 50.9),
        "Google Trans.": (25.9, 0.828, 50.5),
        "NLLB-200": (22.4, 0.836, 47.5),
        "Gemma3-27B-IT": (24.7, 0.854, 49.7),
    }
    systems = paper_systems()
    for name, cell in spec.items():
        assert tuple(systems[name]["avg"]) == cell
    assert sum(len(rows) for rows in PAPER_TABLE3.values()) == 13


PAPER_TEX = Path(__file__).resolve().parents[2].parent / "shared" / "paper" / "vepo_paper.tex"


def test_paper_appendix_tables_shipped_and_consistent_with_table3_avg():
    from vepo_mcore.eval.paper_tables import paper_direction_scores, paper_models

    assert paper_models()[:5] == ["Gem3", "SeedX", "QwenMT", "Huny", "VEPO"] and len(paper_models()) == 16
    bleu = paper_direction_scores("VEPO", "bleu")
    assert len(bleu) == 90 and set(bleu) == {str(d) for d in ALL_DIRECTIONS}
    assert bleu["th-ms"] == pytest.approx(24.3)  # printed as 0.243 in the appendix
    table3 = paper_systems()["VEPO-7B (Full)"]["avg"]
    for metric, published in (("bleu", table3.bleu), ("comet", table3.comet), ("chrf", table3.chrf)):
        mean = sum(paper_direction_scores("VEPO", metric).values()) / 90
        assert abs(mean - published) <= (0.001 if metric == "comet" else 0.1), metric
    with pytest.raises(ValueError, match="models: .*VEPO"):
        paper_direction_scores("GPT", "bleu")


@pytest.mark.skipif(not PAPER_TEX.is_file(), reason="the paper's LaTeX is not next to this checkout")
def test_shipped_csv_is_the_extraction_of_the_paper(tmp_path):
    from vepo_mcore.eval.paper_tables import PAPER_DIRECTIONS_CSV, extract_appendix_tables, write_csv

    write_csv(extract_appendix_tables(PAPER_TEX), tmp_path / "x.csv")
    assert (tmp_path / "x.csv").read_text() == PAPER_DIRECTIONS_CSV.read_text()
