"""Train the translation reward model on corrupted-FLORES pairs and evaluate it on devtest.

    python tools/train_rm.py --config configs/rm.yaml --init-from ckpt/policy \
        --train-lines 997 --test-lines 200 --report-dir reports/rm [--model.num_layers 2 ...]
    torchrun --nproc-per-node 8 tools/train_rm.py --config ... --parallel.tensor_model_parallel_size 2

Training pairs come from FLORES dev, the held-out test from devtest, both over all ten target
languages and categories unless narrowed. Batch sizes in the config count pairs. Writes
<report-dir>/eval.md (tables) and eval.json, and the checkpoint to training.checkpoint.save.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None):
    from vepo_mcore.languages import LANGS
    from vepo_mcore.rl.rewards.corruptions import CATEGORIES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="JobConfig YAML (model, parallel, training sections)")
    parser.add_argument(
        "--init-from", help="policy checkpoint to initialise the trunk from (head stays fresh)"
    )
    parser.add_argument("--langs", default=",".join(LANGS), help="target languages, comma-separated")
    parser.add_argument(
        "--categories", default=",".join(CATEGORIES), help="error categories, comma-separated"
    )
    parser.add_argument(
        "--train-lines", type=int, default=997, help="FLORES dev lines used for training pairs"
    )
    parser.add_argument("--test-lines", type=int, default=100, help="FLORES devtest lines for held-out pairs")
    parser.add_argument(
        "--bce-weight", type=float, default=1.0, help="weight of the multi-label category loss"
    )
    parser.add_argument("--seed", type=int, default=0, help="corruption / direction seed")
    parser.add_argument("--report-dir", default="reports/rm", help="where eval.md and eval.json go")
    args, overrides = parser.parse_known_args(argv)
    return args, overrides


def _names(value: str, known, what: str) -> tuple[str, ...]:
    names = tuple(v for v in value.split(",") if v)
    unknown = [v for v in names if v not in known]
    if unknown or not names:
        raise ValueError(f"--{what}: unknown {unknown or 'empty list'}; known: {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> dict:
    import torch.distributed as dist

    from vepo_mcore.config import JobConfig
    from vepo_mcore.config.base import load_config
    from vepo_mcore.languages import LANGS, default_tokenizer_dir
    from vepo_mcore.parallel import init_distributed
    from vepo_mcore.rl.rewards.corruptions import CATEGORIES
    from vepo_mcore.rm.data import build_pairs
    from vepo_mcore.rm.evaluate import evaluate_pairs, markdown_report
    from vepo_mcore.rm.train import train_rm
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.training.optimizer import unwrap

    args, overrides = parse_args(argv)
    cfg = load_config(JobConfig, args.config, overrides)
    langs = _names(args.langs, LANGS, "langs")
    categories = _names(args.categories, CATEGORIES, "categories")
    tokenizer_dir = cfg.tokenizer.path or str(default_tokenizer_dir())
    tokenizer = load_tokenizer(tokenizer_dir)
    if cfg.model.vocab_size < len(tokenizer):
        cfg.model.vocab_size = len(tokenizer)
    rank, _ = init_distributed(cfg.parallel.backend, timeout_minutes=cfg.parallel.distributed_timeout_minutes)

    train = build_pairs("dev", langs, range(args.train_lines), categories, args.seed, tokenizer)
    test = build_pairs("devtest", langs, range(args.test_lines), categories, args.seed + 1, tokenizer)

    def log(step, metrics):
        if rank == 0 and (step % cfg.training.logging.log_interval == 0 or step == cfg.training.train_iters):
            shown = " ".join(
                f"{k}={metrics[k]:.4f}" for k in ("loss", "bt_loss", "bce_loss", "pair_acc") if k in metrics
            )
            print(f"step {step}/{cfg.training.train_iters} {shown}", flush=True)

    history, model = train_rm(
        cfg, train, tokenizer, bce_weight=args.bce_weight, init_from=args.init_from,
        tokenizer_dir=tokenizer_dir, on_step=log,
    )  # fmt: skip
    inner = unwrap(model)
    inner.eval()
    result = evaluate_pairs(
        inner, tokenizer, test, cfg.training.seq_length, batch_size=2 * cfg.training.micro_batch_size
    )
    summary = {"train_pairs": len(train), "final_train": history[-1] if history else {}, **asdict(result)}
    if rank == 0:
        out = Path(args.report_dir)
        out.mkdir(parents=True, exist_ok=True)
        title = f"Reward model on FLORES devtest pairs ({len(train)} dev training pairs, {cfg.training.train_iters} steps)"
        (out / "eval.md").write_text(markdown_report(result, title))
        (out / "eval.json").write_text(json.dumps(summary, indent=1))
        print(markdown_report(result, title))
    if dist.is_initialized():
        dist.barrier()
    return summary


if __name__ == "__main__":
    main()
