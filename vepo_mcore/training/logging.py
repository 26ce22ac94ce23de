"""Rank-0 training metrics: one console line per log interval, tensorboard, JSONL (and Weights & Biases
when training.logging.wandb_project is set); tokens/s, TFLOP/s, ETA.

    logger = MetricsLogger(cfg, start_iteration=0, is_writer=rank == 0)
    logger.log(iteration, {"train/loss": 2.3, "train/lr": 1e-4, ...}, tokens=4096, consumed_samples=8)
    logger.close()

Each log interval prints one line on stdout, Megatron-LM's fields in Megatron-LM's order (RL adds
its reward, length, entropy, KL, clip fraction and time split), in a terminal and in a file alike:

    [2026-11-28 05:40:12] iteration 4/4 | consumed samples 16 | consumed tokens 512 | elapsed time per
    iteration (ms) 245.1 | tokens/s 522 | TFLOP/s per device 0.0 | lr 2.200E-03 | loss 11.9022 | grad
    norm 1.302 | skipped 0 | nan 0 | peak memory 1.21 GiB (RSS) | eta 00:00

TFLOP/s counts the model FLOPs of the config (model_flops_per_token; RL: rl_flops_per_token) on any
device; peak memory is torch.cuda.max_memory_allocated on a GPU, the process's peak RSS elsewhere.
Skipped and nan count the interval's steps whose optimizer step was skipped or whose loss was
not finite. Consumed tokens continue from the metrics file on a resume.

Metric names are namespaced (`train/loss`, `train/grad_norm`, `perf/tokens_per_s`); the JSONL
file gets one object per logged step with `step` plus every metric. Only the writer rank
(rank 0) opens files or prints; every other rank's logger is a no-op.

Metrics resume with the run: a logger starting at iteration N (a resume, or 0 for a fresh start)
first drops the JSONL records after step N (left by a run killed after its last checkpoint) and
opens tensorboard with purge_step N + 1, so each step appears once in both. A progress bar (loss,
tokens/s, ETA) is drawn below the lines on stderr when stderr is a terminal; it never replaces them.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from datetime import datetime
from pathlib import Path

from tqdm import tqdm

from vepo_mcore.config import to_dict
from vepo_mcore.config.job import JobConfig

# Imported where used: torch and torch.utils.tensorboard (heavy: this module is torch-free until a run logs),
# wandb (optional: not a dependency; imported only when training.logging.wandb_project is set).

# Dense bf16 peak FLOP/s per GPU for MFU (H100 SXM; override through MetricsLogger(peak_flops=...)).
H100_BF16_PEAK_FLOPS = 989e12


def model_flops_per_token(cfg: JobConfig, seq_length: int | None = None) -> float:
    """Training FLOPs per token (forward + backward = 3x forward) of the Qwen2.5-shaped decoder.

    Forward per token: 2 * (attention + MLP + output-layer matmul parameters) + causal attention
    scores 2 * 2 * s * h / 2 per layer (QK^T and PV, half of them masked); s = `seq_length`
    (default training.seq_length).
    """
    m = cfg.model
    h, s, layers = m.hidden_size, seq_length or cfg.training.seq_length, m.num_layers
    kv = m.num_query_groups * m.head_dim
    q = m.num_attention_heads * m.head_dim
    attn_params = h * q + 2 * h * kv + q * h
    mlp_params = 3 * h * m.ffn_hidden_size
    forward = 2 * layers * (attn_params + mlp_params) + 2 * h * m.vocab_size
    forward += layers * 2 * s * q  # 4 * s * q / 2 for the causal half
    return 3.0 * forward


def rl_flops_per_token(cfg: JobConfig, critic: bool = False) -> float:
    """Model FLOPs of one RL step per rolled-out token kept for training (an estimate: extra dynamic
    sampling rounds are not counted). Per token, in forward passes: generating the K candidates of
    which G are kept (K / G), the old log-probs (1), the reference (1, when a KL is optimised), and
    rl.ppo_epochs of training (3 each); a PPO critic adds its value pass and its training."""
    rl = cfg.rl
    # sequences of a prompt and its response: the response is at most max_new_tokens
    forward = model_flops_per_token(cfg, seq_length=2 * rl.rollout.sampling.max_new_tokens) / 3.0
    passes = rl.filtering.num_candidates / rl.filtering.group_size + 1 + 3 * rl.ppo_epochs
    passes += 1 if rl.kl.estimator != "none" else 0
    passes += 1 + 3 * rl.ppo_epochs if critic else 0
    return forward * passes


class MetricsLogger:
    """Rank-0 console line (and progress bar) + tensorboard + JSONL writer for per-step metrics."""

    def __init__(
        self,
        cfg: JobConfig,
        start_iteration: int = 0,
        is_writer: bool = True,
        world_size: int = 1,
        peak_flops: float | None = None,
        flops_per_token: float | None = None,
    ) -> None:
        log = cfg.training.logging
        self.cfg = cfg
        self.is_writer = is_writer
        self.total = cfg.training.train_iters
        self.start_iteration = start_iteration
        self.world_size = world_size
        self.flops_per_token = flops_per_token if flops_per_token is not None else model_flops_per_token(cfg)
        self.consumed_tokens = 0
        self.peak_flops = peak_flops if peak_flops is not None else _gpu_peak_flops()
        self._start_time = time.perf_counter()
        self._last_time = self._start_time
        self._tb = None
        self._jsonl = None
        self._bar = None
        self._wandb = None
        if not is_writer:
            return
        if log.wandb_project:
            self._wandb = _start_wandb(cfg)
        save = cfg.training.checkpoint.save
        tb_dir = log.tensorboard_dir or (str(Path(save) / "tensorboard") if save else None)
        jsonl = log.metrics_jsonl or (str(Path(save) / "metrics.jsonl") if save else None)
        if tb_dir:
            from torch.utils.tensorboard import SummaryWriter

            # Events at steps > start_iteration (from a run killed after its last save) are dropped.
            self._tb = SummaryWriter(tb_dir, purge_step=start_iteration + 1)
        if jsonl:
            Path(jsonl).parent.mkdir(parents=True, exist_ok=True)
            drop_records_after(jsonl, start_iteration)
            # A run resumed from another folder's checkpoint (a fine-tune, a new layout) has no rows
            # here yet: its count of consumed tokens starts again.
            rows = read_metrics(jsonl) if start_iteration else []
            self.consumed_tokens = int(rows[-1].get("perf/consumed_tokens", 0)) if rows else 0
            self._jsonl = open(jsonl, "a")  # noqa: SIM115 - kept open for the whole run
        if log.progress_bar and sys.stderr.isatty():
            self._bar = tqdm(
                total=self.total, initial=start_iteration, desc="train", dynamic_ncols=True, file=sys.stderr
            )

    def log(
        self,
        iteration: int,
        metrics: dict[str, float],
        tokens: int | None,
        steps: int = 1,
        consumed_samples: int | None = None,
        interval: list[dict[str, float]] | None = None,
    ) -> dict[str, float]:
        """Record `metrics` at `iteration`; `tokens` = tokens processed (all ranks) in the last `steps`
        training steps (None for evaluation rows: no perf metrics, the step clock is not reset);
        `interval`: the metrics of each of those steps (default: `metrics` alone), for the skipped and
        nan counts.

        Adds perf/tokens_per_s, perf/step_time_s, perf/eta_s, perf/tflops_per_device,
        perf/consumed_tokens (and perf/consumed_samples), perf/peak_memory_gib, train/skipped_iters,
        train/nan_iters (and perf/mfu on a known GPU); returns the row.
        """
        row = dict(metrics)
        if tokens is not None:
            now = time.perf_counter()
            elapsed = max(now - self._last_time, 1e-9)
            self._last_time = now
            row["perf/tokens_per_s"] = tokens / elapsed
            row["perf/step_time_s"] = elapsed / max(steps, 1)
            mean_step = (now - self._start_time) / max(iteration - self.start_iteration, 1)
            row["perf/eta_s"] = mean_step * max(self.total - iteration, 0)
            self.consumed_tokens += tokens
            row["perf/consumed_tokens"] = float(self.consumed_tokens)
            if consumed_samples is not None:
                row["perf/consumed_samples"] = float(consumed_samples)
            row["perf/tflops_per_device"] = (
                row["perf/tokens_per_s"] * self.flops_per_token / self.world_size / 1e12
            )
            row["perf/peak_memory_gib"] = peak_memory_bytes() / 2**30
            steps_rows = interval or [metrics]
            row["train/skipped_iters"] = float(sum(r.get("train/skipped", 0.0) > 0 for r in steps_rows))
            row["train/nan_iters"] = float(sum(not _finite_step(r) for r in steps_rows))
            if self.peak_flops:
                achieved = row["perf/tokens_per_s"] * self.flops_per_token
                row["perf/mfu"] = achieved / (self.peak_flops * self.world_size)
        if not self.is_writer:
            return row
        if self._tb is not None:
            for name, value in row.items():
                self._tb.add_scalar(name, value, iteration)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"step": iteration, **row}) + "\n")
            self._jsonl.flush()
        if self._wandb is not None:
            self._wandb.log(row, step=iteration)
        if self._bar is not None:
            self._bar.update(iteration - self._bar.n)
            self._bar.set_postfix_str(_summary(row), refresh=False)
        # The line prints whatever the bar does (a terminal of width 0 draws no bar at all).
        self.message(format_line(iteration, self.total, row))
        return row

    def reset_clock(self) -> None:
        """Start the next tokens/s interval now (after a checkpoint save or an evaluation)."""
        self._last_time = time.perf_counter()

    def message(self, text: str) -> None:
        """A line on stdout (rank 0), kept clear of the progress bar (drawn on stderr)."""
        if not self.is_writer:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stdout)
        else:
            print(text, file=sys.stdout)
        sys.stdout.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()


def _start_wandb(cfg: JobConfig):
    """A W&B run for training.logging.wandb_project (wandb is optional: imported only here)."""
    log, save = cfg.training.logging, cfg.training.checkpoint.save
    try:
        import wandb
    except ImportError:
        raise ValueError(
            f"training.logging.wandb_project {log.wandb_project!r} needs the wandb package (pip install wandb)"
        ) from None
    run_id = None
    if save:  # a relaunch continues the same W&B run
        id_file = Path(save) / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else wandb.util.generate_id()
        id_file.write_text(run_id)
    return wandb.init(
        project=log.wandb_project, name=log.wandb_run_name, mode=log.wandb_mode, dir=save,
        config=to_dict(cfg), id=run_id, resume="allow" if run_id else None,
    )  # fmt: skip


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a JSONL metrics file, one per step in step order: the records of one step (a train
    row and an evaluation row, or a step a relaunch logged again) merged, later keys winning. A
    missing file gives []; a torn last line (the writer still running, or killed mid-write) is skipped.
    """
    path = Path(path)
    if not path.is_file():
        return []
    lines = [
        (n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()
    ]
    rows: dict[int, dict] = {}
    for n, line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            if n == lines[-1][0]:
                break
            raise ValueError(f"{path}: line {n} is not JSON") from None
        rows.setdefault(record["step"], {}).update(record)
    return [rows[step] for step in sorted(rows)]


def drop_records_after(path: str | Path, step: int) -> int:
    """Rewrite the JSONL metrics file `path` without its records after `step` (atomically); returns how
    many were dropped. A torn last line (the writer killed mid-write) goes too."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if record.get("step", 0) > step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, path)
    return dropped


LINE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("perf/consumed_samples", "consumed samples", "{:,.0f}"),
    ("perf/consumed_tokens", "consumed tokens", "{:,.0f}"),
    ("perf/step_time_ms", "elapsed time per iteration (ms)", "{:.1f}"),
    ("perf/tokens_per_s", "tokens/s", "{:,.0f}"),
    ("perf/tflops_per_device", "TFLOP/s per device", "{:.3g}"),
    ("perf/mfu", "MFU", "{:.1%}"),
    ("train/lr", "lr", "{:.3E}"),
    ("train/loss", "loss", "{:.4f}"),
    ("valid/loss", "validation loss", "{:.4f}"),
    ("valid/overall_pass", "validation overall pass", "{:.1f}%"),
    ("valid/chrf", "validation chrF++", "{:.2f}"),
    ("train/grad_norm", "grad norm", "{:.3f}"),
    ("train/skipped_iters", "skipped", "{:.0f}"),
    ("train/nan_iters", "nan", "{:.0f}"),
    ("perf/peak_memory_gib", "peak memory", "{:.2f} GiB"),
    ("reward/total", "reward", "{:.3f}"),
    ("rollout/len_mean", "response length", "{:.1f}"),
    ("rollout/entropy", "entropy", "{:.3f}"),
    ("rl/kl_k3", "kl", "{:.2e}"),
    ("rl/clip_frac", "clip frac", "{:.3f}"),
)
"""(metric, label, format) of the console line, in order; a metric the row lacks is left out."""

RL_TIME_SPLIT = ("perf/rollout_s", "perf/sync_s", "perf/experience_s", "perf/train_s")
"""An RL step's time split, printed as 'time rollout/sync/logprobs/train (s) 3.1/0.0/0.4/0.9'."""


def format_line(iteration: int, total: int, row: dict[str, float]) -> str:
    """The console line of one logged row: '[timestamp] iteration N/total | label value | ...'."""
    values = dict(row)
    if "perf/step_time_s" in values:
        values["perf/step_time_ms"] = 1000 * values["perf/step_time_s"]
    parts = [f"[{datetime.now():%Y-%m-%d %H:%M:%S}] iteration {iteration}/{total}"]
    for name, label, fmt in LINE_FIELDS:
        value = values.get(name)
        if value is None:
            continue
        text = fmt.format(value)
        if name == "perf/peak_memory_gib":
            text += " (GPU)" if _on_cuda() else " (RSS)"
        if name == "reward/total":
            terms = [
                f"{key[len('reward/'):]} {v:.3f}" for key, v in values.items()
                if key.startswith("reward/") and key != "reward/total" and not key.endswith("_raw")
            ]  # fmt: skip
            text += f" ({' '.join(terms)})" if terms else ""
        parts.append(f"{label} {text}")
    if all(name in values for name in RL_TIME_SPLIT):
        split = "/".join(f"{values[name]:.1f}" for name in RL_TIME_SPLIT)
        parts.append(f"time rollout/sync/logprobs/train (s) {split}")
    if "perf/eta_s" in values:
        parts.append(f"eta {_duration(values['perf/eta_s'])}")
    return " | ".join(parts)


def _summary(row: dict[str, float]) -> str:
    """The progress bar's short postfix: loss, tokens/s, ETA."""
    parts = []
    for name, label, fmt in (("train/loss", "loss", "{:.4f}"), ("perf/tokens_per_s", "tok/s", "{:.0f}")):
        if name in row and row[name] is not None and not math.isnan(row[name]):
            parts.append(f"{label} {fmt.format(row[name])}")
    if "perf/eta_s" in row:
        parts.append(f"eta {_duration(row['perf/eta_s'])}")
    return " | ".join(parts)


def _finite_step(row: dict[str, float]) -> bool:
    """Whether a step's loss is finite, as Megatron-LM counts nan iterations (the grad norm is NaN
    whenever clipping is off, training.optimizer.clip_grad 0)."""
    return math.isfinite(row.get("train/loss", 0.0))


def _on_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def peak_memory_bytes() -> int:
    """This process's peak memory: torch.cuda.max_memory_allocated on a GPU, the peak RSS elsewhere."""
    if _on_cuda():
        import torch

        return torch.cuda.max_memory_allocated()

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def _gpu_peak_flops() -> float | None:
    """Peak dense bf16 FLOP/s of this GPU for MFU; None on CPU (no MFU there)."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    if "H100" in name or "H200" in name or "H800" in name:
        return H100_BF16_PEAK_FLOPS
    if "A100" in name or "A800" in name:
        return 312e12
    return None
