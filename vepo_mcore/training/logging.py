"""Rank-0 training metrics: console progress bar, tensorboard, JSONL; tokens/s, ETA and MFU.

    logger = MetricsLogger(cfg, start_iteration=0, is_writer=rank == 0)
    logger.log(iteration, {"train/loss": 2.3, "train/lr": 1e-4, ...}, tokens=4096)
    logger.close()

Metric names are namespaced (`train/loss`, `train/grad_norm`, `perf/tokens_per_s`); the JSONL
file gets one object per logged step with `step` plus every metric. Only the writer rank
(rank 0) opens files or prints; every other rank's logger is a no-op.

Metrics resume with the run: a logger starting at iteration N (a resume, or 0 for a fresh start)
first drops the JSONL records after step N (left by a run killed after its last checkpoint) and
opens tensorboard with purge_step N + 1, so each step appears once in both. The progress bar is
drawn only on a terminal; when stderr is a file (SLURM, CI) each log interval prints one line.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

from vepo_mcore.config.job import JobConfig

# Dense bf16 peak FLOP/s per GPU for MFU (H100 SXM; override through MetricsLogger(peak_flops=...)).
H100_BF16_PEAK_FLOPS = 989e12


def model_flops_per_token(cfg: JobConfig) -> float:
    """Training FLOPs per token (forward + backward = 3x forward) of the Qwen2.5-shaped decoder.

    Forward per token: 2 * (attention + MLP + output-layer matmul parameters) + causal attention
    scores 2 * 2 * s * h / 2 per layer (QK^T and PV, half of them masked).
    """
    m = cfg.model
    h, s, layers = m.hidden_size, cfg.training.seq_length, m.num_layers
    kv = m.num_query_groups * m.head_dim
    q = m.num_attention_heads * m.head_dim
    attn_params = h * q + 2 * h * kv + q * h
    mlp_params = 3 * h * m.ffn_hidden_size
    forward = 2 * layers * (attn_params + mlp_params) + 2 * h * m.vocab_size
    forward += layers * 2 * s * q  # 4 * s * q / 2 for the causal half
    return 3.0 * forward


class MetricsLogger:
    """Rank-0 console/progress bar + tensorboard + JSONL writer for per-step metrics."""

    def __init__(
        self,
        cfg: JobConfig,
        start_iteration: int = 0,
        is_writer: bool = True,
        world_size: int = 1,
        peak_flops: float | None = None,
    ) -> None:
        log = cfg.training.logging
        self.cfg = cfg
        self.is_writer = is_writer
        self.total = cfg.training.train_iters
        self.start_iteration = start_iteration
        self.world_size = world_size
        self.flops_per_token = model_flops_per_token(cfg)
        self.peak_flops = peak_flops if peak_flops is not None else _gpu_peak_flops()
        self._start_time = time.perf_counter()
        self._last_time = self._start_time
        self._tb = None
        self._jsonl = None
        self._bar = None
        if not is_writer:
            return
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
            self._jsonl = open(jsonl, "a")  # noqa: SIM115 - kept open for the whole run
        if log.progress_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, initial=start_iteration, desc="train", dynamic_ncols=True, file=sys.stderr
            )

    def log(
        self, iteration: int, metrics: dict[str, float], tokens: int | None, steps: int = 1
    ) -> dict[str, float]:
        """Record `metrics` at `iteration`; `tokens` = tokens processed (all ranks) in the last `steps`
        training steps (None for evaluation rows: no perf metrics, the step clock is not reset).

        Adds perf/tokens_per_s, perf/step_time_s, perf/eta_s (and perf/mfu on GPU); returns the row.
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
        summary = _summary(row)
        if self._bar is not None:
            self._bar.update(iteration - self._bar.n)
            self._bar.set_postfix_str(summary, refresh=True)
        else:
            print(f"step {iteration}/{self.total} | {summary}", file=sys.stderr, flush=True)
        return row

    def reset_clock(self) -> None:
        """Start the next tokens/s interval now (after a checkpoint save or an evaluation)."""
        self._last_time = time.perf_counter()

    def message(self, text: str) -> None:
        """A line on the console (rank 0), kept clear of the progress bar."""
        if not self.is_writer:
            return
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()


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


def _summary(row: dict[str, float]) -> str:
    parts = []
    for name, label, fmt in (
        ("train/loss", "loss", "{:.4f}"),
        ("valid/loss", "valid loss", "{:.4f}"),
        ("valid/overall_pass", "valid overall", "{:.1f}%"),
        ("valid/chrf", "valid chrF++", "{:.2f}"),
        ("train/lr", "lr", "{:.2e}"),
        ("train/grad_norm", "gnorm", "{:.3f}"),
        ("perf/tokens_per_s", "tok/s", "{:.0f}"),
        ("perf/mfu", "mfu", "{:.1%}"),
    ):
        if name in row and row[name] is not None and not math.isnan(row[name]):
            parts.append(f"{label} {fmt.format(row[name])}")
    if "perf/eta_s" in row:
        parts.append(f"eta {_duration(row['perf/eta_s'])}")
    return " | ".join(parts)


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
