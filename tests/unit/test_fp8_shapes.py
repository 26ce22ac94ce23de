"""FP8 alignment: misaligned settings are named before Transformer Engine sees them, and RL batches
are padded to the token multiple FP8 needs (TE: leading dims % 8, inner dim % 16)."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import tiny_cfg
from vepo_mcore.models.fp8 import check_fp8_shapes, fp8_shape_errors, token_multiple
from vepo_mcore.rl.experience import make_experience
from vepo_mcore.translation.sample import Sample


def fp8_cfg(tp: int = 1, sequence_parallel: bool = False):
    cfg = tiny_cfg(tp=tp)  # hidden 64, ffn 128, 4 heads of 16, 2 KV groups
    cfg.model.fp8.format = "hybrid"
    cfg.parallel.sequence_parallel = sequence_parallel
    cfg.training.micro_batch_size = 2
    cfg.training.seq_length = 64
    return cfg


def test_aligned_shapes_pass_and_fp8_off_checks_nothing():
    check_fp8_shapes(fp8_cfg())
    cfg = fp8_cfg()
    cfg.model.fp8.format = None
    cfg.model.hidden_size = 60
    assert fp8_shape_errors(cfg) == [] and token_multiple(cfg) == 1


def test_each_misaligned_setting_is_named():
    cfg = fp8_cfg(tp=2)
    cfg.model.ffn_hidden_size = 136  # 68 per TP rank
    cfg.training.seq_length = 63  # 126 tokens per micro-batch
    with pytest.raises(ValueError) as err:
        check_fp8_shapes(cfg)
    msg = str(err.value)
    assert "model.ffn_hidden_size / TP = 68" in msg
    assert "training.micro_batch_size * training.seq_length = 126" in msg
    assert "model.hidden_size" not in msg


def test_sequence_parallel_multiplies_the_token_multiple():
    assert token_multiple(fp8_cfg(tp=2)) == 16
    cfg = fp8_cfg(tp=2, sequence_parallel=True)
    assert token_multiple(cfg) == 32
    cfg.training.micro_batch_size, cfg.training.seq_length = 1, 48
    assert any("with sequence parallelism" in e for e in fp8_shape_errors(cfg))


def test_rl_experience_pads_to_the_multiple_and_masks_the_padding():
    samples = [Sample(prompt_ids=[1, 2, 3], response_ids=[4, 5]), Sample(prompt_ids=[1, 2], response_ids=[6])]
    plain = make_experience(samples, pad_id=0)
    padded = make_experience(samples, pad_id=0, multiple=16)
    assert plain.tokens.shape == (2, 4) and padded.tokens.shape == (2, 16)
    for key in ("tokens", "labels", "loss_mask"):
        assert torch.equal(getattr(padded, key)[:, :4], getattr(plain, key))
    assert padded.loss_mask[:, 4:].sum() == 0 and padded.loss_mask.sum() == plain.loss_mask.sum()
    assert torch.equal(padded.position_ids[0], torch.arange(16))
