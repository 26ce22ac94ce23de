"""One writer per save folder: the run training into training.checkpoint.save holds <save>/writer.lock.

    with save_folder_lock(cfg.training.checkpoint):   # collective; rank 0 holds the file
        ...  # resume, train, save

Two runs on one folder would interleave their metrics and resume from each other's checkpoints,
so a second launch refuses with a ValueError naming the holder (host, pid, start time, command).
The lock is created whole in one step (a hard link of a written file), and the holder refreshes
its time stamp every REFRESH_S seconds from a daemon thread. A lock is stale, and taken over with
a warning, when its process is gone (same host: the pid no longer runs, or runs a younger process)
or, written on another host, when it was not refreshed for `lock_stale_minutes`. kill -9 leaves
the file behind; the relaunch takes it over.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vepo_mcore.config.training import CheckpointConfig

# Imported where used: psutil (handled as optional: without it a lock's holder is judged by its pid alone).

LOCK_FILE = "writer.lock"
REFRESH_S = 30.0
"""How often the holder refreshes the lock's time stamp (what a host without the pid judges by)."""


def _this_process() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "command": " ".join(sys.argv)[:300],
    }


def describe(holder: dict[str, Any]) -> str:
    started = datetime.fromtimestamp(holder.get("started", 0)).isoformat(sep=" ", timespec="seconds")
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')} since {started} ({holder.get('command', '')})"
    )


class WriterLock:
    """A held lock file; release() removes it (if it is still ours) and stops the refresh thread."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        self.path, self.holder = path, holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh, name="writer-lock", daemon=True)
        self._thread.start()

    def _refresh(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        self._stop.set()
        if _read(self.path) == self.holder:
            self.path.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _create(path: Path, holder: dict[str, Any]) -> bool:
    """Create `path` holding `holder`, whole, unless it exists (hard link: atomic, fails on an existing name)."""
    draft = path.with_name(f"{LOCK_FILE}.{holder['pid']}.draft")
    draft.write_text(json.dumps(holder))
    try:
        os.link(draft, path)
        return True
    except FileExistsError:
        return False
    finally:
        draft.unlink(missing_ok=True)


def stale_reason(holder: dict[str, Any] | None, age_s: float, stale_minutes: float) -> str | None:
    """Why a lock with `holder`, last refreshed `age_s` ago, no longer holds (None: it holds)."""
    if holder is None:
        return "the lock file is unreadable" if age_s > REFRESH_S else None
    if holder.get("host") == socket.gethostname():
        pid = int(holder.get("pid", -1))
        if pid == os.getpid():
            return "it was left by this process"
        if not _pid_runs(pid):
            return f"process {pid} is no longer running"
        if _process_started(pid) > holder.get("started", 0) + 1:  # the pid was reused
            return f"process {pid} is a newer process than the one that took the lock"
        return None
    if age_s > stale_minutes * 60:
        return f"it was last refreshed {age_s / 60:.0f} minutes ago (training.checkpoint.lock_stale_minutes={stale_minutes})"
    return None


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_started(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # no psutil, or the process just ended: judge by the pid alone
        return 0.0


def acquire(save_dir: str | Path, stale_minutes: float, warn: Callable[[str], None]) -> WriterLock:
    """Take <save_dir>/writer.lock for this process; ValueError naming the holder when it is held."""
    path = Path(save_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    me = _this_process()
    for _ in range(5):
        if _create(path, me):
            return WriterLock(path, me)
        holder = _read(path)
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            continue  # released meanwhile
        why = stale_reason(holder, age, stale_minutes)
        if why is None:
            if holder is None:  # being written this instant by another launch
                time.sleep(0.5)
                continue
            raise ValueError(
                f"{path.parent} is being written by another run: {describe(holder)}. Wait for it to end, "
                f"or set training.checkpoint.save to another folder (if that run is gone, delete {path})"
            )
        aside = path.with_name(f"{LOCK_FILE}.stale.{me['pid']}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            continue
        if _read(aside) != holder:  # another launch replaced the stale lock first: it is theirs
            os.replace(aside, path)
            continue
        aside.unlink(missing_ok=True)
        if holder is not None and why != "it was left by this process":
            warn(f"WARNING: taking over the stale lock {path} of {describe(holder)}: {why}")
    raise ValueError(f"could not take {path}: other launches keep taking it; start one run per save folder")


@contextmanager
def save_folder_lock(ckpt: CheckpointConfig) -> Iterator[None]:
    """Collective: rank 0 holds ckpt.save's lock for the block; every rank raises the same ValueError
    when another run holds it. No-op without ckpt.save."""
    if not ckpt.save:
        yield
        return
    rank = dist.get_rank() if dist.is_initialized() else 0
    lock, error = None, None
    if rank == 0:
        try:
            lock = acquire(ckpt.save, ckpt.lock_stale_minutes, lambda text: print(text, file=sys.stderr))
        except ValueError as exc:
            error = str(exc)
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [error]
        dist.broadcast_object_list(box, src=0)
        error = box[0]
    if error is not None:
        raise ValueError(error)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()
