"""GPU path of packed SFT: on the Transformer Engine spec the LM forward step sends a packed
micro-batch as THD (cu_seqlens), and each conversation's per-token losses equal those of the
conversation run alone (bf16, so to a loose tolerance). Skipped without CUDA and transformer_engine."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from tests.dist.model_utils import VOCAB, tiny_cfg

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="transformer_engine missing"
)


@pytest.fixture
def cleanup():
    yield
    from vepo_mcore.parallel import destroy

    destroy()


def test_thd_packed_losses_equal_each_conversation_alone(cleanup):
    from vepo_mcore.data.packing import attention_takes_thd
    from vepo_mcore.data.sft import pack_conversations
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_distributed, init_model_parallel
    from vepo_mcore.training.forward import forward_step

    cfg = tiny_cfg(num_layers=2)
    cfg.model.transformer_impl = "transformer_engine"
    cfg.training.bf16 = True
    init_distributed("nccl", rank=0, world_size=1)
    init_model_parallel(cfg.parallel, seed=1)
    model = build_model(cfg).eval()
    assert attention_takes_thd(model)
    rng = np.random.default_rng(0)
    encoded = [(rng.integers(0, VOCAB, n), np.ones(n, dtype=bool)) for n in (17, 25, 9, 30)]
    p = pack_conversations(encoded, seq_length=48, pad_id=0)
    batch = p.tensors()
    rows, seq = batch["tokens"].shape
    with torch.no_grad():
        packed, _ = forward_step(iter([batch]), model)  # [1, rows * seq]
        packed = packed.reshape(rows, seq).float()
        for row in range(rows):
            for segment in sorted(set(p.segment_ids[row].tolist()) - {-1}):
                span = np.flatnonzero(p.segment_ids[row] == segment)
                alone = {k: batch[k][row, span].unsqueeze(0) for k in ("tokens", "labels", "loss_mask")}
                loss, _ = forward_step(iter([alone]), model)
                diff = (packed[row, span] - loss[0].float()).abs().max().item()
                assert diff < 5e-2, f"row {row} conversation {segment}: THD loss off by {diff}"
