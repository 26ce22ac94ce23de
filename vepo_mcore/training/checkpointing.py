"""Training checkpoints: megatron.core dist_checkpointing (torch_dist), written atomically.

On-disk layout (everything a resume or a conversion needs, nothing else):

    <save>/latest_checkpointed_iteration.txt   "100": the newest *complete* checkpoint
    <save>/iter_0000100/                        a dist_checkpointing torch_dist directory:
        model.*            sharded tensors of GPTModel.sharded_state_dict() (keys like
                           decoder.layers.0.self_attention.linear_qkv.weight, no 'module.')
        optimizer.*        optimizer.sharded_state_dict(model_sd) (absent in weights-only checkpoints)
        rng_state          ShardedObject per (PP rank, TP rank): python/numpy/torch/CUDA/tracker RNG
        common.pt          iteration, consumed_samples, data_state, scheduler, parallel layout,
                           config (as a dict), format_version, has_optimizer
        config.yaml        the JobConfig of the run (rank 0)
        tokenizer/         the tokenizer files of the run, when a tokenizer directory is given
        integrity.json     size and SHA-256 of every other file above, written last
    <save>/config.yaml, <save>/tokenizer/      the same, beside the checkpoints (the layout
                                                vepo_mcore.checkpoint.convert reads and writes)

Atomicity: every rank writes into `iter_XXXXXXX.tmp`; after a barrier rank 0 adds the config
and tokenizer, renames the directory to `iter_XXXXXXX` and only then replaces the `latest`
file (write to a temp file, fsync, os.replace). A crash anywhere before that leaves `latest`
on the previous complete checkpoint; a stale `.tmp` is removed by the next save.

Asynchronous saves (`async_save=True`, training.checkpoint.async_save): megatron.core's async
request (dist_checkpointing.save(..., async_sharded_save=True)) and its AsyncCallsQueue, as
Megatron-LM's --async-save. The caller blocks only while the state is staged (planning, GPU->host
copies, a fork: on CPU the forked writer's copy-on-write memory is the snapshot); a forked process
writes the shards into the `.tmp` folder and hashes them. Everything that makes the checkpoint
visible (megatron's .metadata and metadata.json, integrity.json, the rename, `latest`, pruning)
runs in the finalisation: `finalize_async_saves()`, on every rank, which the training loop calls
after each step (without waiting), before the next save into the same folder (waiting) and at the
end of run_training (waiting; also after an exception, when every rank reaches it). A process killed
while a save is in flight leaves `latest` on the previous checkpoint; its writer processes die with
it (PR_SET_PDEATHSIG), so none can write into a folder a relaunch reuses.

Integrity: each rank hashes the shard files it wrote straight after writing them (still in its page
cache, so no rank reads more than its own share and nothing is read twice from disk); rank 0 adds
the rest and writes `integrity.json` last, inside the `.tmp` folder before the rename. Loading
checks every file's size against it (a stat, always) and, with `verify_hashes`, its SHA-256 (the
ranks split the files). When the newest checkpoint of a save folder is damaged or incomplete the
load says which file and why and falls back to the newest intact one; a checkpoint named by its
own iteration folder is refused instead. Folders without integrity.json (written before it
existed, or converted from HF) load unchecked.

Resharding: model and optimizer go through dist_checkpointing, so a checkpoint loads into a
different DP size and (model + plain optimizer) into a different TP/PP layout. RNG states are
restored only when TP and PP match (they are per model-parallel rank).
`save_checkpoint(..., optimizer=None)` writes a weights-only checkpoint (what HF conversion
produces); loading one restores only the model (like `finetune=True`).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.config.base import apply_overrides, save_config, to_dict
from vepo_mcore.training.optimizer import adam_step_tensor, torch_adams, unwrap
from vepo_mcore.training.state_dict import load_model_state

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).

LATEST_FILE = "latest_checkpointed_iteration.txt"
INTEGRITY_FILE = "integrity.json"
FORMAT_VERSION = 1
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


@dataclass
class LoadedState:
    """What a resume needs besides the model/optimizer/scheduler tensors loaded in place."""

    iteration: int = 0
    consumed_samples: int = 0
    data_state: dict[str, Any] | None = None
    path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def iteration_dir(save_dir: str | Path, iteration: int) -> Path:
    return Path(save_dir) / f"iter_{iteration:07d}"


def read_latest(checkpoint_dir: str | Path) -> int | None:
    """Iteration named by <dir>/latest_checkpointed_iteration.txt, or None when there is none."""
    path = Path(checkpoint_dir) / LATEST_FILE
    if not path.is_file():
        return None
    text = path.read_text().strip()
    if not text.isdigit():
        raise ValueError(f"{path}: expected an iteration number, got {text!r}")
    return int(text)


def resolve_checkpoint(
    load: str | Path,
    iteration: int | None = None,
    *,
    verify_hashes: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Path | None:
    """The checkpoint directory to load from `load`: a save dir (its newest intact checkpoint, or
    `iteration`), or an iteration directory itself (holding metadata.json). None when `load` holds no
    checkpoint yet.

    Every candidate is checked against its integrity.json (sizes; SHA-256 too with verify_hashes).
    A damaged newest checkpoint falls back to the newest intact one, reported through `warn`
    (default: a warning on rank 0's stderr); a damaged checkpoint the caller named (an iteration
    directory, or `iteration`) is a ValueError naming the file. Collective when verify_hashes is set
    and torch.distributed is up (the ranks split the hashing).
    """
    load = Path(load)
    warn = _warn_rank0 if warn is None else warn
    if (load / "metadata.json").is_file() or iteration is not None:
        path = load if iteration is None else iteration_dir(load, iteration)
        if not (path / "metadata.json").is_file():
            raise FileNotFoundError(f"{path} is not a checkpoint (no metadata.json)")
        problem = check_integrity(path, verify_hashes)
        if problem is not None:
            raise ValueError(
                f"checkpoint {path} is damaged: {problem}; load another iteration, or point at the save "
                "folder to load its newest intact checkpoint"
            )
        return path
    candidates, problems = _candidates(load)
    for it in candidates:
        path = iteration_dir(load, it)
        if (path / "metadata.json").is_file():
            problem = check_integrity(path, verify_hashes)
        else:
            problem = f"{path / 'metadata.json'} is missing (iteration {it} is not a whole checkpoint)"
        if problem is None:
            if problems:
                warn(
                    "WARNING: "
                    + "; ".join(problems)
                    + f". Loading the newest intact checkpoint instead: {path}"
                )
            return path
        problems.append(f"checkpoint {path} is damaged: {problem}")
    if problems:
        raise ValueError(
            f"{load} holds no intact checkpoint: " + "; ".join(problems) + ". Move the damaged iter_* "
            "folders aside (or set training.checkpoint.save to a new folder) to start afresh"
        )
    return None


def _candidates(save_dir: Path) -> tuple[list[int], list[str]]:
    """Iterations to try, newest first: the one `latest` names and the older complete folders; plus
    what is wrong with the `latest` pointer itself (unreadable, or missing beside checkpoints)."""
    on_disk = sorted(
        (int(p.name[5:]) for p in save_dir.glob("iter_*") if p.is_dir() and p.name[5:].isdigit()),
        reverse=True,
    )
    try:
        latest = read_latest(save_dir)
    except ValueError as exc:
        return on_disk, [str(exc)]
    if latest is None:
        problems = (
            [f"{save_dir / LATEST_FILE} is missing beside {len(on_disk)} checkpoint(s)"] if on_disk else []
        )
        return on_disk, problems
    older = [it for it in on_disk if it < latest]
    return [latest, *older], []


def _warn_rank0(text: str) -> None:
    if _rank() == 0:
        print(text, file=sys.stderr, flush=True)


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def record_files(root: Path, files: list[Path]) -> dict[str, dict[str, Any]]:
    """{path relative to root: {size, sha256}} of `files`."""
    return {str(f.relative_to(root)): {"size": f.stat().st_size, "sha256": file_digest(f)} for f in files}


def _shard_writer(name: str) -> int | None:
    """The global rank that wrote a torch_dist shard (`__<rank>_<n>.distcp`); None for other files."""
    match = re.fullmatch(r"__(\d+)_\d+\.distcp", name)
    return int(match.group(1)) if match else None


def write_integrity(root: Path, recorded: dict[str, dict[str, Any]]) -> None:
    """Complete `recorded` with every file under `root` it lacks and write root/integrity.json (fsynced)."""
    rest = [f for f in sorted(root.rglob("*")) if f.is_file() and str(f.relative_to(root)) not in recorded]
    files = {**recorded, **record_files(root, [f for f in rest if f.name != INTEGRITY_FILE])}
    with open(root / INTEGRITY_FILE, "w") as f:
        json.dump({"algorithm": "sha256", "files": dict(sorted(files.items()))}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def check_integrity(path: str | Path, verify_hashes: bool = False) -> str | None:
    """None when the checkpoint at `path` matches its integrity.json (or has none); else
    '<file>: <why>' for its first damaged file. Sizes always; SHA-256 with verify_hashes (each rank
    hashes its share of the files when torch.distributed is up, so call it on every rank then)."""
    path = Path(path)
    manifest = path / INTEGRITY_FILE
    if not manifest.is_file():
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return f"{manifest}: unreadable ({exc})"
    problems = []
    for name, record in files.items():
        f = path / name
        if not f.is_file():
            problems.append(f"{f}: missing")
        elif f.stat().st_size != record["size"]:
            problems.append(f"{f}: {f.stat().st_size} bytes, {record['size']} recorded when it was written")
    if problems or not verify_hashes:
        return problems[0] if problems else None
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = [
        f"{path / name}: SHA-256 differs from the one recorded when it was written"
        for i, (name, record) in enumerate(sorted(files.items()))
        if i % world == rank and file_digest(path / name) != record["sha256"]
    ]
    if world > 1:
        everyone: list[list[str] | None] = [None] * world
        dist.all_gather_object(everyone, mine)
        mine = [p for found in everyone for p in (found or [])]
    return mine[0] if mine else None


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _parallel_layout() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {
        "tp": ps.get_tensor_model_parallel_world_size(),
        "pp": ps.get_pipeline_model_parallel_world_size(),
        "dp": ps.get_data_parallel_world_size(),
    }


def rng_state() -> dict[str, Any]:
    """This rank's RNG states: python, numpy, torch CPU, CUDA (if any), megatron's RNG tracker."""
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    return {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_sharded_object(value: Any):
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject(
        "rng_state",
        value,
        (ps.get_pipeline_model_parallel_world_size(), ps.get_tensor_model_parallel_world_size()),
        (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()),
        replica_id=ps.get_data_parallel_rank(with_context_parallel=True),
    )


def _sharded_state(model, optimizer, is_loading: bool, optimizer_sharding: str) -> dict[str, Any]:
    model_sd = unwrap(model).sharded_state_dict()
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        metadata = {"distrib_optim_sharding_type": optimizer_sharding}
        state["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=metadata)
    return state


def save_checkpoint(
    save_dir: str | Path,
    iteration: int,
    model: torch.nn.Module,
    optimizer=None,
    scheduler=None,
    *,
    consumed_samples: int = 0,
    data_state: dict[str, Any] | None = None,
    config: Any = None,
    tokenizer_dir: str | Path | None = None,
    keep_last: int = 0,
    optimizer_sharding: str = "dp_reshardable",
    async_save: bool = False,
) -> Path:
    """Collective: write <save_dir>/iter_{iteration:07d} atomically and point `latest` at it.

    Keeps the newest `keep_last` iteration directories (0 = all). Returns the checkpoint path.
    `optimizer_sharding` (distributed optimizer only): 'dp_reshardable' = megatron's parallel
    per-rank layout, loadable with another DP size; 'fully_reshardable' = gathered canonical
    layout (costs a gather on DP rank 0), loadable with any TP/PP/DP.
    `async_save`: return once the state is staged; the path exists (and `latest` names it) only
    after finalize_async_saves() on every rank. A save waits for the previous one into the same
    folder to be finalised first.
    """
    from megatron.core import dist_checkpointing

    save_dir = Path(save_dir)
    finalize_async_saves(save_dir)  # one save in flight per folder: the previous one completes first
    final = iteration_dir(save_dir, iteration)
    tmp = final.with_name(final.name + ".tmp")
    if _rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a crashed save
        tmp.mkdir(parents=True)
    _barrier()

    state = _sharded_state(model, optimizer, is_loading=False, optimizer_sharding=optimizer_sharding)
    rng_at_save = rng_state()
    state["rng_state"] = _rng_sharded_object(rng_at_save)
    state.update(
        format_version=FORMAT_VERSION,
        iteration=iteration,
        consumed_samples=consumed_samples,
        data_state=data_state,
        scheduler=scheduler.state_dict() if scheduler is not None else None,
        has_optimizer=optimizer is not None,
        optimizer_sharding=optimizer_sharding,
        parallel=_parallel_layout(),
        config=to_dict(config) if config is not None else None,
    )
    complete = partial(_complete_save, save_dir, tmp, iteration, config, tokenizer_dir, keep_last)
    if not async_save:
        dist_checkpointing.save(state, str(tmp))
        # Writing draws from python/numpy RNGs (and megatron's tracker): put them back, so a run that
        # saved continues exactly as one resumed from this checkpoint does.
        set_rng_state(rng_at_save)
        complete()
        return final

    request = dist_checkpointing.save(state, str(tmp), async_sharded_save=True)
    set_rng_state(rng_at_save)
    if request.async_fn is not None:  # None: nothing to write on this rank
        request = request._replace(async_fn=partial(_background_write, os.getpid(), tmp, request.async_fn))
    request.add_finalize_fn(complete)
    queue = _async_queues().setdefault(os.path.abspath(save_dir), _new_async_queue())
    queue.schedule_async_request(request)  # stages GPU tensors to host memory, then forks the writer
    return final


def _complete_save(
    save_dir: Path,
    tmp: Path,
    iteration: int,
    config: Any,
    tokenizer_dir: str | Path | None,
    keep_last: int,
) -> None:
    """Collective, after every rank's shards are written: integrity.json, config and tokenizer, the
    rename and the `latest` pointer (rank 0), retention."""
    _barrier()
    # Each rank hashes the shards it wrote (from its page cache; an async writer hashed them already).
    recorded = [_own_shard_records(tmp)]
    if dist.is_initialized():
        recorded = [None] * dist.get_world_size()
        dist.all_gather_object(recorded, _own_shard_records(tmp))
    if _rank() == 0:
        final = iteration_dir(save_dir, iteration)
        # Inside the iteration (self-contained) and beside it (where tools/convert_hf.py looks).
        for where in (tmp, save_dir):
            if config is not None:
                save_config(config, where / "config.yaml")
            if tokenizer_dir is not None:
                copy_tokenizer(tokenizer_dir, where / "tokenizer")
        write_integrity(tmp, {name: r for part in recorded for name, r in part.items()})
        if final.exists():  # re-saving an iteration: the old copy goes only once the new one is whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _write_latest(save_dir, iteration)
        if keep_last > 0:
            _prune(save_dir, keep_last, keep=iteration)
    _barrier()


def _own_shard_records(tmp: Path) -> dict[str, dict[str, Any]]:
    """{file: {size, sha256}} of the torch_dist shards this rank wrote into `tmp`; taken from the
    record its background writer left (then removed) when there is one."""
    rank = _rank()
    hashed = tmp / _HASHES_FILE.format(rank=rank)
    if hashed.is_file():
        records = json.loads(hashed.read_text())
        hashed.unlink()
        return records
    return record_files(tmp, [f for f in sorted(tmp.iterdir()) if _shard_writer(f.name) == rank])


# -- asynchronous saves ------------------------------------------------------------------------

_HASHES_FILE = ".shards-{rank}.json"
"""Inside `iter_*.tmp`: the size and SHA-256 of the shards a background writer wrote (removed when
the save is finalised, before integrity.json lists the folder)."""
ERROR_FINALIZE_TIMEOUT_S = 60.0
"""After an exception, how long the ranks wait for each other before finalising a save in flight;
when not every rank arrives (the error was not everywhere) the save is abandoned."""
_ASYNC: dict[str, Any] = {"queues": {}, "closes": 0}
"""{"queues": {save folder: megatron AsyncCallsQueue of its saves in flight} (the same on every rank,
in the same order), "closes": close_async_saves calls so far (names the timed barrier's store keys)}."""


def _async_queues() -> dict[str, Any]:
    return _ASYNC["queues"]


def _new_async_queue():
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    # Not persistent: megatron's persistent worker is spawned and receives the state through a queue,
    # which would move CPU tensors into shared memory in place (the training would overwrite them).
    return AsyncCallsQueue(persistent=False)


def async_saves_in_flight() -> int:
    """Saves scheduled on this rank and not finalised yet."""
    return sum(q.get_num_unfinalized_calls() for q in _async_queues().values())


def finalize_async_saves(save_dir: str | Path | None = None, *, blocking: bool = True) -> int:
    """Collective: finalise the asynchronous saves in flight (of `save_dir`, or all), so that each
    becomes the folder's `latest`. `blocking=False` finalises only those whose writers have finished
    on every rank (one small all-reduce per folder with a save in flight; nothing when none is).
    A writer's failure raises megatron's CheckpointException on every rank. Returns how many saves
    were finalised. The training RNG streams are left as they were."""
    queues = _async_queues()
    keys = list(queues) if save_dir is None else [os.path.abspath(save_dir)]
    pending = [queues[k] for k in keys if k in queues and queues[k].get_num_unfinalized_calls()]
    if not pending:
        return 0
    rng = rng_state()
    try:
        return sum(len(q.maybe_finalize_async_calls(blocking=blocking)) for q in pending)
    finally:
        set_rng_state(rng)


def close_async_saves(after_error: bool = False) -> None:
    """End of a run (every rank): finalise what is in flight, then forget the run's queues. After an
    exception, the ranks first meet at a barrier on the process group's store that gives up after
    ERROR_FINALIZE_TIMEOUT_S (_all_ranks_arrive): when a rank does not come (the error hit only some
    ranks; the others wait in a collective) the saves are abandoned instead: their writers are
    killed and `latest` stays on the previous checkpoint. Never raises after an exception (the
    original error is the one to report)."""
    _ASYNC["closes"] += 1
    try:
        if not async_saves_in_flight():
            return
        if not after_error:
            finalize_async_saves()
            return
        try:
            if not _all_ranks_arrive(f"vepo_async_close/{_ASYNC['closes']}", ERROR_FINALIZE_TIMEOUT_S):
                raise TimeoutError(
                    f"not every rank reached the end of the run within {ERROR_FINALIZE_TIMEOUT_S:.0f}s"
                )
            _warn_rank0("finalising the checkpoint being written before exiting on the error")
            finalize_async_saves()
        except Exception as exc:
            print(f"WARNING: checkpoint in flight abandoned ({exc}); latest stays on the previous one",
                  file=sys.stderr, flush=True)  # fmt: skip
            for queue in _async_queues().values():
                for active in queue.async_calls:
                    active.async_caller.close(abort=True)
                queue.async_calls.clear()
    finally:
        _ASYNC["queues"] = {}  # the next run (maybe on a new process group) starts afresh


def _all_ranks_arrive(key: str, timeout_s: float) -> bool:
    """A barrier through the process group's key-value store that every rank leaves with the same
    answer: rank 0 waits up to `timeout_s` for all to arrive and publishes the verdict; the others wait
    for it as long. No collective is issued, so ranks stuck in one (where the error did not happen)
    cannot hang it, nor it them."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    store = dist.distributed_c10d._get_default_store()
    timeout = timedelta(seconds=timeout_s)
    store.add(f"{key}/arrived", 1)
    if _rank() == 0:
        deadline = time.monotonic() + timeout_s
        while store.add(f"{key}/arrived", 0) < dist.get_world_size() and time.monotonic() < deadline:
            time.sleep(0.05)
        everyone = store.add(f"{key}/arrived", 0) >= dist.get_world_size()
        # A rank that arrived, waited its timeout and left counts as absent.
        verdict = b"go" if everyone and store.add(f"{key}/gave_up", 0) == 0 else b"abandon"
        store.set(f"{key}/verdict", verdict)
        return verdict == b"go"
    try:
        store.wait([f"{key}/verdict"], timeout)
    except Exception:  # rank 0 never came
        store.add(f"{key}/gave_up", 1)
        return False
    return store.get(f"{key}/verdict") == b"go"


def _background_write(trainer_pid: int, tmp: Path, write: Callable, rank: int, buckets, *args) -> None:
    """The forked writer: megatron's write of this rank's shards, then their sizes and SHA-256 (read
    back from the page cache while the trainer trains) for the finalisation."""
    _die_with_parent(trainer_pid)
    # megatron forks one process per file; those must not outlive the trainer either.
    os.register_at_fork(after_in_child=partial(_die_with_parent, os.getpid()))
    write(rank, buckets, *args)
    start = time.perf_counter()
    try:
        records = record_files(tmp, [Path(bucket[0]) for bucket in buckets])
        part = tmp / (_HASHES_FILE.format(rank=rank) + ".part")
        part.write_text(json.dumps(records))
        os.replace(part, tmp / _HASHES_FILE.format(rank=rank))
    except OSError as exc:  # the finalisation hashes them itself
        print(f"rank {rank}: background shard hashing failed ({exc}) after {time.perf_counter() - start:.1f}s",
              file=sys.stderr, flush=True)  # fmt: skip


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux prctl PR_SET_PDEATHSIG): a writer left behind by
    a killed trainer could otherwise write into an `iter_*.tmp` folder that a relaunch re-creates."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


def copy_tokenizer(src: str | Path, dst: str | Path) -> None:
    """Copy the tokenizer files of `src` (those that exist) into `dst`."""
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"tokenizer directory {src} does not exist")
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def _write_latest(save_dir: Path, iteration: int) -> None:
    tmp = save_dir / (LATEST_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, save_dir / LATEST_FILE)


def _prune(save_dir: Path, keep_last: int, keep: int) -> None:
    iterations = sorted(
        int(p.name[5:]) for p in save_dir.glob("iter_*") if p.is_dir() and p.name[5:].isdigit()
    )
    for it in iterations[:-keep_last]:
        if it != keep:
            shutil.rmtree(iteration_dir(save_dir, it), ignore_errors=True)


def _init_empty_adam_state(optimizer) -> None:
    """Give every parameter of a fresh torch Adam zero moments *and* a step counter.

    megatron.core 0.16's DistributedOptimizer.state_dict() (no apex/TE) needs a 'step' entry per
    parameter, but its init_state_fn creates only the moments, so building the loading state dict
    of a never-stepped optimizer fails. Loading overwrites all of these values. Only torch's
    Adam/AdamW (what megatron uses without TE or apex) keeps a per-parameter step.
    """
    for torch_opt in torch_adams(optimizer):
        for group in torch_opt.param_groups:
            for p in group["params"]:
                if len(torch_opt.state[p]) == 0:
                    torch_opt.state[p]["step"] = adam_step_tensor(group, p, 0.0)
                    torch_opt.state[p]["exp_avg"] = torch.zeros_like(p.data)
                    torch_opt.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)


def _fix_adam_steps(optimizer) -> None:
    """Give each parameter its own Adam step tensor, set from the checkpoint's param-group step.

    megatron.core 0.16's DistributedOptimizer.load_state_dict (torch Adam, no apex/TE) puts one
    shared step tensor into every parameter's state, and the dp_reshardable loader then
    overwrites it with a wrong value: torch Adam's bias correction would be off after resume.
    """
    for torch_opt in torch_adams(optimizer):
        for group in torch_opt.param_groups:
            if group.get("step") is None:
                continue
            for p in group["params"]:
                if "step" in torch_opt.state[p]:
                    torch_opt.state[p]["step"] = adam_step_tensor(group, p, float(group["step"]))


def _is_distributed(optimizer) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    return any(isinstance(o, DistributedOptimizer) for o in inner)


def load_checkpoint(
    load: str | Path,
    model: torch.nn.Module,
    optimizer=None,
    scheduler=None,
    *,
    iteration: int | None = None,
    finetune: bool = False,
    verify_hashes: bool = False,
) -> LoadedState | None:
    """Collective: load the checkpoint at `load` (save dir or iteration dir) into model/optimizer/scheduler.

    `finetune=True`, or a weights-only checkpoint, loads only the model and starts at iteration 0.
    Returns None when `load` is a save directory with no checkpoint yet. The checkpoint is checked
    first (resolve_checkpoint): a damaged newest one falls back to the newest intact one.
    """
    from megatron.core import dist_checkpointing

    path = resolve_checkpoint(load, iteration, verify_hashes=verify_hashes)
    if path is None:
        return None
    common = dist_checkpointing.load_common_state_dict(str(path))
    weights_only = finetune or not common.get("has_optimizer", False)
    layout, saved_layout = _parallel_layout(), common.get("parallel") or {}
    same_mp = saved_layout.get("tp") == layout["tp"] and saved_layout.get("pp") == layout["pp"]
    sharding = common.get("optimizer_sharding", "dp_reshardable")
    if not weights_only and not same_mp and sharding == "dp_reshardable" and _is_distributed(optimizer):
        raise ValueError(
            f"{path}: distributed-optimizer state saved as 'dp_reshardable' with TP={saved_layout.get('tp')} "
            f"PP={saved_layout.get('pp')} cannot load into TP={layout['tp']} PP={layout['pp']}; save with "
            "optimizer_sharding='fully_reshardable', or load weights only (training.checkpoint.finetune=true)"
        )
    if not weights_only and optimizer is not None:
        _init_empty_adam_state(optimizer)
    state = _sharded_state(model, None if weights_only else optimizer, True, sharding)
    if not weights_only and same_mp:
        state["rng_state"] = _rng_sharded_object(None)
    loaded = dist_checkpointing.load(state, str(path))

    load_model_state(unwrap(model), loaded["model"])  # TE `_extra_state` may be absent
    if weights_only:
        if optimizer is not None:
            optimizer.reload_model_params()  # fp32 master copies (bf16 runs) follow the new weights
        return LoadedState(path=str(path))
    if optimizer is not None:
        with torch.no_grad():  # fp32 runs: the distributed optimizer's main params are views of the weights
            optimizer.load_state_dict(loaded["optimizer"])
        _fix_adam_steps(optimizer)
    if scheduler is not None and common.get("scheduler") is not None:
        scheduler.load_state_dict(common["scheduler"])
    if "rng_state" in loaded:
        set_rng_state(loaded["rng_state"])
    return LoadedState(
        iteration=int(common["iteration"]),
        consumed_samples=int(common.get("consumed_samples", 0)),
        data_state=common.get("data_state"),
        path=str(path),
        extra={"parallel": saved_layout},
    )


def checkpoint_config(checkpoint: str | Path, overrides: list[str] | None = None) -> tuple[JobConfig, Path]:
    """(the JobConfig saved with the checkpoint + overrides, the checkpoint's iteration directory)."""

    path = resolve_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(f"{checkpoint} holds no checkpoint (no latest_checkpointed_iteration.txt)")
    saved = path / "config.yaml"
    if not saved.is_file():
        raise FileNotFoundError(f"{saved} is missing: the checkpoint does not say which model it holds")
    cfg = load_config(JobConfig, saved)
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    if (path / "tokenizer" / "tokenizer.json").is_file():
        cfg.tokenizer.path = str(path / "tokenizer")
    return cfg, path
