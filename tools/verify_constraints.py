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
from pathlib import Path

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.rewards.constraints_report import read_jsonl, run_flores, write_table
from vepo_mcore.rewards.lid_report import write_lid_report


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
