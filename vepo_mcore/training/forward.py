"""The language-model forward step in megatron.core's schedules contract (CPT and SFT share it).

    forward_step(data_iterator, model) -> (output_tensor, loss_func)

A micro-batch is a dict of [b, s] tensors: `tokens`, `labels`, `loss_mask` (1 = counts; SFT
sets it on assistant tokens only), optional `position_ids` (packed SFT restarts them per
conversation) and `attention_mask`. This is the field set of megatron.core's GPTDataset.
Packed SFT adds `segment_ids`: on Transformer Engine the micro-batch goes in as THD with
megatron's PackedSeqParams (data/packing.py); on the local spec the block-diagonal mask keeps the
conversations apart (built here from segment_ids when the dataset left it out).

`loss_func` returns (loss_sum, num_tokens, {"loss": [loss_sum, num_tokens]}): with
`calculate_per_token_loss=True` (set by optimizer.wrap_model) megatron divides the gradients by
the token count of the whole global batch, so the loss is the exact token average across
micro-batches and DP ranks. The logging entry carries the sum and the count for the same reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import torch

from vepo_mcore.data.sft import block_causal_mask
from vepo_mcore.parallel.device import device

# Imported where used: megatron.core and vepo_mcore.data.packing (pulls megatron.core): heavy, seconds to
# import; the trainers import this module before they take the save folder's lock.

BATCH_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask", "segment_ids")


def batch_to_device(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Move the known fields to this rank's device; fill position_ids (0..s-1) and loss_mask (ones)."""
    dev = device()
    out = {k: v.to(dev, non_blocking=True) for k, v in batch.items() if k in BATCH_KEYS and v is not None}
    if "tokens" not in out or "labels" not in out:
        raise ValueError(f"a training micro-batch needs 'tokens' and 'labels'; got keys {sorted(batch)}")
    tokens = out["tokens"]
    if "position_ids" not in out:
        out["position_ids"] = torch.arange(tokens.shape[1], device=dev).unsqueeze(0).expand_as(tokens)
    if "loss_mask" not in out:
        out["loss_mask"] = torch.ones_like(tokens, dtype=torch.float32)
    return out


def masked_token_loss(
    loss_mask: torch.Tensor, per_token_loss: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """(loss_mask [b, s], per_token_loss [b, s]) -> (loss_sum [], num_tokens [] int, logging dict).

    The logging entry `loss` is [loss_sum, num_tokens] (detached), summed over micro-batches
    and DP ranks before dividing.
    """
    mask = loss_mask.reshape(-1).float()
    loss_sum = torch.sum(per_token_loss.reshape(-1).float() * mask)
    num_tokens = mask.sum().to(torch.int)
    report = torch.stack([loss_sum.detach(), num_tokens.float()])
    return loss_sum, num_tokens, {"loss": report}


def forward_step(data_iterator: Iterator[dict], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
    """Next micro-batch -> (per-token loss [b, s] on the last stage / hidden states elsewhere, loss_func).

    Every pipeline stage draws from the iterator so the data position stays the same on all ranks;
    only the first stage uses the tokens and only the last one the labels.
    """
    batch = batch_to_device(next(data_iterator))
    packed = {}
    if "segment_ids" in batch:
        batch, packed = _packed_attention(batch, model)
    output = model(
        batch["tokens"],
        batch["position_ids"],
        batch.get("attention_mask"),
        labels=batch["labels"],
        output_mask=batch["loss_mask"] > 0,  # the output layer only where the loss counts
        loss_mask=batch["loss_mask"],  # loss_func's weights: the model builds the gradients in forward
        **packed,
    )
    return output, partial(masked_token_loss, batch["loss_mask"])


def _packed_attention(batch: dict[str, torch.Tensor], model) -> tuple[dict[str, torch.Tensor], dict]:
    """Packed conversations kept apart: THD + packed_seq_params on TE, else the block-diagonal mask."""
    from megatron.core.utils import get_attr_wrapped_model

    from vepo_mcore.data.packing import attention_takes_thd, thd_token_multiple, to_thd

    if attention_takes_thd(model):
        config = get_attr_wrapped_model(model, "config")
        if getattr(config, "context_parallel_size", 1) > 1:
            # THD under CP needs each conversation padded to 2 x CP and split per rank (Megatron-LM's
            # get_thd_batch_on_this_cp_rank with cu_seqlens_padded); not wired here.
            raise ValueError(
                "packed SFT on Transformer Engine with parallel.context_parallel_size > 1 is not supported; "
                "use parallel.context_parallel_size=1 or data.sft_packing=false"
            )
        multiple = thd_token_multiple(
            config.fp8 is not None, config.tensor_model_parallel_size, config.sequence_parallel
        )
        batch, params = to_thd(batch, multiple)  # the loss mask comes back [1, T] too: the loss sums it
        return batch, {"packed_seq_params": params}
    if "attention_mask" not in batch:
        batch["attention_mask"] = block_causal_mask(batch["segment_ids"])
    return batch, {}
