"""The rollout engine interface, the sampling parameters every engine takes, and the engine registry.

    engine = build_engine(cfg, model=model, tokenizer=tok)   # by cfg.rl.rollout.engine
    samples = engine.generate(prompts, cfg.rl.rollout.sampling.with_stops(tok.stop_ids))
    sync_weights(engine, model, cfg)                          # after each optimizer step (weight_sync.py)
    engine.sleep(); ...train...; engine.wake()

Contract shared by all engines (tests/unit/test_rollout_contract.py runs one suite against each):
  * `generate` is called on every rank with the same prompts and returns the same samples on every
    rank: `response_ids` (the stop token included when one was produced), `response` (decoded, special
    tokens stripped), `rollout_logprobs` = log softmax(z / tau)[token] over the *real* vocabulary for
    each response token (tau = sampling temperature; greedy, tau = 0, reports log softmax(z)), and
    `finish_reason` 'stop' (a stop token) or 'length' (max_new_tokens reached).
  * `update_weights(named_tensors)` takes full (unsharded) tensors under Hugging Face Qwen2 names.
  * `sleep()` releases the engine's memory (KV cache; SGLang also its weights), `wake()` takes it
    back; weights must be pushed again after `wake()` when `weights_survive_sleep` is False.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import torch

from vepo_mcore.config.rl import SamplingParams
from vepo_mcore.translation.sample import Sample

FINISH_REASONS = ("stop", "length", "abort")


@runtime_checkable
class RolloutEngine(Protocol):
    """What the RL trainer needs from a rollout engine (embedded Megatron sampler, SGLang, fake SGLang)."""

    name: str
    shares_training_weights: bool
    """True when the engine computes with the training model's own parameters (no sync needed)."""
    weights_survive_sleep: bool
    """False when sleep() discards the weights (SGLang's memory saver): sync again after wake()."""

    def generate(self, prompts: list[Sample] | list[list[int]], sampling: SamplingParams) -> list[Sample]: ...

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int | None = None
    ) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...

    def shutdown(self) -> None: ...


# ----------------------------------------------------------------------------- helpers for engines


def as_samples(prompts: list[Sample] | list[list[int]]) -> list[Sample]:
    """Copies of the prompt Samples (or new Samples around bare token lists); prompt_ids must be set."""
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, Sample):
            sample = copy.copy(p)
            sample.metadata = dict(p.metadata)
        else:
            sample = Sample(prompt_ids=[int(t) for t in p], group_id=i)
        if not sample.prompt_ids:
            raise ValueError(f"prompt {i} has no prompt_ids: tokenise prompts before generate()")
        out.append(sample)
    return out


def finish_sample(
    sample: Sample,
    response_ids: list[int],
    logprobs: list[float],
    finish_reason: str,
    tokenizer: Any = None,
) -> Sample:
    """Fill the response fields of `sample` (decoding the text with `tokenizer` when given)."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason {finish_reason!r} is not one of {FINISH_REASONS}")
    if len(logprobs) != len(response_ids):
        raise ValueError(f"{len(response_ids)} response tokens but {len(logprobs)} log-probs")
    sample.response_ids = [int(t) for t in response_ids]
    sample.rollout_logprobs = [float(x) for x in logprobs]
    sample.finish_reason = finish_reason
    if tokenizer is not None:
        sample.response = tokenizer.decode(sample.response_ids, skip_special_tokens=True)
    return sample


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Tempered logits [B, V] with everything outside top-k / the top-p nucleus set to -inf.

    The nucleus keeps the smallest prefix of tokens (by probability) whose mass reaches top_p, so
    the most probable token always survives.
    """
    out = logits
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Full real-vocab logits [B, V] -> (next tokens [B] int64, their log-probs [B] fp32).

    The log-prob is log softmax(z / tau) of the chosen token over the whole vocabulary (before
    top-k/top-p), the quantity the trainer recomputes; greedy (tau = 0) reports log softmax(z).
    Sampling is by inverse CDF: one uniform per row against the running sum of exp(z / tau - max),
    the softmax distribution without normalising it or calling torch.multinomial (which costs ~6x
    more at a 18k vocabulary on CPU). `generator` must live on the logits' device.
    """
    z = logits.float()
    if sampling.temperature == 0:
        tokens = torch.argmax(z, dim=-1)
        chosen = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens, chosen - torch.logsumexp(z, dim=-1)
    inv_tau = 1.0 / sampling.temperature
    if sampling.top_k > 0 or sampling.top_p < 1.0:
        z = z * inv_tau
        filtered = filter_logits(z, sampling.top_k, sampling.top_p)
        top = filtered.max(dim=-1, keepdim=True).values
        tokens, _ = _inverse_cdf((filtered - top).exp_(), generator)
        chosen = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        return tokens, chosen - torch.logsumexp(z, dim=-1)
    # the whole vocabulary: exp(z / tau - max / tau) in one pass, and its sum is the normaliser
    top = z.max(dim=-1, keepdim=True).values
    tokens, total = _inverse_cdf(torch.add(top * -inv_tau, z, alpha=inv_tau).exp_(), generator)
    chosen = (z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - top.squeeze(-1)).double() * inv_tau
    return tokens, (chosen - total.log()).float()


def _inverse_cdf(
    weights: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unnormalised probabilities [B, V] -> (one token per row [B] drawn in proportion, row sums [B] fp64)."""
    # float64 running sums: no token's share is lost to rounding, even over a 152k vocabulary
    cdf = torch.cumsum(weights, dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, generator=generator, device=total.device) * total
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1)
    if bool((tokens == cdf.shape[-1]).any()):  # u rounded up to the total: the last token with weight
        tokens = torch.where(tokens == cdf.shape[-1], torch.argmax(cdf, dim=-1), tokens)
    return tokens, total.squeeze(-1)


# ----------------------------------------------------------------------------- registry

EngineBuilder = Callable[..., RolloutEngine]
_ENGINES: dict[str, EngineBuilder] = {}


def register_engine(name: str) -> Callable[[EngineBuilder], EngineBuilder]:
    """Decorator: register `builder(cfg, model=..., tokenizer=..., **kwargs) -> RolloutEngine`; a name
    already registered is refused (as for losses, rewards and parallel-text sources)."""

    def wrap(builder: EngineBuilder) -> EngineBuilder:
        if name in _ENGINES:
            raise ValueError(f"rollout engine {name!r} is already registered by {_ENGINES[name].__module__}")
        _ENGINES[name] = builder
        return builder

    return wrap


def known_engines() -> list[str]:
    return sorted(_ENGINES)


def build_engine(cfg, model=None, tokenizer=None, **kwargs) -> RolloutEngine:
    """The engine named by cfg.rl.rollout.engine ('embedded', 'sglang'; tests register 'fake_sglang').

    embedded needs `model` (this rank's GPTModel); the SGLang engines take `model_path` (an HF
    directory; default: a config-only directory written from cfg.model, weights arrive by sync).
    """
    name = cfg.rl.rollout.engine
    if name not in _ENGINES:
        raise ValueError(
            f"rl.rollout.engine {name!r} is not a known engine; known engines: {known_engines()}"
        )
    return _ENGINES[name](cfg, model=model, tokenizer=tokenizer, **kwargs)
