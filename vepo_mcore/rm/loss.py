"""Reward-model loss: Bradley-Terry on (better, worse) plus multi-label BCE on the category logits.

    loss_sum, n_pairs, report = rm_loss(outputs, last, labels, bce_weight=1.0, pos_weight=w)
    forward_step = make_forward_step(bce_weight, pos_weight)   # megatron's forward_step contract

Outputs are read at each row's last real token: channel 0 the score, channels 1..10 the logits of
corruptions.CATEGORIES. Per pair: -log sigmoid(s_better - s_worse) + bce_weight * mean over its two
sequences and ten categories of BCE(logit, label) (clean references are all-zero), where a
positive label's term is multiplied by pos_weight[category] (rm/data.py positive_weights).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from vepo_mcore.parallel.device import device


def gather_last(outputs: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """outputs [n, s, k], last [n] -> [n, k] at each row's last real token."""
    return outputs[torch.arange(outputs.shape[0], device=outputs.device), last.to(outputs.device)]


def rm_loss(
    outputs: torch.Tensor,
    last: torch.Tensor,
    labels: torch.Tensor,
    bce_weight: float = 1.0,
    pos_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """outputs [2B, s, 11] (rows :B better, B: worse), last [2B], labels [2B, 10], pos_weight [10].

    Returns (loss summed over the B pairs, B as an int tensor, report of [sum, count] pairs):
    with megatron's calculate_per_token_loss the step averages over every pair of the global batch.
    """
    at = gather_last(outputs, last).float()
    b = at.shape[0] // 2
    margin = at[:b, 0] - at[b:, 0]
    bt = -F.logsigmoid(margin)
    if pos_weight is not None:
        pos_weight = pos_weight.to(at)
    bce = F.binary_cross_entropy_with_logits(
        at[:, 1:], labels.to(at), reduction="none", pos_weight=pos_weight
    ).mean(-1)
    bce = (bce[:b] + bce[b:]) / 2
    loss = (bt + bce_weight * bce).sum()
    n = torch.tensor(b, device=at.device)
    report = {
        "loss": torch.stack([loss.detach(), n.float()]),
        "bt_loss": torch.stack([bt.detach().sum(), n.float()]),
        "bce_loss": torch.stack([bce.detach().sum(), n.float()]),
        "pair_acc": torch.stack([(margin.detach() > 0).float().sum(), n.float()]),
    }
    return loss, n.to(torch.int), report


def positions(tokens: torch.Tensor) -> torch.Tensor:
    """[n, s] -> [n, s] position ids 0..s-1."""
    return torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0).expand_as(tokens)


def flatten_pairs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A stacked micro-batch of pairs {k: [B, 2, ...]} -> {k: [2B, ...]}: better rows, then worse rows."""
    return {k: v.transpose(0, 1).reshape(-1, *v.shape[2:]) for k, v in batch.items()}


def make_forward_step(bce_weight: float = 1.0, pos_weight: torch.Tensor | None = None):
    """A megatron forward_step(data_iterator, model) -> (output, loss_func) for RM training on
    micro-batches of rm.data.PairDataset items."""

    def forward_step(data_iterator, model):

        batch = {k: v.to(device()) for k, v in flatten_pairs(next(data_iterator)).items()}
        out = model(batch["tokens"], positions(batch["tokens"]), None)
        loss_func = functools.partial(
            rm_loss, last=batch["last"], labels=batch["labels"], bce_weight=bce_weight, pos_weight=pos_weight
        )
        return out, loss_func

    return forward_step
