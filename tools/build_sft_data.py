"""Build the tiny SFT set (ChatML jsonl) from FLORES-200 dev for the quickstart and tests.

python tools/build_sft_data.py --output-dir data/sft_tiny --per-source 200
# -> data/sft_tiny/{general,multilingual,translation,reasoning}.jsonl,
#    the files examples/configs/sft_tiny.yaml reads (3 phases, 5:1 general : multilingual)
"""

from __future__ import annotations

import argparse
import sys

from vepo_mcore.data.sft_flores import build_flores_sft_set  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default="data/sft_tiny", help="where the jsonl files go")
    p.add_argument("--per-source", type=int, default=200, help="conversations per source file")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = p.parse_args(argv)
    for name, path in build_flores_sft_set(args.output_dir, args.per_source, args.seed).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
