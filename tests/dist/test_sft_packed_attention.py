"""Packed SFT samples keep conversations apart inside the real model: the logits of each packed
conversation equal the logits of that conversation run alone (megatron GPTModel, local spec, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vepo_mcore.config import JobConfig
from vepo_mcore.data.sft import block_causal_mask, pack_conversations
from vepo_mcore.parallel.launch import run_processes

VOCAB = 500


def _tiny_cfg() -> JobConfig:
    cfg = JobConfig()
    cfg.model.num_layers = 2
    cfg.model.vocab_size = VOCAB
    cfg.model.make_vocab_size_divisible_by = 64
    return cfg


def _check(rank: int, world: int) -> None:
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    cfg = _tiny_cfg()
    init_model_parallel(cfg.parallel, seed=5)
    model = build_model(cfg).eval()
    rng = np.random.default_rng(0)
    lengths = (9, 14, 6)
    encoded = [(rng.integers(0, VOCAB, n), rng.random(n) < 0.5) for n in lengths]
    packed = pack_conversations(encoded, seq_length=40, pad_id=0)
    assert packed.tokens.shape == (1, 40)
    tokens = torch.from_numpy(packed.tokens).long()
    positions = torch.from_numpy(packed.position_ids).long()
    segments = torch.from_numpy(packed.segment_ids).long()
    with torch.no_grad():
        logits = model(tokens, positions, block_causal_mask(segments))
        offset = 0
        for ids, _ in encoded:
            n = len(ids) - 1
            alone_tokens = torch.from_numpy(ids[:-1]).unsqueeze(0)
            alone = model(alone_tokens, torch.arange(n).unsqueeze(0), None)
            diff = (logits[0, offset : offset + n, :VOCAB] - alone[0, :, :VOCAB]).abs().max().item()
            assert diff < 1e-5, f"packed conversation at {offset} differs from running it alone by {diff}"
            offset += n
        # Without the block mask the later conversations would see the earlier ones.
        leaky = model(tokens, positions, None)
        n0 = lengths[0] - 1
        assert (leaky[0, n0 : n0 + 5, :VOCAB] - logits[0, n0 : n0 + 5, :VOCAB]).abs().max().item() > 1e-4


@pytest.mark.dist
def test_packed_conversations_do_not_attend_to_each_other():
    run_processes(_check, 1)
