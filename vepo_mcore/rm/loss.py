"""Reward-model loss: Bradley-Terry on (better, worse) plus multi-label BCE on the category logits.

    loss_sum, n_pairs, report = rm_loss(outputs, last, labels, bce_weight=1.0)
    out, loss_func = rm_forward_step(data_iterator, model)     # megatron's forward_step contract

Outputs are read at each row's last real token: channel 0 the score, channels 1..10 the logits of
corruptions.CATEGORIES. Per pair: -log sigmoid(s_better - s_worse) + bce_weight * mean over its two
sequences and ten categories of BCE(logit, label) (clean references are all-zero).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def gather_last(outputs: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """outputs [n, s, k], last [n] -> [n, k] at each row's last real token."""
    return outputs[torch.arange(outputs.shape[0], device=outputs.device), last.to(outputs.device)]


def rm_loss(
    outputs: torch.Tensor, last: torch.Tensor, labels: torch.Tensor, bce_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """outputs [2B, s, 11] (rows :B better, B: worse), last [2B], labels [2B, 10].

    Returns (loss summed over the B pairs, B as an int tensor, report of [sum, count] pairs):
    with megatron's calculate_per_token_loss the step averages over every pair of the global batch.
    """
    at = gather_last(outputs, last).float()
    b = at.shape[0] // 2
    margin = at[:b, 0] - at[b:, 0]
    bt = -F.logsigmoid(margin)
    bce = F.binary_cross_entropy_with_logits(at[:, 1:], labels.to(at), reduction="none").mean(-1)
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


def make_forward_step(bce_weight: float = 1.0):
    """A megatron forward_step(data_iterator, model) -> (output, loss_func) for RM training."""

    def forward_step(data_iterator, model):
        from vepo_mcore.parallel.device import device

        batch = {k: v.to(device()) for k, v in next(data_iterator).items()}
        out = model(batch["tokens"], positions(batch["tokens"]), None)
        loss_func = functools.partial(
            rm_loss, last=batch["last"], labels=batch["labels"], bce_weight=bce_weight
        )
        return out, lambda output: loss_func(output)

    return forward_step
