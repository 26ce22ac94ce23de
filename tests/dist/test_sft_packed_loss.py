"""Packed SFT trains on exactly what unpacked SFT trains on: through the LM forward step (megatron
GPTModel, local spec, fp32), the per-token losses of a packed micro-batch (block-diagonal mask
built from segment_ids, position ids restarting per conversation) equal those of each
conversation run alone, and so do the loss sums the optimizer sees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.dist.model_utils import VOCAB, tiny_cfg
from vepo_mcore.data.sft import pack_conversations
from vepo_mcore.parallel.launch import run_processes

LENGTHS = (9, 14, 6, 11, 17)  # ids per conversation: 8 + 13 + ... tokens, two packed rows of 32


def _forward(model, batch):
    from vepo_mcore.training.forward import forward_step

    output, loss_func = forward_step(iter([batch]), model)
    loss_sum, num_tokens, _ = loss_func(output)
    return output, float(loss_sum), int(num_tokens)


def _check(rank: int, world: int) -> None:
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    cfg = tiny_cfg(num_layers=2)
    cfg.model.init_method_std = 0.2  # logits far from uniform: a leak between conversations shows
    init_model_parallel(cfg.parallel, seed=3)
    model = build_model(cfg).eval()
    rng = np.random.default_rng(0)
    encoded = [(rng.integers(0, VOCAB, n), rng.random(n) < 0.6) for n in LENGTHS]
    packed = pack_conversations(encoded, seq_length=32, pad_id=0)
    assert packed.tokens.shape == (2, 32) and (packed.segment_ids == -1).any()  # two rows, padding
    batch = packed.tensors()  # no dense mask: built from these
    with torch.no_grad():
        packed_loss, packed_sum, packed_count = _forward(model, dict(batch))
        alone_sum, alone_count = 0.0, 0
        for row in range(2):
            for segment in sorted(set(packed.segment_ids[row].tolist()) - {-1}):
                span = np.flatnonzero(packed.segment_ids[row] == segment)
                n = len(span)
                alone = {
                    "tokens": batch["tokens"][row, span].unsqueeze(0),
                    "labels": batch["labels"][row, span].unsqueeze(0),
                    "loss_mask": batch["loss_mask"][row, span].unsqueeze(0),
                }
                assert batch["position_ids"][row, span].tolist() == list(range(n))
                loss, s, c = _forward(model, alone)
                diff = (packed_loss[row, span] - loss[0]).abs().max().item()
                assert diff < 1e-5, f"row {row} conversation {segment}: packed per-token loss off by {diff}"
                alone_sum, alone_count = alone_sum + s, alone_count + c
        assert packed_count == alone_count == int(packed.loss_mask.sum()) > 0
        assert abs(packed_sum - alone_sum) < 1e-4 * max(1.0, abs(alone_sum)), (packed_sum, alone_sum)
        # Without segment ids the conversations would attend to each other: the check above can fail.
        leaky = {k: v for k, v in batch.items() if k != "segment_ids"}
        _, leaky_sum, _ = _forward(model, leaky)
        assert abs(leaky_sum - packed_sum) > 1e-3, "packing without the mask did not change the loss"


@pytest.mark.dist
def test_packed_sft_losses_equal_each_conversation_alone():
    run_processes(_check, 1)
