"""The embedded rollout engine: sampling with the training GPTModel itself (CPU default, quickstart).

    engine = EmbeddedEngine(model, cfg, tokenizer)      # this rank's TP/PP stage of the policy
    samples = engine.generate(prompt_samples, sampling)  # collective over the model-parallel group

KV cache: megatron.core's StaticInferenceContext (the cache its attention layers fill in place).
Prompts of one batch are left-padded to the longest; an explicit [b, 1, q, k] mask hides the
padding keys. RoPE depends only on relative positions, so the shift the padding causes does not
change attention scores. Every step the last stage gathers the vocab-parallel logits, drops the
padding columns (>= the real vocab), samples with a seeded torch.Generator and broadcasts the
tokens (and their log-probs) to all TP ranks and pipeline stages, so every rank returns the
same samples. PP > 1 passes hidden states between stages with send/recv, like training.

The padding mask is honoured by megatron's local (unfused) attention, the CPU layer spec. Transformer
Engine ignores explicit masks when decoding, so with TE layers only prompts of equal length share a
batch (no padding, no mask); for throughput on GPUs use the SGLang engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.distributed as dist

from vepo_mcore.parallel.device import has_cuda
from vepo_mcore.rollout.base import (
    SamplingParams,
    as_samples,
    finish_sample,
    register_engine,
    sample_next,
)
from vepo_mcore.translation.sample import Sample


class EmbeddedEngine:
    """Generation with this rank's Megatron model stage; shares the training weights."""

    name = "embedded"
    shares_training_weights = True
    weights_survive_sleep = True

    def __init__(self, model, cfg, tokenizer=None, batch_size: int | None = None, seed: int | None = None):
        if cfg.parallel.sequence_parallel:
            # The embedding would split each decode step's single token over the TP ranks.
            raise ValueError(
                "rl.rollout.engine 'embedded' cannot decode with parallel.sequence_parallel=true "
                "(megatron has no sequence-parallel decoding): use rl.rollout.engine=sglang, or "
                "parallel.sequence_parallel=false"
            )
        self.model = _unwrap(model)
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.vocab_size = cfg.model.vocab_size
        self.batch_size = batch_size or cfg.rl.rollout.batch_size
        self.pad_id = tokenizer.pad_id if tokenizer is not None else 0
        base_seed = cfg.training.seed if seed is None else seed
        self.generator = torch.Generator().manual_seed(base_seed)
        self._context = None
        from vepo_mcore.models.builder import use_transformer_engine

        self.equal_length_batches = use_transformer_engine(cfg)

    # ------------------------------------------------------------------ interface

    def generate(self, prompts: list[Sample] | list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """Collective over the model-parallel group; same prompts on every rank, same samples back."""
        samples = as_samples(prompts)
        generator = self.generator
        if sampling.seed is not None:
            generator = torch.Generator().manual_seed(sampling.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in self._batches(samples):
                tokens, logprobs, reasons = self._generate_batch(
                    [s.prompt_ids for s in chunk], sampling, generator
                )
                for sample, ids, lps, reason in zip(chunk, tokens, logprobs, reasons):
                    finish_sample(sample, ids, lps, reason, self.tokenizer)
        finally:
            self.model.train(was_training)
            self._context = None
        return samples

    def _batches(self, samples: list[Sample]) -> list[list[Sample]]:
        """Batches of `batch_size` in order; with Transformer Engine layers only equal-length prompts
        share a batch, since TE ignores explicit padding masks when decoding."""
        if not self.equal_length_batches:
            return [samples[i : i + self.batch_size] for i in range(0, len(samples), self.batch_size)]
        by_length: dict[int, list[Sample]] = {}
        for s in samples:
            by_length.setdefault(len(s.prompt_ids), []).append(s)
        return [
            group[i : i + self.batch_size]
            for group in by_length.values()
            for i in range(0, len(group), self.batch_size)
        ]

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None
    ) -> None:
        """Copy full HF-named tensors into this rank's shards (partial updates allowed).

        The trainer never needs this (the engine *is* the training model); it exists so the engine
        can load any policy, and so the contract suite runs against every engine alike.
        """
        from megatron.core import parallel_state

        from vepo_mcore.checkpoint import mapping
        from vepo_mcore.checkpoint.convert import layer_offset
        from vepo_mcore.models.builder import model_vocab_size

        hf = dict(named_tensors)
        known = {
            n
            for name in mapping.megatron_names(self.cfg.model)
            for n in mapping.hf_names_for(name, self.cfg.model)
        }
        # lm_head with tied embeddings and q/k/v biases of a bias-free model are accepted and ignored.
        unknown = sorted(n for n in set(hf) - known - {"lm_head.weight"} if not n.endswith("_proj.bias"))
        if unknown:
            raise ValueError(
                f"update_weights: {unknown[:5]} are not weights of this model (HF Qwen2 names expected)"
            )
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
        offset = layer_offset(self.model)
        padded = model_vocab_size(self.cfg)
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                global_name = mapping.global_layer_name(name, offset)
                needed = mapping.hf_names_for(global_name, self.cfg.model)
                if not all(n in hf for n in needed):
                    continue
                full = mapping.hf_to_megatron_tensor(global_name, hf.__getitem__, self.cfg.model, padded)
                param.copy_(mapping.tp_split(global_name, full, tp_size)[tp_rank])

    def sleep(self) -> None:
        """Drop the KV cache (the weights are the training model's and stay)."""
        self._context = None

    def wake(self) -> None:
        pass

    def shutdown(self) -> None:
        self._context = None

    # ------------------------------------------------------------------ generation

    def _generate_batch(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, generator: torch.Generator
    ) -> tuple[list[list[int]], list[list[float]], list[str]]:
        from megatron.core.inference.contexts import StaticInferenceContext

        b = len(prompt_ids)
        prompt_len = max(len(p) for p in prompt_ids)
        total = prompt_len + sampling.max_new_tokens
        tokens = torch.full((b, prompt_len), self.pad_id, dtype=torch.long)
        is_pad = torch.ones(b, total, dtype=torch.bool)
        for i, ids in enumerate(prompt_ids):
            tokens[i, prompt_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            is_pad[i, prompt_len - len(ids) :] = False
        dev = _model_device(self.model)
        ctx = StaticInferenceContext(b, total)
        self._context = ctx
        stops = torch.tensor(sampling.stop_token_ids or [-1], dtype=torch.long)
        out_tokens = torch.zeros(b, sampling.max_new_tokens, dtype=torch.long)
        out_logprobs = torch.zeros(b, sampling.max_new_tokens, dtype=torch.float32)
        lengths = torch.full((b,), sampling.max_new_tokens, dtype=torch.long)
        done = torch.zeros(b, dtype=torch.bool)
        causal = torch.triu(torch.ones(prompt_len, prompt_len, dtype=torch.bool), diagonal=1)
        padded = bool(is_pad[:, :prompt_len].any())
        # Without padding megatron's own causal (prefill) / no-mask (decode) handling is exact.
        mask = causal[None, None] | is_pad[:, None, None, :prompt_len] if padded else None
        step_input = tokens
        steps = 0
        with torch.inference_mode(), _without_cpu_shim_mode():
            for step in range(sampling.max_new_tokens):
                positions = torch.arange(
                    ctx.sequence_len_offset, ctx.sequence_len_offset + step_input.shape[1]
                )
                positions = positions.unsqueeze(0).expand(b, -1)
                logits = self._forward(step_input.to(dev), positions.to(dev), _to(mask, dev), ctx)
                ctx.increment_sequence_len_offset(step_input.shape[1])
                ctx.enable_decode_mode()
                next_tokens, logprobs = self._sample(logits, sampling, generator)
                next_tokens = torch.where(done, torch.full_like(next_tokens, self.pad_id), next_tokens)
                out_tokens[:, step] = next_tokens
                out_logprobs[:, step] = logprobs
                hit_stop = torch.isin(next_tokens, stops) & ~done
                lengths = torch.where(hit_stop, torch.full_like(lengths, step + 1), lengths)
                done |= hit_stop
                steps = step + 1
                if bool(done.all()):
                    break
                step_input = next_tokens.unsqueeze(1)
                mask = is_pad[:, None, None, : ctx.sequence_len_offset + 1] if padded else None
        responses, logps, reasons = [], [], []
        for i in range(b):
            n = int(min(lengths[i], steps))
            responses.append(out_tokens[i, :n].tolist())
            logps.append(out_logprobs[i, :n].tolist())
            reasons.append("stop" if bool(done[i]) else "length")
        return responses, logps, reasons

    def _forward(self, tokens, positions, mask, ctx) -> torch.Tensor | None:
        """One step through this rank's stage; full-vocab last-token logits [b, V_pad] on the last stage."""
        from megatron.core import parallel_state

        model = self.model
        first = parallel_state.is_pipeline_first_stage()
        last = parallel_state.is_pipeline_last_stage()
        b, s = tokens.shape
        if not first:
            hidden = torch.empty(
                s, b, model.config.hidden_size, dtype=model.config.params_dtype, device=tokens.device
            )
            dist.recv(hidden, src=parallel_state.get_pipeline_model_parallel_prev_rank())
            model.set_input_tensor(hidden)
        # megatron gathers the vocab-parallel logits itself in inference mode (it insists on it).
        out = model(tokens, positions, mask, inference_context=ctx, runtime_gather_output=True)
        if not last:
            dist.send(out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
            return None
        # [b, 1, V_pad] (the context keeps only the last position's logits) -> [b, V_pad]
        return out[:, -1, :]

    def _sample(self, logits, sampling: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample on the last stage's TP rank 0, then broadcast (tokens, log-probs) to every rank."""
        from megatron.core import parallel_state

        b = self._context.max_batch_size
        packed = torch.zeros(2, b, dtype=torch.float64)
        if logits is not None and parallel_state.get_tensor_model_parallel_rank() == 0:
            tokens, logprobs = sample_next(logits[:, : self.vocab_size].float().cpu(), sampling, generator)
            packed[0], packed[1] = tokens.double(), logprobs.double()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dev = _comm_device()
            packed = packed.to(dev)
            if parallel_state.is_pipeline_last_stage():
                dist.broadcast(
                    packed,
                    src=parallel_state.get_tensor_model_parallel_src_rank(),
                    group=parallel_state.get_tensor_model_parallel_group(),
                )
            if parallel_state.get_pipeline_model_parallel_world_size() > 1:
                dist.broadcast(
                    packed,
                    src=parallel_state.get_pipeline_model_parallel_last_rank(),
                    group=parallel_state.get_pipeline_model_parallel_group(),
                )
            packed = packed.cpu()
        return packed[0].long(), packed[1].float()


def _to(mask: torch.Tensor | None, dev: torch.device) -> torch.Tensor | None:
    return None if mask is None else mask.to(dev)


@contextlib.contextmanager
def _without_cpu_shim_mode():
    """Suspend the CPU shim's torch-function mode while decoding.

    The mode (parallel/device.py) rewrites device="cuda" in every torch call; megatron's inference
    forward allocates nothing on "cuda" by name (its buffers use torch.cuda.current_device(), which
    the shim maps to CPU), and the mode costs ~40% of a tiny model's decode step.
    """
    if has_cuda():
        yield
        return
    with torch._C.DisableTorchFunction():
        yield


def _unwrap(model):
    """The GPTModel inside DDP / Float16Module wrappers (a list means virtual pipeline chunks)."""
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise NotImplementedError("the embedded engine does not support virtual pipeline stages")
        model = model[0]
    while hasattr(model, "module"):
        model = model.module
    return model


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def _comm_device() -> torch.device:
    # NCCL needs CUDA tensors; gloo works on CPU ones.
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


@register_engine("embedded")
def _build_embedded(cfg, model=None, tokenizer=None, **kwargs) -> EmbeddedEngine:
    if model is None:
        raise ValueError(
            "rl.rollout.engine 'embedded' needs the training model: build_engine(cfg, model=...)"
        )
    return EmbeddedEngine(model, cfg, tokenizer, **kwargs)
