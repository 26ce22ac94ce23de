"""Translate FLORES with a trained checkpoint through a rollout engine, writing hypothesis files
that `tools/evaluate.py` scores (`--eval.system.checkpoint` runs this first).

    translate_checkpoint("runs/toy/seed0/sft", "runs/toy/seed0/hyp_sft", directions="en-th,th-en")

The checkpoint's own config.yaml (written beside every training checkpoint) gives the model
shape; its `tokenizer/` copy (or tokenizer.path) the tokenizer. Decoding is greedy by default.
Runs inside a process group (init_distributed), on any TP/PP the model config asks for.
"""

from __future__ import annotations

from pathlib import Path

from vepo_mcore.eval.systems import translate_direction
from vepo_mcore.languages import load_flores
from vepo_mcore.models.builder import build_model
from vepo_mcore.parallel import init_model_parallel
from vepo_mcore.rollout.base import SamplingParams, build_engine
from vepo_mcore.rollout.weight_sync import sync_weights
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.checkpointing import checkpoint_config, load_checkpoint
from vepo_mcore.translation.directions import parse_directions


def load_policy_engine(checkpoint: str | Path, overrides: list[str] | None = None):
    """(config, tokenizer, rollout engine serving the checkpoint's weights), inside a process group.

    The checkpoint's own config picks the model shape, tokenizer and engine (embedded or SGLang).
    """

    cfg, path = checkpoint_config(checkpoint, overrides)
    # Megatron cannot decode with sequence parallelism (one new token per step); it only splits
    # activations, so the same weights load and compute the same logits without it.
    cfg.parallel.sequence_parallel = False
    init_model_parallel(cfg.parallel, seed=cfg.training.seed)
    model = build_model(cfg)
    load_checkpoint(path, model, finetune=True)
    model.eval()
    tokenizer = load_tokenizer(cfg.tokenizer.path)
    engine = build_engine(cfg, model=model, tokenizer=tokenizer)
    if not engine.shares_training_weights:
        # An SGLang engine starts from dummy weights (a config-only directory): push the checkpoint's.

        engine.wake()  # a colocated engine starts released: resume its weights before the sync
        sync_weights(engine, model, cfg)
    return cfg, tokenizer, engine


def translate_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    directions: str = "all",
    split: str = "devtest",
    max_sentences: int | None = None,
    max_new_tokens: int = 128,
    batch_size: int = 32,
    temperature: float = 0.0,
    overrides: list[str] | None = None,
) -> Path:
    """Write out_dir/{src}-{tgt}.txt for each direction (cached: a rerun resumes). Returns out_dir."""

    _, tokenizer, engine = load_policy_engine(checkpoint, overrides)
    sampling = SamplingParams(
        temperature=temperature, max_new_tokens=max_new_tokens, stop_token_ids=tokenizer.stop_ids
    )
    out_dir = Path(out_dir)
    for direction in parse_directions(directions):
        sources = load_flores(direction.src, split)[:max_sentences]
        references = load_flores(direction.tgt, split)[:max_sentences]
        translate_direction(
            engine, direction, sources, tokenizer=tokenizer, sampling=sampling, references=references,
            batch_size=batch_size, cache_dir=out_dir,
        )  # fmt: skip
    engine.shutdown()
    return out_dir
