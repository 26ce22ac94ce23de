"""What a launch reads, checked by the training entry scripts' --dry-run before any GPU is asked for.

    problems = launch_problems(cfg, "rl")      # ['training.checkpoint.load runs/sft_7b holds no checkpoint', ...]
    report_launch_problems(cfg, "rl", strict=args.check_paths)

Inputs: the tokenizer directory, training.checkpoint.load, the data (CPT indexed prefixes, SFT
.jsonl files or tools/preprocess_sft.py prefixes), the RM's rm.init_from and an RL run's reward
model. A model.vocab_size that differs from the tokenizer's length is always an error (the config
is wrong wherever it runs; a vocabulary already padded is named as such). Missing inputs are
warnings unless `strict` (--check-paths): a guide dry-runs every step of a chain on a laptop,
before the steps that write those inputs have run; --check-paths on the cluster, right before
the launch, makes them an error.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.sft import is_jsonl
from vepo_mcore.data.sft_indexed import sft_files
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.checkpointing import LATEST_FILE

KINDS = ("pretrain", "rl", "rm")
"""Entry scripts: tools/pretrain_cpt.py (CPT and SFT), tools/train_vepo.py, tools/train_rm.py."""


def launch_problems(cfg: JobConfig, kind: str) -> tuple[list[str], str | None]:
    """(the missing inputs of a `kind` launch, the vocabulary mismatch or None), each one sentence
    naming the config field."""
    if kind not in KINDS:
        raise ValueError(f"unknown launch kind {kind!r}; known: {list(KINDS)}")
    missing = []
    tokenizer = cfg.tokenizer.path  # None: the shipped Qwen2.5 tokenizer
    tokenizer_found = tokenizer is None or (Path(tokenizer) / "tokenizer.json").is_file()
    if not tokenizer_found:
        missing.append(f"tokenizer.path {tokenizer} has no tokenizer.json")
    checkpoints = {"training.checkpoint.load": cfg.training.checkpoint.load}
    if kind == "rm":
        checkpoints["rm.init_from"] = cfg.rm.init_from
    if kind == "rl" and cfg.rl.rewards.mt == "rm":
        checkpoints["rl.rewards.rm_checkpoint"] = cfg.rl.rewards.rm_checkpoint
    for name, path in checkpoints.items():
        if path and not _holds_checkpoint(Path(path)):
            missing.append(f"{name} {path} holds no checkpoint")
    if kind == "pretrain":
        missing += _data_problems(cfg)
    return missing, vocab_problem(cfg) if tokenizer_found else None


def vocab_problem(cfg: JobConfig) -> str | None:
    """Why model.vocab_size does not fit the tokenizer at tokenizer.path (its length), or None.

    model.vocab_size is the tokenizer's real ids; the embedding pads itself to a multiple of
    make_vocab_size_divisible_by x TP (models/vocab.py), so the padded size is a mistake too."""
    tokenizer = load_tokenizer(cfg.tokenizer.path)
    ids, size, model = len(tokenizer), cfg.model.vocab_size, cfg.model
    if size == ids:
        return None
    where = f"the tokenizer at {tokenizer.path} ({ids:,} ids)"
    multiple = model.make_vocab_size_divisible_by * cfg.parallel.tensor_model_parallel_size
    if size == padded_vocab_size(
        ids, model.make_vocab_size_divisible_by, cfg.parallel.tensor_model_parallel_size
    ):
        return (
            f"model.vocab_size ({size:,}) is {where} padded to a multiple of {multiple}: set model.vocab_size "
            f"to {ids}, the model pads its embedding itself (model.make_vocab_size_divisible_by x TP)"
        )
    hint = " (after tools/resize_embeddings.py for an expanded tokenizer)" if size < ids else ""
    return f"model.vocab_size ({size:,}) does not match {where}: set model.vocab_size to {ids}{hint}"


def report_launch_problems(cfg: JobConfig, kind: str, strict: bool = False) -> list[str]:
    """Print each missing input as a `warning:` line on stderr and return them; a ValueError (one
    line, every problem) for a vocabulary mismatch, or for missing inputs when `strict`."""
    missing, vocab = launch_problems(cfg, kind)
    errors = ([vocab] if vocab else []) + (missing if strict else [])
    if errors:
        raise ValueError("; ".join(errors))
    for problem in missing:
        print(f"warning: {problem} (--check-paths makes this an error)", file=sys.stderr)
    return missing


def _holds_checkpoint(path: Path) -> bool:
    """A save folder with a checkpoint (or its pointer file), or an iteration folder itself."""
    if (path / "metadata.json").is_file() or (path / LATEST_FILE).is_file():
        return True
    return path.is_dir() and any(p.name.startswith("iter_") for p in path.iterdir())


def _data_problems(cfg: JobConfig) -> list[str]:
    data, problems = cfg.data, []
    if data.mode == "cpt":
        for lang, prefix in data.paths.items():
            absent = [prefix + s for s in (".bin", ".idx") if not os.path.isfile(prefix + s)]
            if absent:
                problems.append(f"data.paths.{lang} {prefix}: no {' or '.join(absent)}")
        return problems
    for i, phase in enumerate(data.sft_phases):
        for source, path in phase.paths.items():
            if is_jsonl(path):
                absent = [] if os.path.isfile(path) else [path]
            else:
                ids, spans, meta = sft_files(path)
                absent = [p for p in (meta, *(q + s for q in (ids, spans) for s in (".bin", ".idx")))
                          if not os.path.isfile(p)]  # fmt: skip
            if absent:
                problems.append(f"data.sft_phases[{i}].paths.{source} {path}: no {absent[0]}")
    return problems
