"""The RL loss inside megatron.core's schedules contract (forward_step / loss_func), any TP/PP.

    forward_step = partial(rl_forward_step, cfg=rl.loss, kl=rl.kl, vocab_size=cfg.model.vocab_size)
    get_forward_backward_func()(forward_step_func=forward_step, ...)

A micro-batch is an rl.experience.Experience (rows b of the step's batch): `tokens`, `labels`,
`position_ids`, `loss_mask` [b, s] for the model, and the RLBatch fields the loss reads by the
same names (old_logp, ref_logp, advantages, rewards, group_ids, keep, ...; `loss_fields()`).

The model runs its output layer on the response positions only (QwenGPTModel's `output_mask`);
those logits stay vocab-parallel ([1, N, V_pad / TP]) until rl.logprobs turns them into the
log-prob and entropy of each label, scattered back to [b, s]. With rl.loss.chunked_output_layer
the model hands over the final hidden states and its output weight instead (`defer_output_layer`,
a DeferredOutputLayer) and the output layer runs chunk by chunk inside the loss, never holding
[N, V] (one more output GEMM in backward). `loss_func` returns megatron's
3-tuple (loss, num_tokens, metrics), made for `calculate_per_token_loss=True` (megatron then divides gradients by the token count of
the whole global batch, across micro-batches and DP ranks):
- loss_agg 'global_tokens': (sum over response tokens, response tokens here) -> exactly the
  global-token normalisation, independent of the micro-batch split;
- 'tokens' / 'seq_mean': (micro-batch loss, 1) -> the mean of the micro-batch losses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import torch

from vepo_mcore.config.rl import KLConfig, LossConfig
from vepo_mcore.models.output_loss import DeferredOutputLayer
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.experience import Experience
from vepo_mcore.rl.logprobs import masked_policy_logprobs_and_entropy
from vepo_mcore.rl.losses.registry import compute_loss


def rl_loss_func(
    micro: Experience,
    cfg: LossConfig,
    kl: KLConfig | None,
    vocab_size: int,
    logits: torch.Tensor | DeferredOutputLayer,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """The last pipeline stage's output for the N response positions (the model's `output_mask`): a
    DeferredOutputLayer or vocab-parallel logits [1, N, V_pad / TP] -> (loss, num_tokens, metrics)."""
    mask = micro.loss_mask.bool()
    logp, entropy = masked_policy_logprobs_and_entropy(
        logits, micro.labels, mask, cfg, vocab_size, micro.temperature
    )
    per_token = cfg.loss_agg == "global_tokens"
    # per token: megatron divides the summed loss by the global token count itself
    batch = RLBatch(logp=logp, entropy=entropy, mask=mask, **micro.loss_fields(),
                    global_num_tokens=1.0 if per_token else None)  # fmt: skip
    loss, metrics = compute_loss(batch, cfg, kl)
    num_tokens = (
        mask.sum().to(torch.int) if per_token else torch.tensor(1, dtype=torch.int, device=loss.device)
    )
    metrics["loss"] = torch.stack([loss.detach().float(), num_tokens.float()])
    return loss, num_tokens, metrics


def rl_forward_step(
    data_iterator: Iterator[Experience],
    model: torch.nn.Module,
    *,
    cfg: LossConfig,
    kl: KLConfig | None,
    vocab_size: int,
) -> tuple[torch.Tensor, Callable]:
    """Next micro-batch -> (logits on the last stage / hidden states elsewhere, loss_func)."""
    micro = next(data_iterator)
    mask = micro.loss_mask.bool()
    output = model(
        micro.tokens, micro.position_ids, None, output_mask=mask, defer_output_layer=cfg.chunked_output_layer
    )
    return output, partial(rl_loss_func, micro, cfg, kl, vocab_size)
