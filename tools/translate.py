"""Translate FLORES-200 with a Megatron checkpoint (the embedded engine on CPU), one file per direction.

    python tools/translate.py --checkpoint runs/quickstart/rl --out runs/quickstart/hyp_rl \
        --directions en-th,th-en --max-sentences 50
    python tools/evaluate.py --hyp-dir runs/quickstart/hyp_rl --directions en-th,th-en --max-sentences 50

Any other --section.field flag overrides the checkpoint's saved config (e.g. --parallel.tensor_model_parallel_size 2
under torchrun). Interrupted runs resume from the per-direction cache in --out.
"""

import argparse

from vepo_mcore.eval.generate import translate_checkpoint
from vepo_mcore.parallel import init_distributed


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="training save dir or iteration dir")
    p.add_argument("--out", required=True, help="hypothesis directory ({src}-{tgt}.txt)")
    p.add_argument("--directions", default="all", help="src-tgt list or groups x2e,e2x,x2x,all")
    p.add_argument("--split", default="devtest", choices=["dev", "devtest"])
    p.add_argument("--max-sentences", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    args, overrides = p.parse_known_args(argv)
    init_distributed()
    translate_checkpoint(
        args.checkpoint, args.out, args.directions, args.split, args.max_sentences, args.max_new_tokens,
        args.batch_size, args.temperature, overrides,
    )  # fmt: skip


if __name__ == "__main__":
    main()
