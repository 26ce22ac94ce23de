"""Continued pre-training (data.mode=cpt) or SFT (data.mode=sft) of a Qwen2.5-architecture model.

    python tools/build_cpt_corpus.py --output-dir data/cpt_tiny
    torchrun --nproc-per-node 2 tools/pretrain_cpt.py --config examples/configs/cpt_tiny.yaml
    torchrun --nproc-per-node 2 tools/pretrain_cpt.py --config examples/configs/sft_tiny.yaml \
        --training.checkpoint.load ckpt/cpt_tiny --training.checkpoint.finetune true

Every field of the config tree can be overridden with a dotted flag (--training.train_iters 100).
Resumes from training.checkpoint.save when it holds a checkpoint.
"""

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

from vepo_mcore.config import JobConfig, load_config  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML config (see examples/configs/)")
    args, overrides = parser.parse_known_args(argv)
    cfg = load_config(JobConfig, args.config, overrides)

    from vepo_mcore.parallel import destroy, init_distributed
    from vepo_mcore.training.loop import pretrain

    init_distributed(cfg.parallel.backend, timeout_minutes=cfg.parallel.distributed_timeout_minutes)
    try:
        pretrain(cfg)
    finally:
        destroy()


if __name__ == "__main__":
    main()
