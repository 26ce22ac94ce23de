"""One loop for every training job. CPT, SFT and the reward model (training/trainer.py's LMTrainer) and
RL (rl/trainer.py's RLTrainer) each plug in a step; the loop owns everything around the steps.

    history = run_training(cfg.training.checkpoint, lambda: LMTrainer(cfg, ...))

What the loop does, for every trainer alike:
- checks that the output folders (save, tensorboard, metrics file) can be written;
- takes the save folder's writer lock before the trainer is built (building resumes from it), and
  warns on stderr when there is no save folder;
- prints what runs and where it resumed;
- steps to training.train_iters, logging a metrics row every `trainer.log_interval` steps (tokens/s
  over the steps since the last row, the ETA) and printing it as one line (training/logging.py);
- evaluates every training.eval_interval steps when the trainer has something to evaluate;
- saves every training.checkpoint.save_interval steps and at the end (not twice for one step), with a
  "saved checkpoint iter_N" line giving its size and the time it took; with
  training.checkpoint.async_save, finalises a background save after the step that sees it written,
  and at the end (after an exception too, when every rank raised);
- tears down in a finally, whatever raised: the metrics writers, then the trainer's own resources
  (the RL trainer's rollout engine).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch.distributed as dist

from vepo_mcore.config.cli import check_output_folder
from vepo_mcore.config.job import JobConfig
from vepo_mcore.config.training import CheckpointConfig, LoggingConfig
from vepo_mcore.training.checkpointing import close_async_saves, finalize_async_saves, iteration_dir
from vepo_mcore.training.logging import MetricsLogger
from vepo_mcore.training.writer_lock import save_folder_lock


class Trainer(Protocol):
    """What a job plugs into run_training."""

    cfg: JobConfig
    iteration: int
    """Optimizer steps (RL: RL steps) done so far, resumed ones included."""
    resumed_from: str | None
    """The checkpoint the run continued from, or None for a fresh start."""
    log_interval: int
    """Steps per logged metrics row."""
    consumed_samples: int
    """Training samples (RL: responses) consumed so far, resumed ones included."""
    flops_per_token: float | None
    """Model FLOPs per token of `step`'s tokens (None: the training FLOPs of the config's model)."""

    def describe(self) -> str:
        """The run's first line: what trains, on what, from which step to which."""

    def step(self) -> tuple[dict[str, float], int]:
        """One step: (its metrics, the tokens it processed on all ranks)."""

    def evaluate(self) -> dict[str, float] | None:
        """Validation metrics at an eval_interval step; None when the job has none."""

    def save(self) -> None:
        """A checkpoint of the current iteration."""

    def finish(self, history: list[dict[str, float]]) -> None:
        """After the last step of a run that did not raise (e.g. RL's curve plot)."""

    def close(self) -> None:
        """Release what the trainer holds outside the process (engines); runs even after an error."""


def run_training(
    checkpoint: CheckpointConfig, build: Callable[[], Trainer], logging: LoggingConfig | None = None
) -> list[dict[str, float]]:
    """Build the trainer under the save folder's lock and run it; returns the metrics of the steps
    this call ran (on every rank), one {"step": n, ...} row per step. The output folders of
    `checkpoint` and `logging` are checked first (ValueErrors naming the field)."""

    check_output_folders(checkpoint, logging or LoggingConfig())
    with save_folder_lock(checkpoint):  # one run writes a save folder at a time
        trainer = build()
        if not checkpoint.save and dist.get_rank() == 0:  # after build: a config error is the only line
            print(
                "warning: training.checkpoint.save is not set: this run saves no checkpoint "
                "(set --training.checkpoint.save DIR to keep the trained model)",
                file=sys.stderr, flush=True,
            )  # fmt: skip
        try:
            history = _loop(trainer)
            close_async_saves()  # the last checkpoint is whole (and `latest`) before the run returns
            return history
        except BaseException:
            close_async_saves(after_error=True)
            raise
        finally:
            trainer.close()


def _loop(trainer: Trainer) -> list[dict[str, float]]:

    cfg = trainer.cfg
    t, ckpt = cfg.training, cfg.training.checkpoint
    logger = MetricsLogger(
        cfg, trainer.iteration, is_writer=dist.get_rank() == 0, world_size=dist.get_world_size(),
        flops_per_token=getattr(trainer, "flops_per_token", None),
    )  # fmt: skip
    try:
        logger.message(trainer.describe())
        if trainer.resumed_from:
            logger.message(f"resumed from {trainer.resumed_from} at step {trainer.iteration}")
        history: list[dict[str, float]] = []
        last_saved = trainer.iteration if trainer.resumed_from else None
        last_logged, tokens = trainer.iteration, 0
        while trainer.iteration < t.train_iters:
            metrics, step_tokens = trainer.step()
            finalize_async_saves(blocking=False)  # a checkpoint written in the background becomes `latest`
            it, tokens = trainer.iteration, tokens + step_tokens
            history.append({"step": it, **metrics})
            if it % trainer.log_interval == 0 or it == t.train_iters:
                logger.log(it, metrics, tokens=tokens, steps=it - last_logged,
                           consumed_samples=getattr(trainer, "consumed_samples", None),
                           interval=history[-(it - last_logged):])  # fmt: skip
                last_logged, tokens = it, 0
            if t.eval_interval and it % t.eval_interval == 0 and (valid := trainer.evaluate()) is not None:
                row = {f"valid/{k}": v for k, v in valid.items()}
                history[-1].update(row)
                logger.log(it, row, tokens=None)
                logger.reset_clock()
            if ckpt.save and ckpt.save_interval and it % ckpt.save_interval == 0:
                _save(trainer, logger)
                last_saved = it
                logger.reset_clock()  # tokens/s measures training, not checkpoint writes
        if ckpt.save and last_saved != trainer.iteration:
            _save(trainer, logger)
        trainer.finish(history)
        return history
    finally:
        logger.close()


def _save(trainer: Trainer, logger) -> None:
    """trainer.save() and its line: 'saved checkpoint iter_0000020 to DIR (1.2 GiB) in 3.4 s' (a
    background save: how long the state took to stage)."""

    ckpt = trainer.cfg.training.checkpoint
    start = time.perf_counter()
    trainer.save()
    seconds = time.perf_counter() - start
    path = iteration_dir(ckpt.save, trainer.iteration)
    if ckpt.async_save:
        logger.message(
            f"saving checkpoint {path.name} to {ckpt.save} in the background (staged in {seconds:.2f} s)"
        )
    elif logger.is_writer:
        logger.message(f"saved checkpoint {path.name} to {ckpt.save} ({_size(path)}) in {seconds:.2f} s")


def _size(path: Path) -> str:
    """A folder's total file size, e.g. '12.3 MiB'."""
    total = float(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()))
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    unit = 0
    while total >= 1024 and unit < len(units) - 1:
        total, unit = total / 1024, unit + 1
    return f"{total:.1f} {units[unit]}"


def check_output_folders(checkpoint: CheckpointConfig, logging: LoggingConfig) -> None:
    """Before any work: every output folder of the run can be created and written (a ValueError naming
    the field otherwise)."""

    check_output_folder("training.checkpoint.save", checkpoint.save)
    check_output_folder("training.logging.tensorboard_dir", logging.tensorboard_dir)
    if logging.metrics_jsonl:
        check_output_folder("training.logging.metrics_jsonl", str(Path(logging.metrics_jsonl).parent))


def check_vocab(vocab_size: int, n_ids: int, tokenizer: str) -> None:
    """The model must have a row for every id of the tokenizer it trains on (n_ids, from `tokenizer`)."""
    if n_ids > vocab_size:
        raise ValueError(
            f"model.vocab_size ({vocab_size}) is smaller than the tokenizer at {tokenizer} ({n_ids} ids): "
            f"set model.vocab_size to {n_ids} (after tools/resize_embeddings.py for an expanded tokenizer)"
        )
