"""The constraint verification table as files: hypotheses read from JSONL (errors name file:line),
one table written as markdown + JSON, and the FLORES runs (references, marked-up references, each
corruption) with their summary. tools/verify_constraints.py is the command line."""

from __future__ import annotations

import json
from pathlib import Path

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.constraints import (
    CORRUPTIONS,
    constraint_table,
    constraint_table_markdown,
    flores_samples,
)
from vepo_mcore.translation.sample import Sample

FIELDS = ("source", "hypothesis", "src_lang", "tgt_lang")


def read_jsonl(path: Path) -> list[Sample]:
    samples = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error})") from None
        missing = [f for f in FIELDS if not isinstance(record.get(f), str)]
        if missing:
            raise ValueError(
                f"{path}:{number}: expected string fields {FIELDS}, missing or not strings: {missing}"
            )
        samples.append(
            Sample(
                source=record["source"],
                response=record["hypothesis"],
                reference=record.get("reference"),
                src_lang=record["src_lang"],
                tgt_lang=record["tgt_lang"],
            )
        )
    return samples


def write_table(samples: list[Sample], out: Path, title: str, cfg: RewardsConfig) -> dict:
    table = constraint_table(samples, cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(constraint_table_markdown(table, title), encoding="utf-8")
    print(f"{title}: overall {table['overall']}  -> {out}.md/.json")
    return table


def run_flores(out_dir: Path, split: str, max_lines: int | None, cfg: RewardsConfig) -> None:
    """References (plain and marked up) and each corruption; a summary table of the overall rows."""
    runs = {"references": dict(), "references_markup": dict(markup=True)}
    runs.update({f"corrupt_{name}": dict(corrupt=name) for name in CORRUPTIONS})
    summary = {}
    for name, kwargs in runs.items():
        samples = flores_samples(split, max_lines, **kwargs)
        summary[name] = write_table(samples, out_dir / name, f"FLORES {split} {name}", cfg)["overall"]
    write_summary(out_dir, summary, split, max_lines)


def write_summary(out_dir: Path, summary: dict, split: str, max_lines: int | None) -> None:
    """summary.md / summary.json: the overall row of every FLORES run."""
    lines = [
        f"# Constraint checks on FLORES-200 {split} "
        f"({'all' if max_lines is None else max_lines} lines x 90 directions)",
        "",
        "Rates in %. references: the human references as hypotheses; _markup: source and reference",
        "wrapped in the same markup; corrupt_*: wrong_lang (English line, or the source for X->en),",
        "double / triple (reference 2x / 3x; rho ~ 2 is on the edge of [0.5, 2.0]), strip_markup",
        "(marked-up source, plain hypothesis), mix_en (every third word English, or English words",
        "inserted mid-sentence for non-Latin targets; Indonesian words for en targets).",
        "Format applies only where the source has markup: in plain FLORES that is 18 pairs (Malay devtest",
        "lines 470 and 736 carry stray empty <i> </i> / <sup> </sup> tags that the other references lack).",
        "The references' Lang rate is the LID ceiling a system is read against (reports/lid/lid_report.md).",
        "",
        "| run | N | Lang | Length | Format (N) | Mixing | Overall |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in summary.items():
        fmt = "n/a" if r["format"] is None else f"{r['format']:.1f}"
        lines.append(
            f"| {name} | {r['n']} | {r['lang']:.1f} | {r['length']:.1f} | {fmt} ({r['format_n']}) "
            f"| {r['mixing']:.1f} | {r['overall']:.1f} |"
        )
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
