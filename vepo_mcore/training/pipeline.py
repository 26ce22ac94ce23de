"""Megatron's pipeline schedule over a list of micro-batches, and the last stage's results sent to
every stage: the two calls every forward pass outside the training loop needs (RL experience,
reward-model scoring)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).


def forward_backward(
    model, micro_batches: list, forward_step: Callable, forward_only: bool, shape: tuple[int, int]
) -> list:
    """Megatron's schedule (any PP) over a list of micro-batches (whatever `forward_step` reads);
    `shape` = (rows, sequence length) of their tokens, the pipeline's activation shape (at PP > 1
    every micro-batch must have it)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    return get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(micro_batches),
        model=[model],
        num_microbatches=len(micro_batches),
        seq_length=shape[1],
        micro_batch_size=shape[0],
        forward_only=forward_only,
    )


def broadcast_from_last_stage(tensors: list[torch.Tensor]) -> None:
    """In place: every pipeline stage gets the last stage's tensors (which the others pre-allocate)."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() == 1:
        return
    src, group = ps.get_pipeline_model_parallel_last_rank(), ps.get_pipeline_model_parallel_group()
    for t in tensors:
        dist.broadcast(t, src=src, group=group)
