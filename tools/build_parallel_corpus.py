"""English <-> X parallel text from openly licensed localisation packages (Debian), with a manifest.

    python tools/build_parallel_corpus.py --langs th vi id km --out data/bitext
    python tools/build_parallel_corpus.py --langs th --sources firefox cldr --cache ~/.cache/vepo_mcore/debs

Fetches the packages with `apt-get download` into --cache (reused on a rerun; copy it to a machine
without apt), aligns Firefox language packs, LibreOffice help and UI, gettext catalogs and Unicode
CLDR against their English, filters with the reward checks, and writes OUT/<lang>/train.jsonl,
OUT/<lang>/heldout.jsonl (500 in-domain test pairs) and OUT/data.json (package, version, license
and pairs kept of every source). See vepo_mcore/bitext/build.py for the rules.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vepo_mcore.config.cli import run_cli

DEFAULT_CACHE = Path.home() / ".cache" / "vepo_mcore" / "debs"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--langs", nargs="+", required=True, help="target languages (th vi id km ...)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--cache", default=str(DEFAULT_CACHE), help="folder of the fetched .deb files")
    p.add_argument(
        "--sources", nargs="+", default=None, help="source families in priority order (default: all)"
    )
    p.add_argument("--heldout", type=int, default=500, help="in-domain test pairs per language")
    p.add_argument("--debug", action="store_true", help="keep the traceback of a user error")
    args = p.parse_args(argv)

    from vepo_mcore.bitext.build import BitextPlan, build_parallel_corpus

    plan = BitextPlan(
        langs=args.langs, cache=Path(args.cache).expanduser(), out=Path(args.out), heldout=args.heldout
    )
    if args.sources:
        plan = BitextPlan(**{**plan.__dict__, "sources": args.sources})
    manifest = build_parallel_corpus(plan)
    print(f"pairs: {manifest['pairs_total']}  held out: {manifest['heldout']}  -> {args.out}/data.json")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
