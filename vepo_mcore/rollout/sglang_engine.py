"""The colocated SGLang rollout engine (GPU path), and the same code driving the CPU fake in tests
(harness/fake_sglang.py registers 'fake_sglang': this SGLangEngine over a fake backend).

    engine = build_engine(cfg)            # rl.rollout.engine: sglang (tests: fake_sglang); released at once
    engine.wake(); sync_weights(engine, model, cfg); samples = engine.generate(prompts, sampling)
    engine.sleep()                        # give the GPU memory back to training

Memory order (slime's colocated trainer; SGLang 0.5.23's scheduler, scheduler_components/
weight_updater.py): a colocated engine releases all its memory right after it is built, so its first
wake() resumes something released (resuming a tag never released is a KeyError that kills the
scheduler). wake() empties every rank's CUDA cache and resumes the weights only; the weight sync
writes them; the first generate() resumes kv_cache and cuda_graph. sleep() waits until the engine is
idle (flush_cache succeeds only then; release asserts it), releases everything, and every rank
waits until its GPU's free memory stops rising before training allocates again.

One `sglang.Engine` per block of `ranks_per_engine` ranks (default: one for the whole job) lives in
the block's first process and spans `engine_tp` GPUs (SGLang shards the full HF tensors it receives
itself, so engine TP need not equal training TP); it serves the prompts of the block's ranks.
It is started with `enable_memory_saver=True` so `release_memory_occupation` frees its weights and
KV cache while training runs, and `skip_tokenizer_init=True`: token ids in, token ids out, our
tokenizer decodes. Without `model_path` it starts from a config-only HF directory written from
cfg.model with `load_format="dummy"`; the first weight sync brings the real weights.

Weights arrive through `update_weights_from_tensor(load_format="flattened_bucket")`: tensors of one
dtype packed into buckets of rl.rollout.weight_bucket_mb (`FlattenedTensorBucket`), serialised once
per engine TP rank, KV cache flushed once at the end. bucket_bytes=0 pushes tensor by tensor
(load_format=None), the baseline of benchmarks/weight_sync.py.

With rl.rollout.weight_sync 'distributed' the engine sits on other GPUs (rl.rollout.engine_base_gpu,
say the second half of a node): it is not released while training runs (sleep/wake do nothing), and
weights arrive through `update_weights_from_distributed` over the update groups of
rollout/weight_sync.py (`join_update_group` once, then one call per broadcast bucket, inside one
weight-update session, KV cache flushed once at the end).

Log-probs: SGLang reports log softmax(logits / temperature) unless SGLANG_RETURN_ORIGINAL_LOGPROB
is set, which must stay unset (VEPO needs the tempered policy). When the engine's vocabulary has
more rows than the real vocabulary, a logit_bias of -1e9 hides the padding ids, as training does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vepo_mcore.checkpoint.hf import hf_config_from_model
from vepo_mcore.rollout.base import SamplingParams, as_samples, finish_sample, register_engine
from vepo_mcore.translation.sample import Sample

# Imported where used: sglang (optional: the [gpu] extra; the CPU fake stands in for it in tests),
# megatron.core (heavy, and optional here: without model parallelism every rank is its own replica).

PADDING_BIAS = -1e9


@dataclass(frozen=True)
class SGLangBackend:
    """Where the engine class and the weight-transfer helpers come from (real sglang or the fake)."""

    engine_cls: Callable[..., Any]
    bucket_cls: type
    serializer: type
    patch_reductions: Callable[[], None]
    """sglang.srt.utils.patch_torch.monkey_patch_torch_reductions: CUDA IPC handles name the GPU by
    UUID, so an engine process with another CUDA_VISIBLE_DEVICES maps the right device."""


def sglang_backend() -> SGLangBackend:
    """sglang.Engine, FlattenedTensorBucket and MultiprocessingSerializer, imported lazily."""
    try:
        import sglang
        from sglang.srt.utils import MultiprocessingSerializer
    except ImportError as exc:
        raise ImportError(
            "rl.rollout.engine 'sglang' needs the sglang package and a CUDA GPU "
            '(pip install -e ".[gpu]"); on CPU use rl.rollout.engine=embedded'
        ) from exc
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions  # 0.5.15.post1 .. 0.5.23
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    return SGLangBackend(
        sglang.Engine, FlattenedTensorBucket, MultiprocessingSerializer, monkey_patch_torch_reductions
    )


@contextlib.contextmanager
def trainer_process_state_kept() -> Iterator[None]:
    """Run the block with the calling process's environment, root logging and multiprocessing start
    method restored afterwards, whatever the block changed.

    `sglang.Engine(...)` configures the process that builds it as if it were SGLang's own server
    (sglang 0.5.23: entrypoints/engine.py `_set_envs_and_config` and `configure_logger`,
    arg_groups/attention_hook.py `handle_deterministic_inference`): CUDA_DEVICE_MAX_CONNECTIONS=8,
    NCCL_ALGO=allreduce:tree and NCCL_MIN/MAX_NCHANNELS with deterministic inference at engine TP > 1,
    NCCL_CUMEM_ENABLE / NCCL_NVLS_ENABLE, `logging.basicConfig(force=True, level=ERROR)` and
    `multiprocessing.set_start_method("spawn", force=True)`. Only engine owners build an engine, so
    without this their NCCL settings would differ from their peers' when Megatron creates its
    communicators later (ranks disagreeing on NCCL_ALGO can hang), rank 0's log lines below ERROR
    would vanish, and Megatron's CUDA_DEVICE_MAX_CONNECTIONS=1 check would read 8.

    Restoring is preferred to creating every NCCL communicator before the engine: NCCL reads its
    variables when each communicator is created, and torch and Megatron create some only at their
    first collective, so an eager pass cannot promise to cover all of them; nor does it undo the
    logging and start-method changes. The engine keeps what it needs: its scheduler processes are
    spawned inside the block and took their own copy of the environment there.
    """
    environ = dict(os.environ)
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    # basicConfig(force=True) closes the root handlers it removes: hand it an empty list so ours
    # survive open, then put them back.
    root.handlers = []
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        yield
    finally:
        for name in set(os.environ) - set(environ):
            del os.environ[name]
        os.environ.update(environ)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers = handlers
        root.setLevel(level)
        multiprocessing.set_start_method(start_method, force=True)


MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
"""sglang.srt.constants.GPU_MEMORY_ALL_TYPES (0.5.15.post1, 0.5.23)."""
FLUSH_ATTEMPTS = 120
"""flush_cache tries (0.5 s apart) before a release: SGLang flushes, and may release, only when idle."""


class SGLangEngine:
    """RolloutEngine over an `sglang.Engine` (or its fake) owned by one rank."""

    shares_training_weights = False
    weights_survive_sleep = False

    def __init__(
        self,
        cfg,
        backend: SGLangBackend,
        model_path: str | os.PathLike | None = None,
        tokenizer=None,
        ranks_per_engine: int | None = None,
        name: str = "sglang",
        colocated: bool | None = None,
        **engine_kwargs: Any,
    ):
        """colocated (default: no model_path, i.e. weights come from training by sync): release the
        engine's memory right after it is built, as slime does, so training runs beside it."""
        rollout = cfg.rl.rollout
        self.name = name
        self.backend = backend
        self.tokenizer = tokenizer
        self._place(cfg, ranks_per_engine if ranks_per_engine is not None else rollout.ranks_per_engine)
        self.vocab_size = cfg.model.vocab_size
        self.engine_tp = rollout.engine_tp
        self.bucket_bytes = rollout.weight_bucket_mb << 20
        self.seed = cfg.training.seed
        self.deterministic = rollout.deterministic_inference
        self.weight_sync = rollout.weight_sync
        if self.weight_sync == "distributed":
            self.weights_survive_sleep = True  # the engine keeps its GPUs: nothing is released
        self.update_groups = None
        """rollout/weight_sync.py's UpdateGroups, once the distributed update groups exist."""
        self.weights_version: int | None = None
        """The version of the weights the engine holds (rollout/weight_sync.py sets it after a sync on
        every rank; a release of the weights clears it)."""
        self.engine_base_gpu: int | None = None
        """The engine's first GPU (engine TP rank k runs on engine_base_gpu + k); None on CPU."""
        self.last_sync: dict[str, float] = {}
        self.released: set[str] = set()
        if colocated is None:
            colocated = model_path is None and self.weight_sync == "colocated"
        self._tmpdir = None
        load_format = engine_kwargs.pop("load_format", None)
        if model_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="vepo_sglang_")
            model_path = write_config_dir(cfg, self._tmpdir.name)
            load_format = "dummy"
        self.model_path = str(model_path)
        self.engine_vocab_rows = int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])
        if self.engine_vocab_rows < self.vocab_size:
            raise ValueError(
                f"{model_path}/config.json: vocab_size {self.engine_vocab_rows} is smaller than "
                f"model.vocab_size {self.vocab_size}"
            )
        self.engine = None
        if self.is_owner:
            kwargs = dict(
                model_path=self.model_path,
                tp_size=self.engine_tp,
                mem_fraction_static=rollout.mem_fraction_static,
                enable_memory_saver=True,
                skip_tokenizer_init=True,
                random_seed=self.seed,
                dtype="bfloat16" if cfg.training.bf16 else "float32",
                # Without it SGLang ignores every request's sampling_seed (config/rl.py).
                enable_deterministic_inference=self.deterministic,
            )
            if load_format is not None:
                kwargs["load_format"] = load_format
            if self.weight_sync == "distributed" and rollout.engine_base_gpu is not None:
                kwargs["base_gpu_id"] = rollout.engine_base_gpu  # GPUs apart from training's
            elif torch.cuda.is_available():  # the engine's GPUs start at its owner rank's own GPU
                kwargs["base_gpu_id"] = torch.cuda.current_device()
            self.engine_base_gpu = kwargs.get("base_gpu_id")
            kwargs.update(engine_kwargs)
            with trainer_process_state_kept():
                self.engine = backend.engine_cls(**kwargs)
        if colocated:
            self.sleep()

    def _place(self, cfg, ranks_per_engine: int | None) -> None:
        """One engine per block of `ranks_per_engine` consecutive ranks (default: one for the job),
        owned by the block's first rank; e.g. LOCAL_WORLD_SIZE for one engine per node."""
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        block = world if ranks_per_engine is None else ranks_per_engine
        p = cfg.parallel
        replica_span = p.tensor_model_parallel_size * p.context_parallel_size
        if block < world and (world % block or block % replica_span or p.pipeline_model_parallel_size > 1):
            raise ValueError(
                f"ranks_per_engine={block} must divide the world size ({world}), be a multiple of TP x CP "
                f"({replica_span}) and needs PP=1 (got {p.pipeline_model_parallel_size}): every engine must "
                "serve whole data-parallel replicas"
            )
        self.owner_ranks = list(range(0, world, block))
        self.owner_rank = (rank // block) * block
        self.group = None
        if 1 < block < world:
            # Object collectives only: gloo works for them whatever the training backend is.
            for owner in self.owner_ranks:  # new_group is collective: every rank creates every group
                group = dist.new_group(list(range(owner, owner + block)), backend="gloo")
                if owner == self.owner_rank:
                    self.group = group
        self._block = block

    @property
    def is_owner(self) -> bool:
        return not dist.is_initialized() or dist.get_rank() == self.owner_rank

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: list[Sample] | list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """Collective: every rank passes its data-parallel replica's prompts and gets that replica's samples.

        The owner generates the prompts of all replicas in one call (one engine serves them all).
        """
        samples = as_samples(prompts)
        replica, leader = _replica()
        request = (replica, [s.prompt_ids for s in samples] if leader else None, sampling)
        distributed = self._block > 1
        requests = [request]
        if distributed:
            requests = [None] * self._block if self.is_owner else None
            dist.gather_object(request, requests, dst=self.owner_rank, group=self.group)
        per_rank = None
        if self.is_owner:
            by_replica = {}
            for rep, ids, params in requests:
                if ids is not None:
                    by_replica[rep] = self._generate_ids(ids, params, rep)
            per_rank = [by_replica[rep] for rep, _, _ in requests]
        if distributed:
            box = [None]
            dist.scatter_object_list(box, per_rank, src=self.owner_rank, group=self.group)
            results = box[0]
        else:
            results = per_rank[0]
        if len(results) != len(samples):
            raise RuntimeError(
                f"rank got {len(results)} results for {len(samples)} prompts: the ranks of one data-parallel "
                "replica must pass the same prompts"
            )
        for sample, (ids, logprobs, reason) in zip(samples, results):
            finish_sample(sample, ids, logprobs, reason, self.tokenizer)
        return samples

    def _generate_ids(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, replica: int = 0
    ) -> list[tuple]:
        if not prompt_ids:
            return []
        if "weights" in self.released:
            raise RuntimeError(
                f"{self.name}: generate() while the engine sleeps: wake() and sync weights first"
            )
        if self.released:  # kv_cache and cuda_graph come back after the weights were written (slime's order)
            # The sync's payloads are freed first (slime does the same): the engine has dropped its
            # handles, and the KV cache wants their memory back.
            free_transfer_buffers()
            self._resume([t for t in MEMORY_TAGS if t in self.released])
        outputs = self.engine.generate(
            input_ids=prompt_ids,
            sampling_params=self._sampling_params(sampling, len(prompt_ids), replica),
            return_logprob=True,
        )
        return [_parse_output(out) for out in outputs]

    def _sampling_params(self, sampling: SamplingParams, n: int, replica: int = 0) -> list[dict]:
        params = sampling.to_sglang()
        if self.engine_vocab_rows > self.vocab_size:
            params["logit_bias"] = {
                str(t): PADDING_BIAS for t in range(self.vocab_size, self.engine_vocab_rows)
            }
        out = []
        for i in range(n):
            p = dict(params)
            if sampling.seed is not None:
                p["sampling_seed"] = request_seed(sampling.seed, replica, i)
            out.append(p)
        return out

    # ------------------------------------------------------------------ weights

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None
    ) -> None:
        """Owner only: push full HF-named tensors in flattened buckets (0 = one call per tensor)."""
        if not self.is_owner:
            raise RuntimeError(f"update_weights runs on the engine's owner rank {self.owner_rank}")
        if "weights" in self.released:
            raise RuntimeError(
                f"{self.name}: update_weights() while the weights are released: call wake() first"
            )
        bucket_bytes = self.bucket_bytes if bucket_bytes is None else bucket_bytes
        start = time.perf_counter()
        stats = {"bytes": 0, "tensors": 0, "calls": 0}
        self.backend.patch_reductions()  # before the first CUDA tensor is pickled (idempotent)
        # sglang 0.5.23 loads weights only inside a weight-update session; 0.5.15.post1 has none.
        session = hasattr(self.engine, "begin_weight_update")
        if session:
            _check_result(self.engine.begin_weight_update(), ["begin_weight_update"])
        try:
            if bucket_bytes <= 0:
                for name, tensor in named_tensors:
                    self._push([(name, tensor)], None, stats)
            else:
                for bucket in bucketize(named_tensors, bucket_bytes):
                    self._push(bucket, "flattened_bucket", stats)
        finally:  # a refused push must not leave the session open for the next sync
            ended = self.engine.end_weight_update() if session else None
        if session:
            _check_result(ended, ["end_weight_update"])
        self.engine.flush_cache()
        stats["seconds"] = time.perf_counter() - start
        self.last_sync = stats

    def join_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        """Owner only: the engine's GPUs join a weight-update group (blocks until every rank joined)."""
        result = self.engine.init_weights_update_group(
            master_address=master_address, master_port=master_port, rank_offset=rank_offset,
            world_size=world_size, group_name=group_name, backend=backend,
        )  # fmt: skip
        _check_result(result, [group_name], what="init_weights_update_group")

    def update_weights_from_distributed(self, buckets: Iterable[tuple[str, list, list, list]]) -> dict:
        """Owner only: for each (group_name, names, dtypes, shapes) the engine receives one flattened
        bucket broadcast by group rank 0 (the caller's sources broadcast meanwhile). One session,
        one flush at the end, as update_weights."""
        if not self.is_owner:
            raise RuntimeError(
                f"update_weights_from_distributed runs on the engine's owner rank {self.owner_rank}"
            )
        start = time.perf_counter()
        stats = {"bytes": 0, "tensors": 0, "calls": 0}
        session = hasattr(self.engine, "begin_weight_update")
        if session:
            _check_result(self.engine.begin_weight_update(), ["begin_weight_update"])
        refused = None
        try:
            for group_name, names, dtypes, shapes in buckets:
                result = self.engine.update_weights_from_distributed(
                    names=names, dtypes=dtypes, shapes=shapes, group_name=group_name,
                    flush_cache=False, load_format="flattened_bucket",
                )  # fmt: skip
                # SGLang receives a bucket before it loads it: after a refused load the next buckets
                # are still taken off the wire, so the sources never wait on a broadcast nobody
                # receives; the first refusal is raised once the stream is over.
                try:
                    _check_result(result, names, what="update_weights_from_distributed")
                except RuntimeError as exc:
                    refused = refused or exc
                stats["bytes"] += sum(
                    torch.Size(shape).numel() * getattr(torch, dtype).itemsize
                    for dtype, shape in zip(dtypes, shapes)
                )
                stats["tensors"] += len(names)
                stats["calls"] += 1
        finally:  # a refused bucket must not leave the session open for the next sync
            ended = self.engine.end_weight_update() if session else None
        if refused is not None:
            raise refused
        if session:
            _check_result(ended, ["end_weight_update"])
        self.engine.flush_cache()
        stats["seconds"] = time.perf_counter() - start
        self.last_sync = stats
        return dict(stats)

    def _push(self, named: list[tuple[str, torch.Tensor]], load_format: str | None, stats: dict) -> None:
        if load_format == "flattened_bucket":
            bucket = self.backend.bucket_cls(named_tensors=named)
            flat, metadata = bucket.get_flattened_tensor(), bucket.get_metadata()
            # One payload per engine TP rank, each on that rank's own GPU: each rank deserialises only
            # its own (sglang 0.5.23 Engine._serialize_tensors_per_rank), and SGLang's weight loader
            # reads it where it lies, so a payload on the owner's GPU would make every engine rank
            # open a CUDA context there and read across GPUs. One copy per GPU, one bucket each.
            serialized = [
                self.backend.serializer.serialize(
                    {"flattened_tensor": flat.to(self.engine_device(k, flat.device)), "metadata": metadata},
                    output_str=True,
                )
                for k in range(self.engine_tp)
            ]
            result = self.engine.update_weights_from_tensor(
                named_tensors=serialized, load_format=load_format, flush_cache=False
            )
        else:
            result = self.engine.update_weights_from_tensor(
                named_tensors=named, load_format=load_format, flush_cache=False
            )
        _check_result(result, [n for n, _ in named])
        stats["bytes"] += sum(t.numel() * t.element_size() for _, t in named)
        stats["tensors"] += len(named)
        stats["calls"] += 1

    def engine_device(self, tp_rank: int, default: torch.device) -> torch.device:
        """The device engine TP rank `tp_rank` computes on (SGLang: base_gpu_id + tp_rank, gpu_id_step
        1); `default` (where the bucket was packed) when the engine has no GPU."""
        if self.engine_base_gpu is None or default.type != "cuda":
            return default
        return torch.device("cuda", self.engine_base_gpu + tp_rank)

    # ------------------------------------------------------------------ memory

    def sleep(self) -> None:
        """Collective over the engine's ranks: release all of the engine's memory and return once it is
        back, so nothing the caller allocates next races the release."""
        if self.weight_sync == "distributed":
            return  # on GPUs of its own: nothing to give back to training
        resident = [t for t in MEMORY_TAGS if t not in self.released]
        if self.is_owner and resident:
            self._wait_idle()
            # Only what is resident: a tag is never paused twice in the memory saver.
            self.engine.release_memory_occupation(tags=resident)
            self.released = set(MEMORY_TAGS)
        self.weights_version = None  # released on every rank: the next wake needs a sync
        if torch.cuda.is_available():
            # SGLang's scheduler synchronizes before it answers, yet slime and miles found the memory
            # may come back later (sglang 0.5.x): each rank waits on its own GPU (the engine's GPUs are
            # its block's GPUs), then the block agrees before anyone allocates.
            wait_until_settled(lambda: torch.cuda.mem_get_info()[0])
        self._barrier()

    def wake(self) -> None:
        """Collective: empty every rank's CUDA cache, then resume the weights only (the sync writes them;
        kv_cache and cuda_graph follow on the first generate)."""
        if self.weight_sync == "distributed":
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self._barrier()
        if self.is_owner and "weights" in self.released:
            self._resume(["weights"])

    def _resume(self, tags: list[str]) -> None:
        self.engine.resume_memory_occupation(tags=tags)
        self.released -= set(tags)

    def _wait_idle(self) -> None:
        """slime calls flush_cache until it succeeds before a release: SGLang flushes only an idle
        scheduler, and release_memory_occupation asserts idleness (sglang 0.5.23)."""
        for _ in range(FLUSH_ATTEMPTS):
            if getattr(self.engine.flush_cache(), "success", True):
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"{self.name}: the engine stayed busy through {FLUSH_ATTEMPTS} flush_cache tries; cannot release"
        )

    def _barrier(self) -> None:
        if dist.is_initialized() and self._block > 1:
            dist.barrier(group=self.group)

    def shutdown(self) -> None:
        if self.update_groups is not None:  # both ends of the weight-update groups
            if self.engine is not None:
                for key in sorted(self.update_groups.sources):
                    self.engine.destroy_weights_update_group(group_name=self.update_groups.group_name(key))
            if self.update_groups.group is not None:
                dist.destroy_process_group(self.update_groups.group)
            self.update_groups = None
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None


REQUESTS_PER_CALL = 1 << 20
"""Most requests of one replica in one generate call with distinct seeds (request_seed)."""
MAX_REPLICAS = 1 << 11
"""Most data-parallel replicas one engine serves with distinct seeds (request_seed)."""


def request_seed(seed: int, replica: int, index: int) -> int:
    """SGLang's per-request sampling_seed for request `index` of `replica`'s call seeded `seed`.

    The engine serves every replica's requests at once, so the seeds must differ across replicas as
    well as within a call: replica (11 bits) and index (20 bits) take the high bits, the call's seed
    the low 32, so two requests of one call never share a seed. The result fits SGLang's int64.
    """
    if not 0 <= index < REQUESTS_PER_CALL or not 0 <= replica < MAX_REPLICAS:
        raise ValueError(
            f"request {index} of replica {replica}: one engine seeds at most {MAX_REPLICAS} replicas of "
            f"{REQUESTS_PER_CALL} requests per call (lower rl.rollout.batch_size or ranks_per_engine)"
        )
    return (replica << 52) | (index << 32) | (seed & 0xFFFFFFFF)


def free_transfer_buffers() -> None:
    """Free the memory of weight payloads the engine has let go of (CUDA IPC) and return the
    allocator's cached blocks to the device; nothing on CPU."""
    if torch.cuda.is_available():
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


def wait_until_settled(
    read_free: Callable[[], int],
    interval: float = 0.05,
    settle_reads: int = 3,
    timeout: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll free device memory until `settle_reads` readings in a row no longer rise; returns the last.

    A release that returns before the pages are back shows as free memory still rising. On timeout a
    warning names the numbers (a neighbour process may be allocating) and the caller goes on.
    """
    last, steady, waited = read_free(), 0, 0.0
    while steady < settle_reads:
        if waited >= timeout:
            warnings.warn(
                f"free GPU memory still changing after {timeout:.0f}s ({last} bytes free); going on",
                stacklevel=2,
            )
            break
        sleep(interval)
        waited += interval
        now = read_free()
        steady = steady + 1 if now <= last else 0
        last = max(now, last)
    return last


def bucketize(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterable[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of one dtype and at most `bucket_bytes` (a larger tensor
    goes alone). Lazy: at most one pending bucket per dtype is held."""
    pending: dict[torch.dtype, list] = {}
    sizes: dict[torch.dtype, int] = {}
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        dtype = tensor.dtype
        if pending.get(dtype) and sizes[dtype] + nbytes > bucket_bytes:
            yield pending.pop(dtype)
            sizes[dtype] = 0
        pending.setdefault(dtype, []).append((name, tensor))
        sizes[dtype] = sizes.get(dtype, 0) + nbytes
    yield from (bucket for bucket in pending.values() if bucket)


def _replica() -> tuple[int, bool]:
    """(data-parallel replica index, whether this rank speaks for it: TP rank 0 of the first stage)."""
    if not dist.is_initialized():
        return 0, True
    try:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            leader = (
                parallel_state.get_tensor_model_parallel_rank() == 0
                and parallel_state.get_pipeline_model_parallel_rank() == 0
                and parallel_state.get_context_parallel_rank() == 0
            )
            return parallel_state.get_data_parallel_rank(), leader
    except ImportError:
        pass
    return dist.get_rank(), True


def _parse_output(out: dict) -> tuple[list[int], list[float], str]:
    """One sglang.Engine.generate output -> (output ids, per-token log-probs, 'stop'|'length'|'abort')."""
    meta = out["meta_info"]
    ids = [int(t) for t in out["output_ids"]]
    logprobs = [float(lp) for lp, _token, *_ in meta["output_token_logprobs"]]
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type", "abort") if isinstance(reason, dict) else str(reason)
    return ids, logprobs, kind if kind in ("stop", "length") else "abort"


def _check_result(result: Any, names: list[str], what: str = "weight update") -> None:
    """SGLang's weight calls return (success, message) (newer releases: an object or dict)."""
    if isinstance(result, tuple):
        ok, message = result[0], result[1] if len(result) > 1 else ""
    elif isinstance(result, dict):
        ok, message = result.get("success", True), result.get("message", "")
    else:
        ok, message = getattr(result, "success", True), getattr(result, "message", "")
    if not ok:
        raise RuntimeError(f"SGLang refused the {what} ({names[:3]}...): {message}")


def write_config_dir(cfg, out_dir: str | os.PathLike) -> str:
    """A config-only HF Qwen2 directory for cfg.model (engine starts with load_format='dummy')."""
    dtype = torch.bfloat16 if cfg.training.bf16 else torch.float32
    hf = hf_config_from_model(cfg.model, None, cfg.model.vocab_size, dtype)
    hf["rope_theta"] = cfg.model.rotary_base  # transformers 4.x (what SGLang pins) reads this key
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    return str(path)


@register_engine("sglang")
def _build_sglang(cfg, model=None, tokenizer=None, **kwargs) -> SGLangEngine:
    return SGLangEngine(cfg, sglang_backend(), tokenizer=tokenizer, name="sglang", **kwargs)
