"""One writer per save folder: a live holder (a real second process) makes a launch refuse with
its host and pid; a lock left by a dead process, or an old one from another host, is taken over
with a warning; release removes only our own lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from vepo_mcore.training.writer_lock import LOCK_FILE, acquire, stale_reason

HOLD = """
import sys, time
from vepo_mcore.training.writer_lock import acquire
lock = acquire(sys.argv[1], 10.0, print)
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"being written by another run: pid {holder.pid} on host "):
            acquire(tmp_path, 10.0, print)
    finally:
        holder.kill()
        holder.wait()
    # kill -9 left the lock behind: the next launch takes it over and says whose it was.
    warnings: list[str] = []
    lock = acquire(tmp_path, 10.0, warnings.append)
    assert len(warnings) == 1 and f"process {holder.pid} is no longer running" in warnings[0]
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


LAUNCH = """
import sys
from vepo_mcore.config import JobConfig
from vepo_mcore.rl.trainer import train_rl
from vepo_mcore.training.trainer import pretrain

cfg = JobConfig()
cfg.training.checkpoint.save = sys.argv[1]
try:
    (pretrain if sys.argv[2] == "pretrain" else train_rl)(cfg)
except ValueError as exc:
    print("refused" if "another run" in str(exc) else exc, "megatron" in sys.modules)
"""


@pytest.mark.parametrize("entry", ["pretrain", "train_rl"])
def test_a_second_launch_is_refused_before_megatron_loads(tmp_path, entry):
    """The trainers take the save folder's lock before they build anything: a second launch on a
    busy folder fails in seconds, without megatron's import and its notices."""
    lock = acquire(tmp_path, 10.0, print)
    try:
        out = subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path), entry], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    finally:
        lock.release()
    assert out.stdout.split() == ["refused", "False"], out.stdout + out.stderr


def test_locks_from_other_hosts_go_stale_by_age(tmp_path):
    other = {"host": "node-elsewhere", "pid": 1, "started": time.time() - 3600, "command": "train"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(other))
    with pytest.raises(ValueError, match="pid 1 on host node-elsewhere"):
        acquire(tmp_path, 10.0, print)
    old = time.time() - 11 * 60
    os.utime(tmp_path / LOCK_FILE, (old, old))
    warnings: list[str] = []
    acquire(tmp_path, 10.0, warnings.append).release()
    assert "last refreshed 11 minutes ago" in warnings[0] and "lock_stale_minutes=10.0" in warnings[0]


def test_stale_reasons():
    here = socket.gethostname()
    assert stale_reason({"host": here, "pid": os.getppid(), "started": time.time()}, 0, 10) is None
    assert "left by this process" in stale_reason({"host": here, "pid": os.getpid()}, 0, 10)
    # A live pid that started after the lock was taken is another process reusing the number.
    assert "newer process" in stale_reason({"host": here, "pid": os.getppid(), "started": 1.0}, 0, 10)
    assert stale_reason(None, 1.0, 10) is None  # a lock being written this instant
    assert "unreadable" in stale_reason(None, 100.0, 10)


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    lock = acquire(tmp_path, 10.0, print)
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "x", "pid": 2}))
    lock.release()
    assert (tmp_path / LOCK_FILE).exists()
