"""Fault injection for the trainers (tests/faults at a small size, benchmarks/fault_inject.py at N >= 20).

    spec = cpt_spec(workdir, nproc=2)                      # or sft_spec / rl_spec: the real tools
    straight = run_to_end(spec, workdir / "straight")      # the uninterrupted reference
    report = kill_and_resume(spec, workdir / "faulty", kills=20, rng=random.Random(0))
    compare_runs(straight, workdir / "faulty", report)     # curves and final checkpoint, bit for bit

Each launch runs the tool (torchrun for nproc > 1) in its own session; a kill is SIGKILL to the
whole session (torchrun's agent and every rank). Kill points are random: after a random step has
been logged (plus a random delay up to about one step), or while a checkpoint is being written
(an `iter_*.tmp` folder that this launch created). After every kill the harness notes the newest
complete checkpoint (`latest`); the relaunch must say it resumed from exactly that one (a resume
from an older one counts as a lost checkpoint). damage_and_resume() damages a random file of the
newest checkpoint and checks the relaunch names it and falls back; second_writer() starts a
second run on a folder that is being written and checks it is refused naming the holder.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


@dataclass
class TrainerSpec:
    """How to launch one trainer: tool, config, dotted overrides; `train_iters` and `save_interval`
    as those overrides set them; `cwd` holds the data the config names."""

    name: str
    tool: str
    config: str
    overrides: list[str]
    train_iters: int
    save_interval: int
    cwd: Path
    nproc: int = 1

    def command(self, save: Path, port: int | None = None) -> list[str]:
        py = sys.executable
        if self.nproc > 1:
            from vepo_mcore.parallel.init import free_port

            launcher = [str(Path(py).with_name("torchrun")), "--nproc-per-node", str(self.nproc),
                        "--master-addr", "127.0.0.1", "--master-port", str(port or free_port())]  # fmt: skip
        else:
            launcher = [py]
        return [
            *launcher, str(ROOT / self.tool), "--config", str(ROOT / self.config), *self.overrides,
            "--training.train_iters", str(self.train_iters), "--training.checkpoint.save", str(save),
            "--training.checkpoint.save_interval", str(self.save_interval),
            "--training.logging.progress_bar", "false",
        ]  # fmt: skip


MODEL_SMALL = ["--training.micro_batch_size", "2", "--training.global_batch_size", "4"]


def cpt_spec(workdir: Path, nproc: int = 1, train_iters: int = 12, save_interval: int = 2) -> TrainerSpec:
    """CPT on the FLORES-dev corpus (tools/build_cpt_corpus.py into workdir/data/cpt_tiny)."""
    return TrainerSpec(
        "cpt", "tools/pretrain_cpt.py", "examples/configs/cpt_tiny.yaml",
        [*MODEL_SMALL, "--training.seq_length", "32", "--training.eval_interval", "0",
         "--training.checkpoint.keep_last", "2"],
        train_iters, save_interval, workdir, nproc,
    )  # fmt: skip


def sft_spec(workdir: Path, nproc: int = 1, train_iters: int = 12, save_interval: int = 2) -> TrainerSpec:
    """SFT (packed curriculum) on tools/build_sft_data.py's set in workdir/data/sft_tiny."""
    return TrainerSpec(
        "sft", "tools/pretrain_cpt.py", "examples/configs/sft_tiny.yaml",
        [*MODEL_SMALL, "--training.seq_length", "64", "--training.checkpoint.keep_last", "2"],
        train_iters, save_interval, workdir, nproc,
    )  # fmt: skip


def rl_spec(workdir: Path, nproc: int = 1, train_iters: int = 8, save_interval: int = 2) -> TrainerSpec:
    """VEPO with the embedded engine on FLORES prompts (no data files)."""
    return TrainerSpec(
        "rl", "tools/train_vepo.py", "examples/configs/vepo_tiny.yaml",
        ["--rl.prompts_per_step", "2", "--rl.filtering.num_candidates", "3", "--rl.filtering.group_size", "2",
         "--training.micro_batch_size", "2", "--rl.rollout.sampling.max_new_tokens", "6",
         "--rl.directions", "en-th,zh-en", "--training.checkpoint.keep_last", "2"],
        train_iters, save_interval, workdir, nproc,
    )  # fmt: skip


def build_data(workdir: Path) -> None:
    """The CPT corpus and SFT set the specs read (FLORES dev, shipped with the package)."""
    for tool, out in (("build_cpt_corpus.py", "data/cpt_tiny"), ("build_sft_data.py", "data/sft_tiny")):
        if not (workdir / out).is_dir():
            _check(subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--output-dir", out],
                                  cwd=workdir, env=_env(), capture_output=True, text=True))  # fmt: skip


def _env() -> dict[str, str]:
    """The launch environment, without a MASTER_PORT the test process may hold: init_distributed sets
    one in os.environ when a test initialises in-process, and every launch inheriting it would share
    that port (EADDRINUSE as soon as two overlap or one is left behind)."""
    inherited = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    return {**inherited, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}


def _check(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, proc.args))} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )


@dataclass
class Launch:
    """One started trainer: its process (session leader) and log file."""

    proc: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""


def launch(spec: TrainerSpec, save: Path, log: Path, port: int | None = None) -> Launch:
    """Start the trainer; `port`: its rendezvous port (torchrun's, or MASTER_PORT for one process),
    else a free one."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = _env() if port is None else {**_env(), "MASTER_PORT": str(port)}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            spec.command(save, port), cwd=spec.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Launch(proc, log)


def kill9(run: Launch) -> None:
    """SIGKILL the launch and every process under it (torchrun starts each rank in its own session)."""
    import psutil

    try:
        leader = psutil.Process(run.proc.pid)
        tree = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for proc in tree:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    run.proc.wait()
    psutil.wait_procs(tree[1:], timeout=30)


def run_to_end(spec: TrainerSpec, save: Path, log_name: str = "straight.log", timeout: float = 1200) -> Path:
    run = launch(spec, save, save.parent / f"{save.name}_{log_name}")
    try:
        rc = run.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill9(run)
        raise AssertionError(f"{spec.name} did not finish in {timeout} s:\n{run.text()[-3000:]}") from None
    if rc != 0:
        raise AssertionError(f"{spec.name} exited {rc}:\n{run.text()[-4000:]}")
    return save


def read_latest(save: Path) -> int:
    try:
        return int((save / "latest_checkpointed_iteration.txt").read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def logged_steps(save: Path) -> int:
    """The highest step in save/metrics.jsonl (0 when none)."""
    path = save / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            steps.append(int(json.loads(line)["step"]))
        except (ValueError, KeyError):
            pass
    return max(steps)


def _tmp_folders(save: Path) -> dict[str, tuple[int, int]]:
    """{name: (inode, ctime)} of the iter_*.tmp folders (a checkpoint being written, or one a kill
    left): a folder left by a kill keeps its signature until a save removes and recreates it."""
    found = {}
    for p in save.glob("iter_*.tmp") if save.is_dir() else ():
        try:
            st = p.stat()
            found[p.name] = (st.st_ino, st.st_ctime_ns)
        except FileNotFoundError:
            pass
    return found


@dataclass
class FaultReport:
    """What kill_and_resume saw; printed as one row of the fault table."""

    trainer: str
    kills: int = 0
    saves_interrupted: int = 0
    resumes: int = 0
    checkpoints_lost: int = 0
    damaged_caught: int = 0
    damaged_tried: int = 0
    second_writer_refused: int = 0
    second_writer_tried: int = 0
    curves_identical: bool | None = None
    checkpoint_identical: bool | None = None
    events: list[str] = field(default_factory=list)


def kill_and_resume(
    spec: TrainerSpec,
    save: Path,
    kills: int,
    rng: random.Random,
    save_share: float = 0.4,
    save_after: int = 0,
    poll_s: float = 0.002,
    timeout: float = 1200,
) -> FaultReport:
    """Launch, kill -9 at a random point, relaunch, `kills` times; then let the last launch finish.

    A kill is aimed at a checkpoint being written with probability `save_share`, otherwise at a
    random moment after a random step; only once `latest` names a checkpoint >= save_after. A
    launch that ends before its kill point ends the series.
    """
    report = FaultReport(spec.name)
    expected_resume = 0
    for k in range(kills + 1):
        stale_tmp = _tmp_folders(save)
        run = launch(spec, save, save.parent / f"{save.name}_launch{k:02d}.log")
        start = time.monotonic()
        resumed = _wait_for_start(run, timeout)
        if resumed is not None:
            report.resumes += 1
            if resumed < expected_resume:
                report.checkpoints_lost += 1
                report.events.append(
                    f"launch {k}: resumed at {resumed}, newest complete was {expected_resume}"
                )
        elif expected_resume:
            report.checkpoints_lost += 1
            report.events.append(f"launch {k}: started fresh, newest complete was {expected_resume}")
        if k == kills:
            break
        at_save = rng.random() < save_share
        target = rng.randint(min(logged_steps(save), spec.train_iters - 1), spec.train_iters - 1)
        extra = rng.uniform(0.0, 1.0)
        fired = False
        while run.proc.poll() is None and time.monotonic() - start < timeout:
            if at_save and read_latest(save) >= save_after:
                fresh = {n for n, ino in _tmp_folders(save).items() if stale_tmp.get(n) != ino}
                if fresh:
                    time.sleep(rng.uniform(0.0, 0.05))
                    fired = True
            elif not at_save and logged_steps(save) >= target:
                time.sleep(extra)
                fired = True
            if fired:
                break
            time.sleep(poll_s)
        if not fired or run.proc.poll() is not None:
            run.proc.wait()
            if run.proc.returncode != 0:
                raise AssertionError(
                    f"{spec.name} launch {k} exited {run.proc.returncode}:\n{run.text()[-4000:]}"
                )
            report.events.append(f"launch {k}: finished before its kill point")
            return report
        kill9(run)
        report.kills += 1
        interrupted = {n for n, ino in _tmp_folders(save).items() if stale_tmp.get(n) != ino}
        report.saves_interrupted += bool(interrupted)
        expected_resume = read_latest(save)
        report.events.append(
            f"kill {report.kills}: {'during save' if interrupted else 'between saves'} "
            f"(aimed at {'a save' if at_save else f'step {target}+{extra:.2f}s'}), newest complete {expected_resume}"
        )
    rc = run.proc.wait(timeout=timeout)
    if rc != 0:
        raise AssertionError(f"{spec.name} final launch exited {rc}:\n{run.text()[-4000:]}")
    return report


def _wait_for_start(run: Launch, timeout: float) -> int | None:
    """Block until the launch has said where it starts (a 'resumed from' line or its first step);
    returns the resumed step, or None for a fresh start."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        text = run.text()
        match = RESUMED.search(text)
        if match:
            return int(match.group(2))
        if re.search(r"\] iteration \d+/\d+ \| consumed", text) or run.proc.poll() is not None:
            match = RESUMED.search(run.text())
            return int(match.group(2)) if match else None
        time.sleep(0.01)
    kill9(run)
    raise AssertionError(f"launch did not start in {timeout} s:\n{run.text()[-3000:]}")


def curve_rows(save: Path) -> list[dict]:
    """metrics.jsonl without the timing metrics (perf/*), which differ between any two runs."""
    rows = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


def checkpoint_tensors(path: Path, scratch: Path) -> dict:
    """Every tensor and object of a torch_dist checkpoint, read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = scratch / f"{path.parent.name}_{path.name}.pt"
    dcp_to_torch_save(str(path), str(out))
    state = torch.load(out, weights_only=False)
    out.unlink()
    return state


def same_value(x, y) -> bool:
    """Bit-for-bit equality through containers: tensors and arrays (dtype and values), the bytes of
    an io.BytesIO, dicts, lists and tuples item by item, anything else by ==."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y)
    if hasattr(x, "getvalue"):  # io.BytesIO of a ShardedObject
        return hasattr(y, "getvalue") and x.getvalue() == y.getvalue()
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same_value(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(map(same_value, x, y))
    return x == y


def same_state(a: dict, b: dict) -> list[str]:
    """Keys whose values differ (same_value), or that only one side has."""
    if set(a) != set(b):
        return sorted(set(a) ^ set(b))
    return [key for key in a if not same_value(a[key], b[key])]


def compare_runs(straight: Path, faulty: Path, report: FaultReport, iteration: int) -> FaultReport:
    """Fill report.curves_identical / checkpoint_identical: metrics.jsonl (each step once, every value
    equal) and everything the final checkpoint holds (model, optimizer, scheduler, data position and
    the python/numpy/torch/tracker RNG states), bit for bit."""
    report.curves_identical = curve_rows(straight) == curve_rows(faulty)
    name = f"iter_{iteration:07d}"
    a = checkpoint_tensors(straight / name, straight.parent)
    b = checkpoint_tensors(faulty / name, faulty.parent)
    differ = same_state(a, b)
    report.checkpoint_identical = not differ
    if differ:
        report.events.append(f"final checkpoint differs in {differ[:5]}")
    return report


def damage_and_resume(spec: TrainerSpec, save: Path, rng: random.Random, report: FaultReport) -> str:
    """Damage a random file of the newest checkpoint of a finished run (truncate, empty or delete),
    relaunch: it must name the file, fall back to the previous checkpoint and train to the end
    again. Returns the relaunch's warning line."""
    newest = save / f"iter_{read_latest(save):07d}"
    files = sorted(json.loads((newest / "integrity.json").read_text())["files"])
    victim = newest / rng.choice(files)
    how = rng.choice(["truncate", "empty", "delete"])
    if how == "truncate":
        victim.write_bytes(victim.read_bytes()[: max(victim.stat().st_size // 2, 1) - 1])
    elif how == "empty":
        victim.write_bytes(b"")
    else:
        victim.unlink()
    report.damaged_tried += 1
    run = run_to_end(spec, save, log_name=f"damaged{report.damaged_tried}.log")
    log = (run.parent / f"{save.name}_damaged{report.damaged_tried}.log").read_text()
    warning = next((line for line in log.splitlines() if "is damaged" in line), "")
    older = RESUMED.search(log)
    if str(victim) in warning and older and int(older.group(2)) < int(newest.name[5:]):
        report.damaged_caught += 1
    report.events.append(f"damage ({how} {victim.relative_to(save)}): {warning[:300]}")
    return warning


def second_writer(spec: TrainerSpec, save: Path, report: FaultReport, timeout: float = 1200) -> str:
    """Start a second run on a folder the first holds: exactly one must train to the end and the other
    exit non-zero naming the first's rank 0 (its pid). Returns the refusal's error line."""
    import psutil

    from vepo_mcore.parallel.init import free_port

    first_port = free_port()
    runs = [launch(spec, save, save.parent / f"{save.name}_writer1.log", first_port)]
    # The second starts once the first holds the folder: a real second launch.
    start = time.monotonic()
    while not (save / "writer.lock").is_file() and runs[0].proc.poll() is None:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"the first writer took no lock on {save} within {timeout} s")
        time.sleep(0.05)
    pids: list[set[int]] = [{runs[0].proc.pid}]
    # Its rendezvous port is picked just before it starts, and it starts again if the port was taken
    # meanwhile (EADDRINUSE: the first run's gloo connections take ephemeral ports; not a refusal).
    for attempt in range(3):
        port = next(p for p in iter(free_port, None) if p != first_port)
        second = launch(spec, save, save.parent / f"{save.name}_writer2_{attempt}.log", port)
        pids[1:] = [{second.proc.pid}]
        start = time.monotonic()
        while any(r.proc.poll() is None for r in (runs[0], second)) and time.monotonic() - start < timeout:
            for r, seen in zip(
                (runs[0], second), pids
            ):  # torchrun's workers: rank 0 is a child of the leader
                try:
                    seen.update(c.pid for c in psutil.Process(r.proc.pid).children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
            if second.proc.poll() is not None:
                break
            time.sleep(0.05)
        second.proc.wait(timeout=timeout)
        if "EADDRINUSE" not in second.text() or runs[0].proc.poll() is not None:
            break
    runs.append(second)
    codes = [r.proc.wait(timeout=timeout) for r in runs]
    report.second_writer_tried += 1
    refused = [i for i, rc in enumerate(codes) if rc != 0]
    error = ""
    if len(refused) == 1:
        loser, winner = refused[0], 1 - refused[0]
        error = next(
            (ln for ln in runs[loser].text().splitlines() if "being written by another run" in ln), ""
        )
        holder = re.search(r"pid (\d+) on host", error)
        if codes[winner] == 0 and holder and int(holder.group(1)) in pids[winner]:
            report.second_writer_refused += 1
    report.events.append(f"second writer (exit codes {codes}): {error[:300]}")
    return error


TABLE_COLUMNS = (
    ("trainer", "trainer"),
    ("kills", "kills"),
    ("saves_interrupted", "saves interrupted"),
    ("resumes", "resumes"),
    ("checkpoints_lost", "checkpoints lost"),
    ("damaged", "damaged files caught"),
    ("writer", "second writer refused"),
    ("curves_identical", "curves identical"),
    ("checkpoint_identical", "final checkpoint identical"),
)


def table(reports: list[FaultReport]) -> str:
    """A markdown table of the reports."""
    rows = []
    for r in reports:
        cells = {
            **{
                k: str(getattr(r, k))
                for k in ("trainer", "kills", "saves_interrupted", "resumes", "checkpoints_lost")
            },
            "damaged": f"{r.damaged_caught}/{r.damaged_tried}",
            "writer": f"{r.second_writer_refused}/{r.second_writer_tried}",
            "curves_identical": {True: "yes", False: "NO", None: "-"}[r.curves_identical],
            "checkpoint_identical": {True: "yes", False: "NO", None: "-"}[r.checkpoint_identical],
        }
        rows.append([cells[k] for k, _ in TABLE_COLUMNS])
    header = [title for _, title in TABLE_COLUMNS]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])
