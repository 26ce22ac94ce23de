"""The constraint table: rates against a hand count, per direction, FLORES runs, and the tool's reader."""

import json
from pathlib import Path

import pytest

from vepo_mcore.languages import load_flores
from vepo_mcore.rewards.constraints import (
    CORRUPTIONS,
    constraint_table,
    constraint_table_markdown,
    flores_samples,
)
from vepo_mcore.rewards.constraints_report import read_jsonl
from vepo_mcore.translation.sample import Sample

ROOT = Path(__file__).resolve().parents[2]


def test_rates_match_a_hand_count():
    en, th, vi = load_flores("en"), load_flores("th"), load_flores("vi")
    samples = [
        Sample(source=en[0], response=th[0], src_lang="en", tgt_lang="th"),  # passes all
        Sample(source=en[1], response=en[1], src_lang="en", tgt_lang="th"),  # Lang + Mixing fail
        Sample(
            source=f"<b>{en[2]}</b>", response=f"<b>{vi[2]}</b>", src_lang="en", tgt_lang="vi"
        ),  # passes all
        Sample(source=f"<b>{en[3]}</b>", response=vi[3], src_lang="en", tgt_lang="vi"),  # Format fails
    ]
    table = constraint_table(samples)
    overall = table["overall"]
    assert overall["n"] == 4
    assert overall["lang"] == overall["mixing"] == 75.0 and overall["length"] == 100.0
    assert overall["format"] == 50.0 and overall["format_n"] == 2
    assert overall["overall"] == 50.0
    assert table["directions"]["en-th"]["format"] is None and table["directions"]["en-th"]["lang"] == 50.0
    assert table["directions"]["en-vi"]["format"] == 50.0
    md = constraint_table_markdown(table)
    assert "| **all** | 4 | 75.0 | 100.0 | 50.0 (2) | 75.0 | 50.0 | 0 |" in md
    assert "| en-vi | 2 |" in md and "paper VEPO-7B" in md


def test_each_corruption_fires_its_check_on_flores():
    ref = constraint_table(flores_samples(max_lines=3))["overall"]
    assert ref["length"] >= 95 and ref["mixing"] >= 95 and ref["lang"] >= 85
    marked = constraint_table(flores_samples(max_lines=3, markup=True))["overall"]
    assert marked["format"] == 100.0 and marked["format_n"] == 270
    column = {
        "wrong_lang": "lang",
        "double": "length",
        "triple": "length",
        "strip_markup": "format",
        "mix_en": "mixing",
    }
    for name in CORRUPTIONS:
        rates = constraint_table(flores_samples(max_lines=3, corrupt=name))["overall"]
        # rho ~ 2 is the edge of [0.5, 2.0]: about half of the doubled lines pass by design.
        assert rates[column[name]] <= (65.0 if name == "double" else 10.0), (name, rates)
    with pytest.raises(ValueError, match="unknown corruption 'x'; known: wrong_lang"):
        flores_samples(corrupt="x")


def test_jsonl_reader_names_the_bad_line(tmp_path):
    path = tmp_path / "h.jsonl"
    good = {"source": "a", "hypothesis": "b", "src_lang": "en", "tgt_lang": "th"}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"source": "a"}) + "\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"h.jsonl:3: expected string fields .* \['hypothesis', 'src_lang', 'tgt_lang'\]"
    ):
        read_jsonl(path)
    path.write_text(json.dumps(good) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(ValueError, match="h.jsonl:2: not valid JSON"):
        read_jsonl(path)
    path.write_text(json.dumps(good) + "\n", encoding="utf-8")
    assert read_jsonl(path)[0].response == "b"


def test_tool_writes_markdown_and_json(tmp_path):
    import subprocess
    import sys

    en, zh = load_flores("en"), load_flores("zh")
    path = tmp_path / "hyps.jsonl"
    rows = [{"source": en[i], "hypothesis": zh[i], "src_lang": "en", "tgt_lang": "zh"} for i in range(5)]
    rows.append({"source": en[5], "hypothesis": en[5], "src_lang": "en", "tgt_lang": "zh"})  # untranslated
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "table"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "verify_constraints.py"),
            "--input",
            str(path),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    table = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert table["overall"]["n"] == 6 and table["directions"]["en-zh"]["n"] == 6
    assert table["overall"]["lang"] <= 100 * 5 / 6
    assert "| en-zh | 6 |" in out.with_suffix(".md").read_text(encoding="utf-8")
