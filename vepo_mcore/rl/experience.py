"""From rollout samples to training tensors, and the RL forward steps in megatron's schedule contract.

Layout: each sample is `prompt_ids + response_ids`, right-padded to the batch's longest sequence.
The model reads `tokens = seq[:-1]` and predicts `targets = seq[1:]`; `mask` marks the target
positions that are response tokens, so every [B, S] tensor below is aligned with the logits and
the response-token position t (for gamma**t) is the running count of `mask`.

    exp = make_experience(samples, pad_id)                  # dict of [B, S] / [B] tensors
    exp["old_logp"], exp["entropy"] = policy_logprobs(model, exp, ...)   # forward-only, no grad
    train_step(partial(policy_forward_step, ...), iter(split_micro_batches(exp, mbs)), ...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.logprobs import logprobs_and_entropy
from vepo_mcore.rl.losses.registry import compute_loss
from vepo_mcore.rl.sample import Sample

BATCH_KEYS_2D = ("tokens", "targets", "position_ids", "mask", "old_logp", "entropy", "ref_logp", "advantages",
                 "old_values", "returns")  # fmt: skip


def make_experience(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Samples -> tokens/targets/position_ids/mask [B, S], rewards/group_ids/response_lengths [B]."""
    if not samples:
        raise ValueError("make_experience needs at least one sample")
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    width = max(len(seq) for seq in seqs) - 1
    if width < 1:
        raise ValueError("every sample needs a prompt and a response of at least one token in total")
    tokens = torch.full((len(seqs), width + 1), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width)
    for i, (seq, s) in enumerate(zip(seqs, samples)):
        tokens[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        start = len(s.prompt_ids) - 1  # target position of the first response token
        mask[i, start : start + len(s.response_ids)] = 1.0
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "targets": tokens[:, 1:].contiguous(),
        "position_ids": torch.arange(width).unsqueeze(0).expand(len(seqs), -1).contiguous(),
        "mask": mask,
        "rewards": torch.tensor([s.reward for s in samples], dtype=torch.float32),
        "group_ids": torch.tensor([s.group_id for s in samples], dtype=torch.long),
        "response_lengths": torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long),
    }


def split_micro_batches(exp: dict[str, Any], micro_batch_size: int) -> list[dict[str, Any]]:
    """Row slices of every tensor (scalars and non-tensors are shared)."""
    n = exp["tokens"].shape[0]
    return [
        {
            k: (v[i : i + micro_batch_size] if isinstance(v, torch.Tensor) and v.dim() > 0 else v)
            for k, v in exp.items()
        }
        for i in range(0, n, micro_batch_size)
    ]


def _schedule(model, micro_batches: list[dict], forward_step: Callable, forward_only: bool):
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(micro_batches),
        model=[model],
        num_microbatches=len(micro_batches),
        seq_length=micro_batches[0]["tokens"].shape[1],
        micro_batch_size=micro_batches[0]["tokens"].shape[0],
        forward_only=forward_only,
    )


def _broadcast_from_last_stage(tensors: list[torch.Tensor]) -> None:
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return
    src, group = ps.get_pipeline_model_parallel_last_rank(), ps.get_pipeline_model_parallel_group()
    for t in tensors:
        dist.broadcast(t, src=src, group=group)


@torch.no_grad()
def policy_logprobs(
    model, exp: dict[str, Any], micro_batch_size: int, temperature: float, vocab_size: int,
    chunk_size: int = 1024, topk_frac: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Forward-only log-probs and entropies of `exp["targets"]` under softmax(z / tau), [B, S] each,
    on every pipeline rank (computed on the last stage and broadcast)."""
    from megatron.core import parallel_state as ps

    micro = split_micro_batches(exp, micro_batch_size)
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        logits = module(mb["tokens"], mb["position_ids"], None)

        def stash(output):
            outputs.append(
                logprobs_and_entropy(
                    output, mb["targets"], temperature, chunk_size, vocab_size, topk_frac=topk_frac
                )
            )
            return output.new_zeros(()), torch.ones((), dtype=torch.int), {}

        return logits, stash

    was_training = model.training
    model.eval()
    _schedule(model, micro, forward_step, forward_only=True)
    model.train(was_training)
    shape = exp["targets"].shape
    if ps.is_pipeline_last_stage(ignore_virtual=True):
        logp = torch.cat([o[0] for o in outputs]).float()
        entropy = torch.cat([o[1] for o in outputs]).float()
    else:
        logp, entropy = torch.empty(shape), torch.empty(shape)
    _broadcast_from_last_stage([logp, entropy])
    return logp * exp["mask"], entropy * exp["mask"]


@torch.no_grad()
def critic_values(critic, exp: dict[str, Any], micro_batch_size: int) -> torch.Tensor:
    """Forward-only critic values V(s_t) at every target position, [B, S] on every pipeline rank."""
    from megatron.core import parallel_state as ps

    micro = split_micro_batches(exp, micro_batch_size)
    outputs: list[torch.Tensor] = []

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        values = module(mb["tokens"], mb["position_ids"], None)

        def stash(output):
            outputs.append(output[..., 0].float())
            return output.new_zeros(()), torch.ones((), dtype=torch.int), {}

        return values, stash

    critic.eval()
    _schedule(critic, micro, forward_step, forward_only=True)
    critic.train()
    values = (
        torch.cat(outputs)
        if ps.is_pipeline_last_stage(ignore_virtual=True)
        else torch.empty(exp["mask"].shape)
    )
    _broadcast_from_last_stage([values])
    return values * exp["mask"]


def rl_batch(mb: dict[str, Any], logp: torch.Tensor, entropy: torch.Tensor | None, **extra) -> RLBatch:
    """A micro-batch dict + the current policy's outputs -> the RLBatch a registered loss consumes."""
    return RLBatch(
        logp=logp,
        old_logp=mb["old_logp"],
        mask=mb["mask"],
        entropy=entropy,
        ref_logp=mb.get("ref_logp"),
        rewards=mb["rewards"],
        group_ids=mb["group_ids"],
        advantages=mb.get("advantages"),
        old_values=mb.get("old_values"),
        returns=mb.get("returns"),
        response_lengths=mb["response_lengths"],
        max_response_length=mb.get("max_response_length"),
        **extra,
    )


def _loss_return(loss: torch.Tensor, mask: torch.Tensor, agg: str, metrics: dict):
    """megatron's per-token-loss contract (loss, count, report): gradients are divided by the summed
    count of the global batch. 'global_tokens' returns (mean * n, n) so the step optimises the
    token mean of the whole global batch, independent of the micro-batch split; other modes
    return (loss, 1): the mean over micro-batches of the per-micro-batch loss."""
    report = {k: torch.as_tensor(v, dtype=torch.float32).detach().reshape(()) for k, v in metrics.items()}
    if agg == "global_tokens":
        n = mask.sum()
        report["loss"] = torch.stack([(loss * n).detach(), n.detach().float()])
        return loss * n, n.to(torch.int), report
    report["loss"] = loss.detach().reshape(())
    return loss, torch.ones((), dtype=torch.int), report


def policy_forward_step(
    data_iterator: Iterator[dict], model, *, loss_cfg: LossConfig, kl_cfg: KLConfig, vocab_size: int
):
    """megatron forward_step for the policy: vocab-parallel logits -> fused log-prob/entropy -> loss."""
    mb = next(data_iterator)
    logits = model(mb["tokens"], mb["position_ids"], None)
    micro_cfg = (
        dataclasses.replace(loss_cfg, loss_agg="tokens") if loss_cfg.loss_agg == "global_tokens" else loss_cfg
    )

    def loss_func(output):
        logp, entropy = logprobs_and_entropy(
            output, mb["targets"], loss_cfg.temperature, loss_cfg.logprob_chunk_size, vocab_size,
            topk_frac=loss_cfg.entropy_topk_frac,
        )  # fmt: skip
        loss, metrics = compute_loss(rl_batch(mb, logp, entropy), micro_cfg, kl_cfg)
        return _loss_return(loss, mb["mask"], loss_cfg.loss_agg, metrics)

    return logits, loss_func


def critic_forward_step(data_iterator: Iterator[dict], model, *, loss_cfg: LossConfig):
    """megatron forward_step for the PPO critic: clipped value loss against the GAE returns."""
    from vepo_mcore.rl.losses.ppo import value_loss

    mb = next(data_iterator)
    values = model(mb["tokens"], mb["position_ids"], None)
    agg = "tokens" if loss_cfg.loss_agg == "global_tokens" else loss_cfg.loss_agg

    def loss_func(output):
        v = output[..., 0].float()
        batch = rl_batch(mb, v, None)
        loss, clip_frac = value_loss(v, mb["old_values"], mb["returns"], batch, loss_cfg.value_clip, agg)
        return _loss_return(loss, mb["mask"], loss_cfg.loss_agg, {"critic/clip_frac": clip_frac})

    return values, loss_func


def bind(step: Callable, **kwargs) -> Callable:
    return partial(step, **kwargs)
