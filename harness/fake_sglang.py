"""A CPU test double of `sglang.Engine` that refuses what the pinned SGLang refuses, transformers inside.

SGLang needs CUDA, so the SGLang backend (vepo_mcore/rollout/sglang_engine.py) is tested against this
double: importing this module registers the rollout engine 'fake_sglang', the package's own
SGLangEngine over the fake's backend (tests and benchmarks/weight_sync.py import it; the package does
not ship it). It mirrors
the offline API of sglang 0.5.23 (python/sglang/srt/entrypoints/engine.py; SGLANG_VERSION below), the
version setup.py's gpu extra and docker/Dockerfile pin; tests/unit/test_sglang_contract.py checks its
signatures, server arguments and sampling keys against tests/data/sglang_signatures.json, recorded
from that version's wheel. `fake_backend("0.5.15.post1")` gives the older API (no weight-update
session). What it enforces, each as the pinned source does:

  * Engine(**server_args): only ServerArgs fields, of their declared types (TypeError otherwise).
  * generate(...): only Engine.generate's parameters; sampling_params keys must be SamplingParams
    fields. `sampling_seed` takes effect only with enable_deterministic_inference=True (SGLang's
    SamplingBatchInfo builds the seed tensor only then); otherwise the engine's own random stream.
  * release_memory_occupation(tags) / resume_memory_occupation(tags): tags from kv_cache, weights,
    cuda_graph (None = all). Resuming a tag that is not released raises KeyError(tag), as the
    scheduler's `offload_tags.remove(tag)` does (scheduler_components/weight_updater.py), where the
    scheduler process dies of it. Released weights are lost (memory saver without CPU backup).
  * update_weights_from_tensor: 0.5.23 refuses it outside begin_weight_update()/end_weight_update()
    (success False, the scheduler's message); flattened_bucket takes one serialized payload per
    engine TP rank, each rank deserializing only its own (a payload shared by two ranks fails here,
    as a second deserialisation of one CUDA-IPC handle does there).
  * init_weights_update_group / update_weights_from_distributed / destroy_weights_update_group: the
    engine's GPUs are stood in for by `tp_size` scheduler processes (spawned on the first
    init_weights_update_group, each with a default gloo group of the engine's ranks, as SGLang's
    schedulers have). Each joins the named group at rank rank_offset + tp_rank through the same TCP
    rendezvous as sglang.srt.utils.init_custom_process_group, and receives every update as
    `broadcast(src=0)` in it: flattened_bucket = one uint8 buffer allocated from (names, dtypes,
    shapes) by FlattenedTensorBucket.empty; otherwise one broadcast per tensor. The received tensors
    come back to this object's model. Refusals carry the scheduler's messages: outside a session,
    a group never initialised ("Group ... not in [...]. Please call `init_weights_update_group`
    first."), a bad dtype name, a shape the parameter does not have ("Attempted to load weight ...").
    Stricter than SGLang: a name the model does not have is refused (SGLang's Qwen2 load_weights skips
    it silently, so a misnamed weight would never load there); a sender that broadcasts more bytes
    than announced crashes the gloo receive, as the scheduler would die or hang on NCCL.

    out = engine.generate(input_ids=[[...], ...], sampling_params={...}, return_logprob=True)
    out[i] == {"output_ids": [...], "meta_info": {"id", "finish_reason": {"type": "stop",
               "matched": id} | {"type": "length", "length": n}, "prompt_tokens", "completion_tokens",
               "cached_tokens", "output_token_logprobs": [(logprob, token_id, None), ...]}}

  * construction configures the calling process as 0.5.23's does (configure_process_as_sglang):
    NCCL and CUDA environment variables, the root logger forced to ERROR, the spawn start method.

plus `FlattenedTensorBucket` / `FlattenedTensorMetadata` (sglang.srt.weight_sync.tensor_bucket) and
`MultiprocessingSerializer` (sglang.srt.utils; in-process handles standing in for CUDA IPC) with the
same constructors and methods. Generation runs `transformers.Qwen2ForCausalLM` on the weights
received (fp32 on CPU). Like SGLang without `SGLANG_RETURN_ORIGINAL_LOGPROB`, the log-probs are
log softmax(logits / temperature) (greedy: log softmax(logits)). `calls` records every API call in
order; `bytes_received` and `update_calls` count what arrives (benchmarks/weight_sync.py).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vepo_mcore.rollout.base import register_engine
from vepo_mcore.rollout.sglang_engine import SGLangBackend, SGLangEngine


@dataclass
class FlattenedTensorMetadata:
    """Where one tensor lives inside a flattened bucket."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


class FlattenedTensorBucket:
    """Named tensors packed byte by byte into one 1-D uint8 tensor, plus the metadata to unpack them
    (sglang 0.5.23 weight_sync/tensor_bucket.py: multi-dtype, offsets and sizes in bytes)."""

    supports_multi_dtypes = True

    def __init__(
        self,
        named_tensors: list[tuple[str, torch.Tensor]] | None = None,
        flattened_tensor: torch.Tensor | None = None,
        metadata: list[FlattenedTensorMetadata] | None = None,
    ):
        if named_tensors is not None:
            if not named_tensors:
                raise ValueError("Cannot create empty tensor bucket")
            self.metadata, start, parts = [], 0, []
            for name, tensor in named_tensors:
                flat = tensor.flatten().view(torch.uint8)
                n = flat.numel()
                self.metadata.append(
                    FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, start, start + n, n)
                )
                parts.append(flat)
                start += n
            self.flattened_tensor = torch.cat(parts)
        else:
            if flattened_tensor is None or metadata is None:
                raise ValueError("Must provide either named_tensors or both flattened_tensor and metadata")
            self.flattened_tensor, self.metadata = flattened_tensor, metadata

    @classmethod
    def empty(cls, names, dtypes, shapes, device) -> FlattenedTensorBucket:
        """A receive bucket for (names, dtypes, shapes), as 0.5.23 allocates before the broadcast."""
        metadata, offset = [], 0
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
            shape = torch.Size(shape)
            if any(dim < 0 for dim in shape):
                raise ValueError(f"Negative dimension in received tensor {name}: {shape}")
            if offset % dtype.itemsize:
                raise ValueError(f"Unaligned received tensor {name}: byte offset {offset}, dtype {dtype}")
            size = shape.numel() * dtype.itemsize
            metadata.append(FlattenedTensorMetadata(name, shape, dtype, offset, offset + size, size))
            offset += size
        if not metadata:
            raise ValueError("Cannot create empty tensor bucket")
        return cls(flattened_tensor=torch.empty(offset, dtype=torch.uint8, device=device), metadata=metadata)

    def get_flattened_tensor(self) -> torch.Tensor:
        return self.flattened_tensor

    def get_metadata(self) -> list[FlattenedTensorMetadata]:
        return self.metadata

    def reconstruct_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [
            (m.name, self.flattened_tensor[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape))
            for m in self.metadata
        ]


class MultiprocessingSerializer:
    """serialize(obj, output_str) / deserialize(data), as sglang.srt.utils has.

    SGLang pickles CUDA tensors as IPC handles: the engine maps the sender's memory, no copy. The
    fake's engine lives in the same process, so a handle is a key into a table of live objects.
    """

    _live: dict[str, Any] = {}
    reductions_patched = False

    @classmethod
    def serialize(cls, obj: Any, output_str: bool = False) -> bytes | str:
        key = uuid.uuid4().hex
        cls._live[key] = obj
        return key if output_str else key.encode()

    @classmethod
    def deserialize(cls, data: bytes | str) -> Any:
        key = data.decode() if isinstance(data, bytes) else data
        if key not in cls._live:
            raise ValueError(f"unknown or already consumed serialized handle {key!r}")
        return cls._live.pop(key)


@dataclass
class FlushCacheReqOutput:
    success: bool = True
    message: str = ""


SGLANG_VERSION = "0.5.23"
"""The sglang release the fake mirrors by default: the one setup.py's gpu extra and the image pin."""

MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
"""sglang.srt.constants.GPU_MEMORY_ALL_TYPES (0.5.15.post1 and 0.5.23): what tags=None means."""

SERVER_ARGS: dict[str, tuple[type, ...]] = {
    "model_path": (str,),
    "tp_size": (int,),
    "mem_fraction_static": (float, type(None)),
    "enable_memory_saver": (bool,),
    "skip_tokenizer_init": (bool,),
    "random_seed": (int, type(None)),
    "dtype": (str,),
    "load_format": (str,),
    "base_gpu_id": (int,),
    "enable_deterministic_inference": (bool,),
    "attention_backend": (str, type(None)),
    "disable_cuda_graph": (bool,),
    "log_level": (str,),
}
"""The ServerArgs fields the project passes to Engine(...), with their declared types (ServerArgs has
hundreds; the fake refuses the others rather than pretend to honour them)."""

SAMPLING_KEYS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "watermark",
)  # fmt: skip
"""The caller-facing fields of sglang 0.5.23's SamplingParams (sampling/sampling_params.py); a dict
with any other key fails there when the request is built."""

GENERATE_EXTRA = (
    "image_data", "audio_data", "video_data", "mm_hashes", "mm_content_hashes", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "lora_path", "custom_logit_processor", "require_reasoning",
    "return_hidden_states", "return_routed_experts", "routed_experts_start_len", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "routed_dp_rank", "disagg_prefill_dp_rank", "kv_hints",
    "data_parallel_rank", "external_trace_header", "rid", "session_params", "priority", "session_id",
    "cache_salt",
)  # fmt: skip
"""The rest of sglang 0.5.23's Engine.generate parameters: accepted by name, not faked (a value other
than the default raises NotImplementedError)."""

DETERMINISTIC_ATTENTION_BACKENDS = ("ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton")
"""sglang 0.5.23 DETERMINISTIC_ATTENTION_BACKEND_CHOICES (arg_groups/choices.py)."""

_SESSION_MESSAGE = "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"


class FakeSGLangEngine:
    """sglang.Engine's offline API (0.5.23) on CPU, backed by transformers' Qwen2ForCausalLM."""

    sglang_version = SGLANG_VERSION
    weight_update_session = True
    """0.5.23: weights load only inside begin_weight_update() ... end_weight_update()."""

    def __init__(self, **server_args: Any):
        from transformers import Qwen2Config, Qwen2ForCausalLM

        for name, value in server_args.items():
            if name not in SERVER_ARGS:
                raise TypeError(f"ServerArgs.__init__() got an unexpected keyword argument {name!r}")
            types = SERVER_ARGS[name]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise TypeError(
                    f"ServerArgs.{name} must be {' | '.join(t.__name__ for t in types)}, got {value!r}"
                )
        backend = server_args.get("attention_backend")
        if server_args.get("enable_deterministic_inference") and backend not in (
            None,
            *DETERMINISTIC_ATTENTION_BACKENDS,
        ):
            # sglang 0.5.23 arg_groups/overrides.py: deterministic inference needs batch-invariant kernels.
            raise ValueError(
                f"Currently only {list(DETERMINISTIC_ATTENTION_BACKENDS)} attention backends are supported for "
                f"deterministic inference, but you explicitly specified '{backend}'."
            )
        if "model_path" not in server_args:
            raise TypeError("ServerArgs.__init__() missing 1 required argument: 'model_path'")
        self.server_args = dict(server_args)
        self.calls: list[tuple[str, dict]] = [("__init__", dict(server_args))]
        configure_process_as_sglang(server_args)
        model_path = server_args["model_path"]
        if not (Path(model_path) / "config.json").is_file():
            raise FileNotFoundError(f"model_path {model_path} has no config.json")
        self.tp_size = server_args.get("tp_size", 1)
        self.enable_memory_saver = server_args.get("enable_memory_saver", False)
        self.skip_tokenizer_init = server_args.get("skip_tokenizer_init", False)
        self.deterministic = server_args.get("enable_deterministic_inference", False)
        seed = server_args.get("random_seed")
        self.random_seed = 0 if seed is None else seed
        self._stream = torch.Generator().manual_seed(self.random_seed)  # the engine's own sampling stream
        config = Qwen2Config.from_pretrained(model_path)
        if server_args.get("load_format") == "dummy" or not any(Path(model_path).glob("*.safetensors")):
            torch.manual_seed(self.random_seed)
            self.model = Qwen2ForCausalLM(config)
        else:
            self.model = Qwen2ForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model = self.model.float().eval()
        self.vocab_rows = config.vocab_size
        self.eos_token_ids = _as_list(getattr(config, "eos_token_id", None))
        self.offload_tags: set[str] = set()
        self.weights_stale = False
        self.session_open = False
        self.bytes_received = 0
        self.update_calls = 0
        self.flush_calls = 0
        self._requests = 0
        self._alive = True
        self._schedulers: list = []  # (process, connection) per engine TP rank, once a group is asked for

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompt: list[str] | str | None = None,
        sampling_params: list[dict] | dict | None = None,
        input_ids: list[list[int]] | list[int] | None = None,
        return_logprob: list[bool] | bool | None = False,
        stream: bool = False,
        **other: Any,
    ) -> list[dict] | dict:
        for name, value in other.items():
            if name not in GENERATE_EXTRA:
                raise TypeError(f"Engine.generate() got an unexpected keyword argument {name!r}")
            if value not in (None, False, 0):
                raise NotImplementedError(f"the fake engine does not fake generate({name}=...)")
        self._log(
            "generate", input_ids=input_ids, sampling_params=sampling_params, return_logprob=return_logprob
        )
        self._check_usable("generate")
        if prompt is not None:
            raise NotImplementedError(
                "the fake engine takes input_ids (the backend runs skip_tokenizer_init)"
            )
        if input_ids is None:
            raise ValueError("generate needs input_ids")
        if stream:
            raise NotImplementedError("streaming is not faked")
        single = bool(input_ids) and isinstance(input_ids[0], int)
        batch = [input_ids] if single else list(input_ids)
        params = (
            sampling_params if isinstance(sampling_params, list) else [sampling_params or {}] * len(batch)
        )
        if len(params) != len(batch):
            raise ValueError(f"{len(params)} sampling_params for {len(batch)} requests")
        for p in params:
            _check_sampling_params(p)
        outs = [self._generate_one(ids, p, bool(return_logprob)) for ids, p in zip(batch, params)]
        return outs[0] if single else outs

    def _generate_one(self, ids: list[int], params: dict, return_logprob: bool) -> dict:
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1))
        max_new = int(params.get("max_new_tokens", 128))
        stops = set(_as_list(params.get("stop_token_ids")))
        if not params.get("ignore_eos", False):
            stops |= set(self.eos_token_ids)
        bias = params.get("logit_bias") or {}
        self._requests += 1
        # SGLang (0.5.15.post1, 0.5.23 SamplingBatchInfo.from_schedule_batch) builds the per-request
        # seed tensor only under enable_deterministic_inference; otherwise sampling_seed is ignored.
        if self.deterministic:
            generator = torch.Generator().manual_seed(int(params.get("sampling_seed", 42)))
        else:
            generator = self._stream
        from vepo_mcore.rollout.base import filter_logits

        output_ids, logprobs, finish = [], [], {"type": "length", "length": max_new}
        past = None
        step_ids = torch.tensor([ids])
        with torch.no_grad():
            for _ in range(max_new):
                out = self.model(input_ids=step_ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                z = out.logits[0, -1].float()
                for token, value in bias.items():
                    z[int(token)] += float(value)
                if temperature == 0:
                    token = int(torch.argmax(z))
                    logp = torch.log_softmax(z, -1)
                else:
                    logp = torch.log_softmax(z / temperature, -1)
                    probs = torch.softmax(filter_logits((z / temperature)[None], top_k, top_p), -1)
                    token = int(torch.multinomial(probs, 1, generator=generator))
                output_ids.append(token)
                logprobs.append((float(logp[token]), token, None))
                if token in stops:
                    finish = {"type": "stop", "matched": token}
                    break
                step_ids = torch.tensor([[token]])
        meta: dict[str, Any] = {
            "id": f"fake-{self._requests}",
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
        }
        if return_logprob:
            meta["input_token_logprobs"] = [(None, ids[-1], None)]
            meta["output_token_logprobs"] = logprobs
        if self.skip_tokenizer_init:  # SGLang's BatchTokenIDOut path: no text
            return {"output_ids": output_ids, "meta_info": meta}
        return {"text": "", "output_ids": output_ids, "meta_info": meta}

    # ------------------------------------------------------------------ weights

    def begin_weight_update(self, selector: str = "all") -> tuple[bool, str]:
        self._log("begin_weight_update", selector=selector)
        self._check_alive("begin_weight_update")
        if selector not in ("all", "target", "draft"):
            raise ValueError(f"invalid selector {selector!r}; expected 'target', 'draft', or 'all'")
        if self.session_open:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session_open = True
        return True, "Success"

    def end_weight_update(self) -> tuple[bool, str]:
        self._log("end_weight_update")
        self._check_alive("end_weight_update")
        if not self.session_open:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session_open = False
        return True, "Success"

    def update_weights_from_tensor(
        self, named_tensors: list, load_format: str | None = None, flush_cache: bool = True
    ) -> tuple[bool, str]:
        self._log(
            "update_weights_from_tensor",
            named_tensors=named_tensors,
            load_format=load_format,
            flush_cache=flush_cache,
        )
        self._check_alive("update_weights_from_tensor")
        if not isinstance(named_tensors, list):
            raise TypeError(f"named_tensors must be a list, got {type(named_tensors).__name__}")
        if load_format not in (None, "flattened_bucket"):
            raise NotImplementedError(f"Unknown load_format={load_format}")
        if self.weight_update_session and not self.session_open:
            return False, _SESSION_MESSAGE
        if "weights" in self.offload_tags:
            # On a GPU this writes into unmapped memory: resume the weights first.
            raise RuntimeError(
                "update_weights_from_tensor while the weights are released (resume_memory_occupation)"
            )
        if load_format == "flattened_bucket":
            if len(named_tensors) != self.tp_size:
                # Each TP rank indexes serialized_named_tensors[tp_rank] (tp_worker.py).
                raise IndexError(f"{len(named_tensors)} serialized payloads for tp_size={self.tp_size}")
            tensors = None
            for payload in named_tensors:  # every TP rank deserialises its own copy
                if not isinstance(payload, (str, bytes, bytearray, memoryview)):
                    raise TypeError(
                        "serialized_named_tensors entries must be base64 strings or bytes-like "
                        f"payloads, got {type(payload).__name__}"
                    )
                data = MultiprocessingSerializer.deserialize(payload)
                bucket = FlattenedTensorBucket(
                    flattened_tensor=data["flattened_tensor"], metadata=data["metadata"]
                )
                tensors = bucket.reconstruct_tensors()
        else:
            for item in named_tensors:
                if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                        and isinstance(item[1], torch.Tensor)):  # fmt: skip
                    raise TypeError(
                        f"named_tensors entries must be (str, Tensor) tuples, got {type(item).__name__}"
                    )
            # sglang.Engine serialises the list once per TP rank; a round trip keeps the cost comparable.
            for _ in range(self.tp_size):
                tensors = MultiprocessingSerializer.deserialize(
                    MultiprocessingSerializer.serialize(list(named_tensors))
                )
        self._load_weights(tensors)
        self.update_calls += 1
        if flush_cache:
            self._flush()
        return True, "Success"

    def _load_weights(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        tied = self.model.config.tie_word_embeddings
        with torch.no_grad():
            for name, tensor in tensors:
                if name == "lm_head.weight" and tied:
                    continue  # SGLang's Qwen2 skips it too: lm_head shares embed_tokens
                if name not in params:
                    raise ValueError(f"update_weights_from_tensor: unknown parameter {name!r}")
                if params[name].shape != tensor.shape:  # sglang's default_weight_loader assertion
                    raise AssertionError(
                        f"Attempted to load weight ({tensor.size()}) into parameter ({params[name].size()})"
                    )
                params[name].copy_(tensor.float())
                self.bytes_received += tensor.numel() * tensor.element_size()
        self.weights_stale = False

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str = "nccl",
    ) -> tuple[bool, str]:
        self._log(
            "init_weights_update_group", master_address=master_address, master_port=master_port,
            rank_offset=rank_offset, world_size=world_size, group_name=group_name, backend=backend,
        )  # fmt: skip
        self._check_alive("init_weights_update_group")
        if group_name == "":
            raise AssertionError("Group name cannot be empty")
        if backend != "gloo":  # on CPU only gloo exists: an NCCL group would fail in every scheduler
            return False, f"Failed to initialize custom process group: backend {backend!r} needs GPUs."
        args = dict(master_address=master_address, master_port=master_port, rank_offset=rank_offset,
                    world_size=world_size, group_name=group_name)  # fmt: skip
        return _merge(self._ask_schedulers("init", args))

    def destroy_weights_update_group(self, group_name: str) -> tuple[bool, str]:
        self._log("destroy_weights_update_group", group_name=group_name)
        self._check_alive("destroy_weights_update_group")
        if not self._schedulers:
            return False, "The group to be destroyed does not exist."
        return _merge(self._ask_schedulers("destroy", {"group_name": group_name}))

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> tuple[bool, str]:
        self._log(
            "update_weights_from_distributed", names=names, dtypes=dtypes, shapes=shapes,
            group_name=group_name, flush_cache=flush_cache, load_format=load_format,
        )  # fmt: skip
        self._check_alive("update_weights_from_distributed")
        if self.weight_update_session and not self.session_open:
            return False, _SESSION_MESSAGE.replace(
                "update_weights_from_tensor", "update_weights_from_distributed"
            )
        if "weights" in self.offload_tags:
            raise RuntimeError("update_weights_from_distributed while the weights are released")
        args = dict(names=names, dtypes=dtypes, shapes=shapes, group_name=group_name, load_format=load_format)
        replies = (
            self._ask_schedulers("receive", args)
            if self._schedulers
            else [(False, _no_group(group_name, []))]
        )
        for ok, out in replies:
            if not ok:
                return False, f"Failed to receive weights: {out}"
        tensors = replies[0][1]
        for _, other in replies[1:]:  # every engine GPU got the same bytes
            if not all(torch.equal(a, b) for (_, a), (_, b) in zip(tensors, other)):
                raise AssertionError("engine TP ranks received different bytes from one broadcast")
        try:
            self._load_weights(tensors)
        except Exception as exc:  # the model runner's message (weight_updater.load_weights_from_distributed)
            return False, (
                f"Failed to update parameter online: {exc}. The full weights of the ModelRunner are "
                "partially updated. Please discard the whole weights."
            )
        self.update_calls += 1
        if flush_cache:
            self._flush()
        return True, "Succeeded to update parameter online."

    def _ask_schedulers(self, command: str, args: dict) -> list[tuple[bool, Any]]:
        """One request to every scheduler process, their replies in TP order (SGLang's schedulers all
        act on one request)."""
        if not self._schedulers:
            ctx = mp.get_context("spawn")
            port = _free_port()
            for tp_rank in range(self.tp_size):
                here, there = ctx.Pipe()
                proc = ctx.Process(
                    target=_scheduler_process, args=(tp_rank, self.tp_size, port, there), daemon=True
                )
                proc.start()
                self._schedulers.append((proc, here))
        for _, conn in self._schedulers:
            conn.send((command, args))
        replies = []
        for tp_rank, (proc, conn) in enumerate(self._schedulers):
            try:
                replies.append(conn.recv())
            except EOFError:
                self._alive = False  # SGLang's engine is gone with its scheduler
                proc.join(5)
                raise RuntimeError(
                    f"the engine's scheduler (tp rank {tp_rank}) died during {command} (exit code {proc.exitcode})"
                ) from None
        return replies

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        self._log("get_weights_by_name", name=name)
        params = dict(self.model.named_parameters())
        if name not in params:
            raise ValueError(f"unknown parameter {name!r}")
        return params[name].detach().reshape(-1)[:truncate_size].tolist()

    def flush_cache(self) -> FlushCacheReqOutput:
        self._log("flush_cache")
        self._check_alive("flush_cache")
        return self._flush()

    def _flush(self) -> FlushCacheReqOutput:
        self.flush_calls += 1
        return FlushCacheReqOutput(success=True)

    # ------------------------------------------------------------------ memory

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._log("release_memory_occupation", tags=tags)
        self._check_alive("release_memory_occupation")
        tags = _check_tags(tags)
        if not self.enable_memory_saver:
            raise RuntimeError("release_memory_occupation needs enable_memory_saver=True")
        self.offload_tags |= set(tags)
        if "weights" in tags:
            with torch.no_grad():  # memory saver without CPU backup: the contents are gone
                for p in self.model.parameters():
                    p.fill_(float("nan"))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._log("resume_memory_occupation", tags=tags)
        self._check_alive("resume_memory_occupation")
        for tag in _check_tags(tags):
            self.offload_tags.remove(tag)  # KeyError(tag) when it was never released, as in SGLang
            if tag == "weights":
                self.weights_stale = True

    def shutdown(self) -> None:
        self._log("shutdown")
        self._alive = False
        for proc, conn in self._schedulers:
            try:
                conn.send(("stop", {}))
            except OSError:
                pass
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        self._schedulers = []

    def _log(self, method: str, **kwargs: Any) -> None:
        self.calls.append((method, kwargs))

    def _check_alive(self, what: str) -> None:
        if not self._alive:
            raise RuntimeError(f"{what} after shutdown")

    def _check_usable(self, what: str) -> None:
        self._check_alive(what)
        if self.offload_tags:
            raise RuntimeError(
                f"{what} while memory is released ({sorted(self.offload_tags)}): resume it first"
            )
        if self.weights_stale:
            raise RuntimeError(f"{what}: weights were released; push them again after resume")


def configure_process_as_sglang(server_args: dict) -> None:
    """What constructing sglang 0.5.23's Engine does to the calling process, before any subprocess
    starts: Engine.__init__ defaults log_level to "error"; ServerArgs resolution runs
    arg_groups/attention_hook.py handle_deterministic_inference (TP > 1: NCCL tree all-reduce, the
    channel count pinned to SGLANG_DETERMINISTIC_NCCL_NCHANNELS, default 8); _launch_subprocesses
    calls utils/common.py configure_logger (basicConfig(force=True) at that level) and
    entrypoints/engine.py _set_envs_and_config (NCCL_CUMEM_ENABLE, NCCL_NVLS_ENABLE,
    CUDA_DEVICE_MAX_CONNECTIONS=8, SGLANG_RUN_ID, and the spawn start method, forced)."""
    import logging
    import os

    if server_args.get("enable_deterministic_inference") and server_args.get("tp_size", 1) > 1:
        os.environ["NCCL_ALGO"] = "allreduce:tree"
        channels = os.environ.get("SGLANG_DETERMINISTIC_NCCL_NCHANNELS", "8")
        os.environ["NCCL_MIN_NCHANNELS"] = channels
        os.environ["NCCL_MAX_NCHANNELS"] = channels
    level = getattr(logging, server_args.get("log_level", "error").upper())
    logging.basicConfig(level=level, format="[%(asctime)s] %(message)s", force=True)
    os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    os.environ["SGLANG_RUN_ID"] = f"sglang-run-fake-{uuid.uuid4().hex[:8]}"
    mp.set_start_method("spawn", force=True)


class FakeSGLangEngine0515(FakeSGLangEngine):
    """sglang 0.5.15.post1's API: no weight-update session (begin/end_weight_update do not exist)."""

    sglang_version = "0.5.15.post1"
    weight_update_session = False

    def __getattribute__(self, name: str) -> Any:
        if name in ("begin_weight_update", "end_weight_update"):
            raise AttributeError(f"'Engine' object has no attribute {name!r} (sglang 0.5.15.post1)")
        return super().__getattribute__(name)


FAKE_ENGINES = {SGLANG_VERSION: FakeSGLangEngine, "0.5.15.post1": FakeSGLangEngine0515}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _merge(replies: list[tuple[bool, Any]]) -> tuple[bool, str]:
    """FanOutCommunicator.merge_results: success only if every scheduler succeeded."""
    failed = [msg for ok, msg in replies if not ok]
    return (False, failed[0]) if failed else (True, replies[0][1])


def _no_group(group_name: str, groups: list[str]) -> str:
    return f"Group {group_name} not in {groups}. Please call `init_weights_update_group` first."


def _scheduler_process(tp_rank: int, tp_size: int, port: int, conn) -> None:
    """One engine GPU's scheduler: its own default group (the engine's TP ranks), the update groups it
    is asked to join, and the receives (sglang 0.5.23 model_runner_components/weight_updater.py)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=tp_rank, world_size=tp_size)
    groups: dict[str, Any] = {}
    while True:
        command, args = conn.recv()
        if command == "stop":
            break
        if command == "init":
            conn.send(_join(groups, tp_rank, **args))
        elif command == "destroy":
            if args["group_name"] in groups:
                dist.destroy_process_group(groups.pop(args["group_name"]))
                conn.send((True, "Succeeded to destroy custom process group."))
            else:
                conn.send((False, "The group to be destroyed does not exist."))
        elif command == "receive":
            try:
                conn.send((True, _receive(groups, **args)))
            except Exception as exc:
                conn.send((False, str(exc)))
    for group in groups.values():
        dist.destroy_process_group(group)
    dist.destroy_process_group()


def _join(groups, tp_rank, master_address, master_port, rank_offset, world_size, group_name):
    """init_custom_process_group as SGLang does it: TCP rendezvous (group rank 0 hosts the store),
    keys under the group name, a group apart from the default one, identity rank mapping."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

    try:
        timeout = datetime.timedelta(minutes=5)
        url = f"tcp://{master_address}:{master_port}"
        store, rank, world = next(dist.rendezvous(url, rank_offset + tp_rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
        group, _ = _new_process_group_helper(
            world,
            rank,
            [],
            Backend("gloo"),
            PrefixStore(group_name, store),
            group_name=group_name,
            timeout=timeout,
        )
        _world.pg_group_ranks[group] = {i: i for i in range(world)}
        groups[group_name] = group
        return True, "Succeeded to initialize custom process group."
    except Exception as exc:
        return False, f"Failed to initialize custom process group: {exc}."


def _receive(groups, names, dtypes, shapes, group_name, load_format):
    import torch.distributed as dist

    if group_name not in groups:
        raise AssertionError(_no_group(group_name, list(groups)))
    if load_format == "flattened_bucket":
        bucket = FlattenedTensorBucket.empty(names, dtypes, shapes, "cpu")
        dist.broadcast(bucket.get_flattened_tensor(), src=0, group=groups[group_name])
        return [(n, t.clone()) for n, t in bucket.reconstruct_tensors()]
    weights, handles = [], []
    for name, dtype, shape in zip(names, dtypes, shapes):
        dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
        weight = torch.empty(shape, dtype=dtype)
        handles.append(dist.broadcast(weight, src=0, group=groups[group_name], async_op=True))
        weights.append((name, weight))
    for handle in handles:
        handle.wait()
    return weights


def _check_tags(tags: list[str] | None) -> list[str]:
    if tags is not None and not isinstance(tags, list):
        raise TypeError(f"tags must be a list of str or None, got {type(tags).__name__}")
    tags = list(MEMORY_TAGS) if not tags else tags
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise ValueError(f"unknown memory tags {unknown}; SGLang knows {list(MEMORY_TAGS)}")
    return tags


def _check_sampling_params(params: dict) -> None:
    if not isinstance(params, dict):
        raise TypeError(f"sampling_params must be a dict, got {type(params).__name__}")
    unknown = sorted(set(params) - set(SAMPLING_KEYS))
    if unknown:
        raise TypeError(f"SamplingParams: unexpected keyword arguments {unknown}")
    seed = params.get("sampling_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"sampling_seed must be an integer, got {type(seed).__name__}.")


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple, set)) else [int(x)]


def monkey_patch_torch_reductions() -> None:
    """Stands in for sglang.srt.utils.patch_torch.monkey_patch_torch_reductions (CUDA IPC handles that
    name the device by UUID); the fake's handles are in-process, so it only records the call."""
    MultiprocessingSerializer.reductions_patched = True


def fake_backend(version: str = SGLANG_VERSION) -> SGLangBackend:
    """The fake's (Engine, FlattenedTensorBucket, MultiprocessingSerializer) for SGLangEngine, with the
    API of sglang `version` (0.5.23 by default, or 0.5.15.post1)."""
    if version not in FAKE_ENGINES:
        raise ValueError(f"no fake of sglang {version}; faked versions: {sorted(FAKE_ENGINES)}")
    return SGLangBackend(
        FAKE_ENGINES[version], FlattenedTensorBucket, MultiprocessingSerializer, monkey_patch_torch_reductions
    )


@register_engine("fake_sglang")  # the registry line: the real engine class over the fake backend
def _build_fake_sglang(cfg, model=None, tokenizer=None, **kwargs) -> SGLangEngine:
    return SGLangEngine(cfg, fake_backend(), tokenizer=tokenizer, name="fake_sglang", **kwargs)


__all__ = [
    "FakeSGLangEngine",
    "FakeSGLangEngine0515",
    "FlattenedTensorBucket",
    "FlattenedTensorMetadata",
    "MultiprocessingSerializer",
    "fake_backend",
]
