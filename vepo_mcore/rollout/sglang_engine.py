"""The colocated SGLang rollout engine (GPU path), and the same code driving the CPU fake in tests.

    engine = build_engine(cfg)            # rl.rollout.engine: sglang | fake_sglang
    engine.wake(); sync_weights(engine, model, cfg); samples = engine.generate(prompts, sampling)
    engine.sleep()                        # give the GPU memory back to training

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

Log-probs: SGLang reports log softmax(logits / temperature) unless SGLANG_RETURN_ORIGINAL_LOGPROB
is set, which must stay unset (VEPO needs the tempered policy). When the engine's vocabulary has
more rows than the real vocabulary, a logit_bias of -1e9 hides the padding ids, as training does.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vepo_mcore.rollout.base import SamplingParams, as_samples, finish_sample, register_engine
from vepo_mcore.translation.sample import Sample

PADDING_BIAS = -1e9


@dataclass(frozen=True)
class SGLangBackend:
    """Where the engine class and the weight-transfer helpers come from (real sglang or the fake)."""

    engine_cls: Callable[..., Any]
    bucket_cls: type
    serializer: type
    fake: bool = False


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
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket
    except ImportError:  # older releases kept it in the model runner
        from sglang.srt.model_executor.model_runner import FlattenedTensorBucket
    return SGLangBackend(sglang.Engine, FlattenedTensorBucket, MultiprocessingSerializer)


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
        **engine_kwargs: Any,
    ):
        rollout = cfg.rl.rollout
        self.name = name
        self.backend = backend
        self.tokenizer = tokenizer
        self._place(cfg, ranks_per_engine if ranks_per_engine is not None else rollout.ranks_per_engine)
        self.vocab_size = cfg.model.vocab_size
        self.engine_tp = rollout.engine_tp
        self.bucket_bytes = rollout.weight_bucket_mb << 20
        self.seed = cfg.training.seed
        self.last_sync: dict[str, float] = {}
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
            )
            if load_format is not None:
                kwargs["load_format"] = load_format
            if torch.cuda.is_available():  # the engine's GPUs start at its owner rank's own GPU
                kwargs["base_gpu_id"] = torch.cuda.current_device()
            kwargs.update(engine_kwargs)
            self.engine = backend.engine_cls(**kwargs)

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
                    by_replica[rep] = self._generate_ids(ids, params)
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

    def _generate_ids(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[tuple]:
        if not prompt_ids:
            return []
        outputs = self.engine.generate(
            input_ids=prompt_ids,
            sampling_params=self._sampling_params(sampling, len(prompt_ids)),
            return_logprob=True,
        )
        return [_parse_output(out) for out in outputs]

    def _sampling_params(self, sampling: SamplingParams, n: int) -> list[dict]:
        params = sampling.to_sglang()
        if self.engine_vocab_rows > self.vocab_size:
            params["logit_bias"] = {
                str(t): PADDING_BIAS for t in range(self.vocab_size, self.engine_vocab_rows)
            }
        out = []
        for i in range(n):
            p = dict(params)
            if sampling.seed is not None:
                p["sampling_seed"] = sampling.seed + i
            out.append(p)
        return out

    # ------------------------------------------------------------------ weights

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None
    ) -> None:
        """Owner only: push full HF-named tensors in flattened buckets (0 = one call per tensor)."""
        if not self.is_owner:
            raise RuntimeError(f"update_weights runs on the engine's owner rank {self.owner_rank}")
        bucket_bytes = self.bucket_bytes if bucket_bytes is None else bucket_bytes
        start = time.perf_counter()
        stats = {"bytes": 0, "tensors": 0, "calls": 0}
        if bucket_bytes <= 0:
            for name, tensor in named_tensors:
                self._push([(name, tensor)], None, stats)
        else:
            for bucket in bucketize(named_tensors, bucket_bytes):
                self._push(bucket, "flattened_bucket", stats)
        self.engine.flush_cache()
        stats["seconds"] = time.perf_counter() - start
        self.last_sync = stats

    def _push(self, named: list[tuple[str, torch.Tensor]], load_format: str | None, stats: dict) -> None:
        if load_format == "flattened_bucket":
            bucket = self.backend.bucket_cls(named_tensors=named)
            payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
            serialized = self.backend.serializer.serialize(payload, output_str=True)
            result = self.engine.update_weights_from_tensor(
                named_tensors=[serialized] * self.engine_tp, load_format=load_format, flush_cache=False
            )
        else:
            result = self.engine.update_weights_from_tensor(
                named_tensors=named, load_format=load_format, flush_cache=False
            )
        _check_result(result, [n for n, _ in named])
        stats["bytes"] += sum(t.numel() * t.element_size() for _, t in named)
        stats["tensors"] += len(named)
        stats["calls"] += 1

    # ------------------------------------------------------------------ memory

    def sleep(self) -> None:
        if self.is_owner:
            self.engine.release_memory_occupation()

    def wake(self) -> None:
        if self.is_owner:
            self.engine.resume_memory_occupation()

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None


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


def _check_result(result: Any, names: list[str]) -> None:
    """update_weights_from_tensor returns (success, message) (newer releases: an object or dict)."""
    if isinstance(result, tuple):
        ok, message = result[0], result[1] if len(result) > 1 else ""
    elif isinstance(result, dict):
        ok, message = result.get("success", True), result.get("message", "")
    else:
        ok, message = getattr(result, "success", True), getattr(result, "message", "")
    if not ok:
        raise RuntimeError(f"update_weights_from_tensor failed for {names[:3]}...: {message}")


def write_config_dir(cfg, out_dir: str | os.PathLike) -> str:
    """A config-only HF Qwen2 directory for cfg.model (engine starts with load_format='dummy')."""
    from vepo_mcore.checkpoint.hf import hf_config_from_model

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
