"""Held-out, sentence-level evaluation of a checkpoint: stop rate, constraint pass rates, chrF++.

    python tools/eval_heldout.py --checkpoint runs/toy/seed0/sft --directions en-th,th-en \\
        --max-sentences 50 --max-new-tokens 96 --out runs/toy/seed0/heldout_sft.jsonl
    python tools/eval_heldout.py --compare runs/toy/seed0/heldout_sft.jsonl runs/toy/seed0/heldout_rl.jsonl

Greedy decoding through the checkpoint's rollout engine on FLORES devtest (never a training source);
one JSON record per sentence (vepo_mcore/eval/heldout.py). --compare prints both summaries and the
95% paired-bootstrap interval of each difference (second minus first).
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="Megatron training checkpoint to evaluate")
    p.add_argument("--directions", default="en-th,en-vi,th-en,vi-en", help="src-tgt pairs and/or groups")
    p.add_argument("--split", default="devtest", help="FLORES split (default devtest)")
    p.add_argument("--max-sentences", type=int, default=50, help="first N sentences per direction")
    p.add_argument("--sentences", metavar="START:STOP",
                   help="these sentences per direction instead (e.g. --split dev --sentences 947: scores an "
                        "RL run's validation set, as rl.eval_sentences does)")  # fmt: skip
    p.add_argument("--bitext", metavar="DIR",
                   help="score the in-domain held-out pairs DIR/<lang>/heldout.jsonl (tools/build_parallel_corpus.py) "
                        "instead of FLORES")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=96, help="response length cap")
    p.add_argument("--batch-size", type=int, default=64, help="prompts per generate call")
    p.add_argument("--out", help="records jsonl (with --checkpoint)")
    p.add_argument(
        "--hyp-dir",
        help="also write DIR/{src}-{tgt}.txt, the layout tools/evaluate.py --eval.system.hyp_dir reads",
    )
    p.add_argument("--compare", nargs=2, metavar=("BASE", "SYSTEM"), help="two records files to compare")
    args = p.parse_args(argv)

    from vepo_mcore.eval.heldout import paired_deltas, read_records, summarize, write_records

    if args.compare:
        base, system = (read_records(path) for path in args.compare)
        print(json.dumps({"base": summarize(base), "system": summarize(system),
                          "delta_ci95": paired_deltas(base, system)}, indent=1))  # fmt: skip
        return 0
    if not (args.checkpoint and args.out):
        p.error("give --checkpoint and --out, or --compare BASE SYSTEM")

    from vepo_mcore.eval.heldout import heldout_records, write_hypothesis_dir
    from vepo_mcore.eval.translate_checkpoint import load_policy_engine
    from vepo_mcore.parallel import destroy, init_distributed

    init_distributed()
    try:
        _, tokenizer, engine = load_policy_engine(args.checkpoint)
        records = heldout_records(
            engine, tokenizer, args.directions, args.max_sentences, args.max_new_tokens, args.split,
            args.batch_size, args.sentences, bitext=args.bitext,
        )  # fmt: skip
        engine.shutdown()
    finally:
        destroy()
    write_records(records, args.out)
    if args.hyp_dir:
        write_hypothesis_dir(records, args.hyp_dir)
    print(json.dumps(summarize(records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
