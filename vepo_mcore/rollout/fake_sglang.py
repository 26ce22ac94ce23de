"""A CPU test double of `sglang.Engine`: same method names, arguments and outputs, transformers inside.

SGLang needs CUDA, so the SGLang backend (sglang_engine.py) is tested against this double. It
mirrors the parts of SGLang's offline API the backend uses (python/sglang/srt/entrypoints/engine.py):

    engine = FakeSGLangEngine(model_path=hf_dir, tp_size=2, mem_fraction_static=0.5,
                              enable_memory_saver=True, skip_tokenizer_init=True, load_format="dummy")
    out = engine.generate(input_ids=[[...], ...], sampling_params={...}, return_logprob=True)
    out[i] == {"output_ids": [...], "meta_info": {"id", "finish_reason": {"type": "stop",
               "matched": id} | {"type": "length", "length": n}, "prompt_tokens", "completion_tokens",
               "cached_tokens", "output_token_logprobs": [(logprob, token_id, None), ...]}}
    engine.update_weights_from_tensor(named_tensors, load_format=None | "flattened_bucket", flush_cache=True)
    engine.release_memory_occupation(tags=None); engine.resume_memory_occupation(tags=None)
    engine.flush_cache(); engine.get_weights_by_name(name, truncate_size=100); engine.shutdown()

plus `FlattenedTensorBucket` / `FlattenedTensorMetadata` (sglang.srt.weight_sync.tensor_bucket) and
`MultiprocessingSerializer` (sglang.srt.utils; zero-copy in-process handles standing in for CUDA IPC)
with the same constructors and methods. Generation
runs `transformers.Qwen2ForCausalLM` on the weights received (fp32 on CPU). Like SGLang without
`SGLANG_RETURN_ORIGINAL_LOGPROB`, the log-probs are log softmax(logits / temperature) (greedy:
log softmax(logits)). Like SGLang's memory saver, released weights are lost until pushed again.
It also counts what arrives (`bytes_received`, `update_calls`) for the weight-sync benchmark.
"""

from __future__ import annotations

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
    """Named tensors of one dtype packed into one 1-D tensor, plus the metadata to unpack them."""

    def __init__(
        self,
        named_tensors: list[tuple[str, torch.Tensor]] | None = None,
        flattened_tensor: torch.Tensor | None = None,
        metadata: list[FlattenedTensorMetadata] | None = None,
    ):
        if named_tensors is not None:
            if not named_tensors:
                raise ValueError("Cannot create empty tensor bucket")
            self.metadata, start = [], 0
            for name, tensor in named_tensors:
                n = tensor.numel()
                self.metadata.append(
                    FlattenedTensorMetadata(name, tensor.shape, tensor.dtype, start, start + n, n)
                )
                start += n
            self.flattened_tensor = torch.cat([t.reshape(-1) for _, t in named_tensors])
        else:
            if flattened_tensor is None or metadata is None:
                raise ValueError("Must provide either named_tensors or both flattened_tensor and metadata")
            self.flattened_tensor, self.metadata = flattened_tensor, metadata

    def get_flattened_tensor(self) -> torch.Tensor:
        return self.flattened_tensor

    def get_metadata(self) -> list[FlattenedTensorMetadata]:
        return self.metadata

    def reconstruct_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [
            (m.name, self.flattened_tensor[m.start_idx : m.end_idx].reshape(m.shape).to(m.dtype))
            for m in self.metadata
        ]


class MultiprocessingSerializer:
    """serialize(obj, output_str) / deserialize(data), as sglang.srt.utils has.

    SGLang pickles CUDA tensors as IPC handles: the engine maps the sender's memory, no copy. The
    fake's engine lives in the same process, so a handle is a key into a table of live objects.
    """

    _live: dict[str, Any] = {}

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


class FakeSGLangEngine:
    """sglang.Engine's offline API on CPU, backed by transformers' Qwen2ForCausalLM."""

    def __init__(
        self,
        model_path: str,
        tp_size: int = 1,
        mem_fraction_static: float | None = None,
        enable_memory_saver: bool = False,
        skip_tokenizer_init: bool = False,
        load_format: str = "auto",
        dtype: str = "auto",
        random_seed: int | None = None,
        **server_args: Any,
    ):
        from transformers import Qwen2Config, Qwen2ForCausalLM

        if not (Path(model_path) / "config.json").is_file():
            raise FileNotFoundError(f"model_path {model_path} has no config.json")
        self.model_path = str(model_path)
        self.tp_size = tp_size
        self.enable_memory_saver = enable_memory_saver
        self.skip_tokenizer_init = skip_tokenizer_init
        self.server_args = dict(server_args, mem_fraction_static=mem_fraction_static, dtype=dtype)
        self.random_seed = 0 if random_seed is None else random_seed
        config = Qwen2Config.from_pretrained(model_path)
        if load_format == "dummy" or not any(Path(model_path).glob("*.safetensors")):
            torch.manual_seed(self.random_seed)
            self.model = Qwen2ForCausalLM(config)
        else:
            self.model = Qwen2ForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.model = self.model.float().eval()
        self.vocab_rows = config.vocab_size
        self.eos_token_ids = _as_list(getattr(config, "eos_token_id", None))
        self.released: set[str] = set()
        self.bytes_received = 0
        self.update_calls = 0
        self.flush_calls = 0
        self._requests = 0
        self._alive = True

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        prompt: list[str] | str | None = None,
        sampling_params: list[dict] | dict | None = None,
        input_ids: list[list[int]] | list[int] | None = None,
        return_logprob: list[bool] | bool = False,
        logprob_start_len: list[int] | int | None = None,
        top_logprobs_num: list[int] | int | None = None,
        stream: bool = False,
        **kwargs: Any,
    ) -> list[dict] | dict:
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
        seed = params.get("sampling_seed", self.random_seed + self._requests)
        self._requests += 1
        generator = torch.Generator().manual_seed(int(seed))
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

    def update_weights_from_tensor(
        self, named_tensors: list, load_format: str | None = None, flush_cache: bool = True
    ) -> tuple[bool, str]:
        self._check_usable("update_weights_from_tensor", need_weights=False)
        if load_format == "flattened_bucket":
            if len(named_tensors) not in (1, self.tp_size):
                raise ValueError(
                    f"expected 1 or tp_size={self.tp_size} serialized buckets, got {len(named_tensors)}"
                )
            payload = MultiprocessingSerializer.deserialize(named_tensors[0])
            bucket = FlattenedTensorBucket(
                flattened_tensor=payload["flattened_tensor"], metadata=payload["metadata"]
            )
            tensors = bucket.reconstruct_tensors()
        elif load_format is None:
            # sglang.Engine serialises the list once per TP rank; a round trip keeps the cost comparable.
            tensors = MultiprocessingSerializer.deserialize(
                MultiprocessingSerializer.serialize(list(named_tensors))
            )
        else:
            raise NotImplementedError(f"Unknown load_format={load_format}")
        self._load_weights(tensors)
        self.update_calls += 1
        if flush_cache:
            self.flush_cache()
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
                if params[name].shape != tensor.shape:
                    raise ValueError(
                        f"update_weights_from_tensor: {name} has shape {tuple(tensor.shape)}, "
                        f"engine expects {tuple(params[name].shape)}"
                    )
                params[name].copy_(tensor.float())
                self.bytes_received += tensor.numel() * tensor.element_size()
        self.released.discard("weights_stale")

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        params = dict(self.model.named_parameters())
        if name not in params:
            raise ValueError(f"unknown parameter {name!r}")
        return params[name].detach().reshape(-1)[:truncate_size].tolist()

    def flush_cache(self) -> FlushCacheReqOutput:
        self.flush_calls += 1
        return FlushCacheReqOutput(success=True)

    # ------------------------------------------------------------------ memory

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        tags = tags or ["weights", "kv_cache"]
        if not self.enable_memory_saver:
            raise RuntimeError("release_memory_occupation needs enable_memory_saver=True")
        if "weights" in tags:
            with torch.no_grad():  # memory saver without CPU backup: the contents are gone
                for p in self.model.parameters():
                    p.fill_(float("nan"))
        self.released |= set(tags)

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        tags = tags or ["weights", "kv_cache"]
        self.released -= {"kv_cache"} & set(tags)
        if "weights" in tags:
            self.released.add("weights_stale")
            self.released.discard("weights")

    def shutdown(self) -> None:
        self._alive = False

    def _check_usable(self, what: str, need_weights: bool = True) -> None:
        if not self._alive:
            raise RuntimeError(f"{what} after shutdown")
        if "kv_cache" in self.released or "weights" in self.released:
            raise RuntimeError(f"{what} while memory is released (call resume_memory_occupation)")
        if need_weights and "weights_stale" in self.released:
            raise RuntimeError(f"{what}: weights were released; push them again after resume")


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(v) for v in x] if isinstance(x, (list, tuple, set)) else [int(x)]


def fake_backend() -> SGLangBackend:
    """The fake's (Engine, FlattenedTensorBucket, MultiprocessingSerializer) for SGLangEngine."""
    return SGLangBackend(FakeSGLangEngine, FlattenedTensorBucket, MultiprocessingSerializer, fake=True)


@register_engine("fake_sglang")
def _build_fake_sglang(cfg, model=None, tokenizer=None, **kwargs) -> SGLangEngine:
    return SGLangEngine(cfg, fake_backend(), tokenizer=tokenizer, name="fake_sglang", **kwargs)


__all__ = [
    "FakeSGLangEngine",
    "FlattenedTensorBucket",
    "FlattenedTensorMetadata",
    "MultiprocessingSerializer",
    "fake_backend",
]
