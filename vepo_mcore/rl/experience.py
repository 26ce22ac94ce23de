"""From rollout samples to training tensors, and the RL forward steps in megatron's schedule contract.

Layout: each sample is `prompt_ids + response_ids`, right-padded to the batch's longest sequence.
The model reads `tokens = seq[:-1]` and predicts `labels = seq[1:]`; `loss_mask` marks the label
positions that are response tokens, so every [B, S] tensor below is aligned with the logits and
the response-token position t (for gamma**t) is the running count of `mask`.

    exp = make_experience(samples, pad_id)                  # dict of [B, S] / [B] tensors
    exp["old_logp"], exp["entropy"] = policy_logprobs(model, exp, ...)   # forward-only, no grad
    train_step(partial(rl_forward_step, ...), iter(split_micro_batches(exp, mbs)), ...)

The [B, S] keys follow megatron's GPTDataset and rl.losses.loss_func: tokens, labels, loss_mask,
position_ids; plus the RLBatch fields by name (old_logp, ref_logp, advantages, rewards, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from vepo_mcore.config.rl import LossConfig
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.logprobs import masked_policy_logprobs_and_entropy
from vepo_mcore.training.pipeline import broadcast_from_last_stage, forward_backward
from vepo_mcore.translation.sample import Sample


def make_experience(samples: list[Sample], pad_id: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Samples -> tokens/labels/position_ids/loss_mask [B, S], rewards/group_ids/response_lengths [B].

    S is the longest prompt + response minus one, rounded up to `multiple` (FP8 needs 16:
    vepo_mcore.models.fp8.token_multiple); the padding is masked out of the loss."""
    if not samples:
        raise ValueError("make_experience needs at least one sample")
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    width = max(len(seq) for seq in seqs) - 1
    if width < 1:
        raise ValueError("every sample needs a prompt and a response of at least one token in total")
    width = -(-width // multiple) * multiple
    tokens = torch.full((len(seqs), width + 1), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width)
    for i, (seq, s) in enumerate(zip(seqs, samples)):
        tokens[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        start = len(s.prompt_ids) - 1  # target position of the first response token
        mask[i, start : start + len(s.response_ids)] = 1.0
    return {
        "tokens": tokens[:, :-1].contiguous(),
        "labels": tokens[:, 1:].contiguous(),
        "position_ids": torch.arange(width).unsqueeze(0).expand(len(seqs), -1).contiguous(),
        "loss_mask": mask,
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


@torch.no_grad()
def policy_logprobs(
    model, exp: dict[str, Any], micro_batch_size: int, loss_cfg: LossConfig, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward-only log-probs and entropies of `exp["labels"]`, [B, S] each, as the loss reads them
    (rl.logprobs.policy_logprobs_and_entropy), on every pipeline rank (computed on the last stage
    and broadcast)."""
    from megatron.core import parallel_state as ps

    micro = split_micro_batches(exp, micro_batch_size)
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        mask = mb["loss_mask"].bool()  # logits of the response positions only
        logits = module(mb["tokens"], mb["position_ids"], None, output_mask=mask)

        def stash(output):
            outputs.append(
                masked_policy_logprobs_and_entropy(output, mb["labels"], mask, loss_cfg, vocab_size)
            )
            return output.new_zeros(()), torch.ones((), dtype=torch.int), {}

        return logits, stash

    was_training = model.training
    model.eval()
    forward_backward(model, micro, forward_step, forward_only=True)
    model.train(was_training)
    shape = exp["labels"].shape
    if ps.is_pipeline_last_stage(ignore_virtual=True):
        logp = torch.cat([o[0] for o in outputs]).float()
        entropy = torch.cat([o[1] for o in outputs]).float()
    else:
        # Allocated where the batch lives: NCCL broadcasts device tensors only.
        logp, entropy = (torch.empty(shape, device=exp["loss_mask"].device) for _ in range(2))
    broadcast_from_last_stage([logp, entropy])
    return logp * exp["loss_mask"], entropy * exp["loss_mask"]


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
    forward_backward(critic, micro, forward_step, forward_only=True)
    critic.train()
    values = (
        torch.cat(outputs)
        if ps.is_pipeline_last_stage(ignore_virtual=True)
        else torch.empty(exp["loss_mask"].shape, device=exp["loss_mask"].device)
    )
    broadcast_from_last_stage([values])
    return values * exp["loss_mask"]


def critic_forward_step(data_iterator: Iterator[dict], model, *, loss_cfg: LossConfig):
    """megatron forward_step for the PPO critic: clipped value loss against the GAE returns."""
    from vepo_mcore.rl.losses.ppo import value_loss

    mb = next(data_iterator)
    values = model(mb["tokens"], mb["position_ids"], None)
    agg = "tokens" if loss_cfg.loss_agg == "global_tokens" else loss_cfg.loss_agg

    def loss_func(output):
        v = output[..., 0].float()
        batch = RLBatch(
            logp=v, old_logp=mb["old_values"], mask=mb["loss_mask"], response_lengths=mb["response_lengths"]
        )
        loss, clip_frac = value_loss(v, mb["old_values"], mb["returns"], batch, loss_cfg.value_clip, agg)
        if loss_cfg.loss_agg == "global_tokens":  # same per-token contract as rl_loss_func
            n = mb["loss_mask"].sum()
            return loss * n, n.to(torch.int), {"loss": torch.stack([(loss * n).detach(), n.float()])}
        one = torch.ones((), dtype=torch.int, device=loss.device)  # stacked with the loss below
        return loss, one, {"loss": torch.stack([loss.detach(), one.float()]), "clip_frac": clip_frac}

    return values, loss_func
