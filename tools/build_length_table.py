"""Build the per-direction typical length-ratio table used by the r_len reward.

For every ordered pair of the ten languages, the median over FLORES-200 dev lines of
len(target) / len(source) in characters (stripped). Run:

    python tools/build_length_table.py [--split dev] [--out vepo_mcore/assets/length_ratios.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.length import LENGTH_TABLE


def build_table(split: str = "dev") -> dict[str, float]:
    """{"src-tgt": median char-length ratio} over the 90 ordered directions."""
    lengths = {code: [max(len(line.strip()), 1) for line in load_flores(code, split)] for code in LANGS}
    table = {}
    for src in LANGS:
        for tgt in LANGS:
            if src != tgt:
                ratios = [t / s for s, t in zip(lengths[src], lengths[tgt])]
                table[f"{src}-{tgt}"] = round(statistics.median(ratios), 4)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--split", default="dev")
    parser.add_argument("--out", type=Path, default=LENGTH_TABLE)
    args = parser.parse_args()
    table = build_table(args.split)
    payload = {
        "description": "median len(target)/len(source) in characters over FLORES-200 lines",
        "split": args.split,
        "ratios": table,
    }
    args.out.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {len(table)} directions to {args.out}")


if __name__ == "__main__":
    main()
