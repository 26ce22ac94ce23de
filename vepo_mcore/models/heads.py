"""Scalar-output GPT models: the PPO critic (1 value per token) and the reward model (a score
plus error-category logits). A GPTModel whose vocab-parallel output layer is replaced by a small
head replicated on every TP rank, so TP/PP, checkpointing and the schedules work unchanged:

    critic = build_value_model(cfg)              # forward(tokens, pos, None) -> [b, s, 1]
    rm = build_value_model(cfg, num_outputs=11)  # score + 10 category logits
"""

from __future__ import annotations

import copy

import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.models.builder import build_model

LM_HEAD = "output_layer."
"""The state-dict prefix of the policy's LM head, which these models replace (the rest they share)."""

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).


class ScalarHead(torch.nn.Module):
    """hidden [s, b, h] -> [s, b, num_outputs]; call-compatible with megatron's output layer.

    The hidden states entering the output layer are identical on every TP rank, and so are this
    head's weights and gradients (like a norm's), so no TP communication is needed; with sequence
    parallelism (GPU) each rank holds a slice of the sequence, which the head gathers first.
    """

    def __init__(
        self, hidden_size: int, num_outputs: int = 1, std: float = 0.02, sequence_parallel: bool = False
    ):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(num_outputs, hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(num_outputs))
        torch.nn.init.normal_(self.weight, std=std)
        # The attribute megatron's output layers carry (GPTModel reads and toggles it).
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:
            # Each TP rank holds s/TP positions [s/TP, b, h]: gather the whole sequence. The head and
            # its loss are replicated over TP, so the backward keeps this rank's slice (no reduce).
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(
            hidden, self.weight.to(hidden.dtype), self.bias.to(hidden.dtype)
        ), None


def build_value_model(cfg: JobConfig, num_outputs: int = 1, pre_process=None, post_process=None):
    """This rank's stage of a GPTModel with a `ScalarHead` instead of the LM head (untied)."""
    if cfg.model.tie_word_embeddings:
        # A value/reward model has no LM head to tie; the input embedding stays.
        cfg = _untied(cfg)
    model = build_model(cfg, pre_process, post_process)
    if model.post_process:
        head = ScalarHead(
            cfg.model.hidden_size, num_outputs, cfg.model.init_method_std, model.config.sequence_parallel
        )
        model.output_layer = head.to(next(model.parameters()).device, next(model.parameters()).dtype)
    return model


def _untied(cfg: JobConfig) -> JobConfig:
    cfg = copy.deepcopy(cfg)
    cfg.model.tie_word_embeddings = False
    return cfg
