"""The embedded rollout engine: sampling with the training GPTModel itself (CPU default, quickstart).

    engine = EmbeddedEngine(model, cfg, tokenizer)      # this rank's TP/PP stage of the policy
    samples = engine.generate(prompt_samples, sampling)  # collective over the model-parallel group

Prompts of one batch are left-padded to the longest and the padding keys are masked; RoPE depends
only on relative positions, so the shift the padding causes does not change attention scores.
Two decoders run the same model:
  * at TP=1, PP=1 on megatron's local layer spec (the CPU runs: quickstart, toy recipe), the
    static-cache decoder (static_decode.py): the model's own parameter tensors, a preallocated KV
    cache, last-position logits over the real vocabulary: 1.4-1.9x transformers' `generate` on CPU
    (benchmarks/RESULTS.md), where megatron's inference forward ran at 0.7-0.8x;
  * everywhere else megatron's inference forward with its StaticInferenceContext (an explicit
    [b, 1, q, k] mask hides the padding keys; PP > 1 passes hidden states between stages with
    send/recv, like training).
Every step the last stage samples with a seeded torch.Generator (inverse CDF, base.sample_next)
and broadcasts the tokens and their log-probs to all TP ranks and pipeline stages, so every rank
returns the same samples.

The padding mask is honoured by megatron's local (unfused) attention, the CPU layer spec. Transformer
Engine ignores explicit masks when decoding, so with TE layers only prompts of equal length share a
batch (no padding, no mask); for throughput on GPUs use the SGLang engine.
megatron.core is imported inside the methods that need it: the engine registry imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist

from vepo_mcore.checkpoint import mapping
from vepo_mcore.checkpoint.convert import layer_offset
from vepo_mcore.models.builder import model_vocab_size, use_transformer_engine
from vepo_mcore.parallel.device import without_shim_mode
from vepo_mcore.rollout.base import (
    SamplingParams,
    as_samples,
    finish_sample,
    register_engine,
    sample_next,
)
from vepo_mcore.rollout.static_decode import StaticCacheDecoder, unsupported_reason
from vepo_mcore.translation.sample import Sample

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock, and the engine registry imports this module).


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

        self.equal_length_batches = use_transformer_engine(cfg)
        self.static_cache_decoder = True
        """Decode with StaticCacheDecoder where it applies (False: always megatron's forward)."""

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
        b = len(prompt_ids)
        prompt_len = max(len(p) for p in prompt_ids)
        total = prompt_len + sampling.max_new_tokens
        tokens = torch.full((b, prompt_len), self.pad_id, dtype=torch.long)
        key_valid = torch.zeros(b, total, dtype=torch.bool)
        for i, ids in enumerate(prompt_ids):
            tokens[i, prompt_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            key_valid[i, prompt_len - len(ids) :] = True
        stops = torch.tensor(sampling.stop_token_ids or [-1], dtype=torch.long)
        out_tokens = torch.zeros(b, sampling.max_new_tokens, dtype=torch.long)
        out_logprobs = torch.zeros(b, sampling.max_new_tokens, dtype=torch.float32)
        lengths = torch.full((b,), sampling.max_new_tokens, dtype=torch.long)
        done = torch.zeros(b, dtype=torch.bool)
        pad = torch.full((b,), self.pad_id, dtype=torch.long)
        steps = 0
        with torch.inference_mode(), without_shim_mode():
            decoder = self._decoder()
            self._context = decoder
            logits = decoder.prefill(tokens, key_valid, total)
            for step in range(sampling.max_new_tokens):
                next_tokens, logprobs = self._sample(logits, b, sampling, generator)
                next_tokens = torch.where(done, pad, next_tokens)
                out_tokens[:, step] = next_tokens
                out_logprobs[:, step] = logprobs
                hit_stop = torch.isin(next_tokens, stops) & ~done
                lengths.masked_fill_(hit_stop, step + 1)
                done |= hit_stop
                steps = step + 1
                if steps == sampling.max_new_tokens or bool(done.all()):
                    break
                logits = decoder.decode(next_tokens)
        responses, logps, reasons = [], [], []
        for i in range(b):
            n = int(min(lengths[i], steps))
            responses.append(out_tokens[i, :n].tolist())
            logps.append(out_logprobs[i, :n].tolist())
            reasons.append("stop" if bool(done[i]) else "length")
        return responses, logps, reasons

    def _decoder(self) -> StaticCacheDecoder | _MegatronDecoder:
        """The static-cache decoder where it computes this model exactly (TP=1, PP=1, megatron's
        local layer spec: the CPU runs); megatron's own inference forward everywhere else."""
        if self.static_cache_decoder and unsupported_reason(self.model) is None:
            return StaticCacheDecoder(self.model, self.vocab_size)
        return _MegatronDecoder(self.model)

    def _sample(
        self, logits: torch.Tensor | None, b: int, sampling: SamplingParams, generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample on the last stage's TP rank 0, then broadcast (tokens, log-probs) to every rank."""
        from megatron.core import parallel_state

        tp = parallel_state.get_tensor_model_parallel_world_size()
        pp = parallel_state.get_pipeline_model_parallel_world_size()
        if tp == 1 and pp == 1:  # nothing to share: no packing, no collectives on the hot path
            return sample_next(logits[:, : self.vocab_size].cpu(), sampling, generator)
        packed = torch.zeros(2, b, dtype=torch.float64)
        if logits is not None and parallel_state.get_tensor_model_parallel_rank() == 0:
            tokens, logprobs = sample_next(logits[:, : self.vocab_size].float().cpu(), sampling, generator)
            packed[0], packed[1] = tokens.double(), logprobs.double()
        dev = _comm_device()
        packed = packed.to(dev)
        if parallel_state.is_pipeline_last_stage() and tp > 1:
            dist.broadcast(
                packed,
                src=parallel_state.get_tensor_model_parallel_src_rank(),
                group=parallel_state.get_tensor_model_parallel_group(),
            )
        if pp > 1:
            dist.broadcast(
                packed,
                src=parallel_state.get_pipeline_model_parallel_last_rank(),
                group=parallel_state.get_pipeline_model_parallel_group(),
            )
        packed = packed.cpu()
        return packed[0].long(), packed[1].float()


class _MegatronDecoder:
    """megatron's inference forward with its StaticInferenceContext (any TP/PP, TE layers included).

    Prompts of one batch are left-padded to the longest; an explicit [b, 1, q, k] mask hides the
    padding keys. PP > 1 passes hidden states between stages with send/recv, like training.
    """

    def __init__(self, model):
        self.model = model
        self.dev = _model_device(model)

    def prefill(self, tokens: torch.Tensor, key_valid: torch.Tensor, total: int) -> torch.Tensor | None:
        from megatron.core.inference.contexts import StaticInferenceContext

        b, s = tokens.shape
        self.ctx = StaticInferenceContext(b, total)
        self.is_pad = ~key_valid
        self.padded = bool(self.is_pad[:, :s].any())
        causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
        # Without padding megatron's own causal (prefill) / no-mask (decode) handling is exact.
        mask = causal[None, None] | self.is_pad[:, None, None, :s] if self.padded else None
        return self._forward(tokens, mask)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor | None:
        mask = self.is_pad[:, None, None, : self.ctx.sequence_len_offset + 1] if self.padded else None
        return self._forward(tokens.unsqueeze(1), mask)

    def _forward(self, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | None:
        """One step through this rank's stage; full-vocab last-token logits [b, V_pad] on the last stage."""
        from megatron.core import parallel_state

        model, ctx = self.model, self.ctx
        b, s = tokens.shape
        offset = ctx.sequence_len_offset
        positions = torch.arange(offset, offset + s).unsqueeze(0).expand(b, -1)
        if not parallel_state.is_pipeline_first_stage():
            hidden = torch.empty(
                s, b, model.config.hidden_size, dtype=model.config.params_dtype, device=self.dev
            )
            dist.recv(hidden, src=parallel_state.get_pipeline_model_parallel_prev_rank())
            model.set_input_tensor(hidden)
        # megatron gathers the vocab-parallel logits itself in inference mode (it insists on it).
        out = model(
            tokens.to(self.dev),
            positions.to(self.dev),
            None if mask is None else mask.to(self.dev),
            inference_context=ctx,
            runtime_gather_output=True,
        )
        ctx.increment_sequence_len_offset(s)
        ctx.enable_decode_mode()
        if not parallel_state.is_pipeline_last_stage():
            dist.send(out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
            return None
        # [b, 1, V_pad] (the context keeps only the last position's logits) -> [b, V_pad]
        return out[:, -1, :]


def _unwrap(model):
    """The GPTModel inside DDP / Float16Module wrappers (a list means virtual pipeline chunks)."""
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise NotImplementedError(
                "the embedded engine does not support virtual pipeline stages: "
                "parallel.virtual_pipeline_model_parallel_size must be null (ParallelConfig.validate)"
            )
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
