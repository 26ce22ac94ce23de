"""Constraint verification table (Lang / Length / Format / Mixing / Overall pass rates, overall and
per direction) in markdown + JSON, from the same verifiers the RLVR reward uses.

    # a jsonl with {"source", "hypothesis", "src_lang", "tgt_lang"} per line
    python tools/verify_constraints.py --input hyps.jsonl --out reports/constraints/my_system
    # FLORES references (all 90 directions) and corrupted copies of them, plus a summary
    python tools/verify_constraints.py --flores --out-dir reports/constraints [--max-lines 200]
    # the LID report on FLORES references
    python tools/verify_constraints.py --lid-report reports/lid
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.constraints import (
    CORRUPTIONS,
    constraint_table,
    constraint_table_markdown,
    flores_samples,
)
from vepo_mcore.rewards.lid_report import write_lid_report
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--input", type=Path, help="jsonl of source/hypothesis/src_lang/tgt_lang")
    parser.add_argument("--out", type=Path, help="output path without suffix (writes .md and .json)")
    parser.add_argument("--flores", action="store_true", help="run on FLORES references and corruptions")
    parser.add_argument("--out-dir", type=Path, default=Path("reports/constraints"))
    parser.add_argument("--split", default="devtest")
    parser.add_argument("--max-lines", type=int, default=None, help="FLORES lines per direction")
    parser.add_argument("--lid-report", type=Path, help="write the LID report into this folder")
    parser.add_argument("--lid-threshold", type=float, default=RewardsConfig().lid_threshold)
    args = parser.parse_args()
    cfg = RewardsConfig(lid_threshold=args.lid_threshold)
    if args.lid_report:
        write_lid_report(args.lid_report, args.split, args.lid_threshold)
        print(f"wrote {args.lid_report}/lid_report.md/.json")
    if args.flores:
        run_flores(args.out_dir, args.split, args.max_lines, cfg)
    if args.input:
        if args.out is None:
            parser.error("--input needs --out")
        write_table(read_jsonl(args.input), args.out, f"Constraint verification: {args.input.name}", cfg)
    if not (args.lid_report or args.flores or args.input):
        parser.error("give --input, --flores or --lid-report")


if __name__ == "__main__":
    main()
