"""Print the quickstart's summary: each stage's loss, the reward model's accuracy, the RL run, and on
held-out FLORES devtest prompts each stage's change with its 95% paired-bootstrap interval
(before SFT -> SFT, SFT -> RL), the FLORES scores and the plots.

python tools/quickstart_summary.py runs/quickstart
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # recipes/ lives in the checkout, beside tools/


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="the quickstart's output directory")
    from recipes.toy.quickstart import quickstart_summary

    print(quickstart_summary(Path(p.parse_args(argv).run)))


if __name__ == "__main__":
    main()
