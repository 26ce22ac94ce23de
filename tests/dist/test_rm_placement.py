"""The reward term `rm` scores the same with rl.rewards.rm_placement 'resident' and 'offload' (a tiny
RM checkpoint, real ChatML-encoded FLORES pairs, several micro-batches), call after call; with
'offload' the loaded RM's parameters and buffers are its host copies between calls."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import tiny_cfg
from vepo_mcore.parallel.launch import run_processes


def _scores(rank, world, tmp):
    from vepo_mcore.config.rewards import RewardsConfig
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rewards.registry import run_reward
    from vepo_mcore.rm import reward as rm_term
    from vepo_mcore.rm.data import build_pairs
    from vepo_mcore.rm.model import build_reward_model
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.training.checkpointing import save_checkpoint
    from vepo_mcore.translation.sample import Sample

    tok = load_tokenizer()
    cfg = tiny_cfg(num_layers=2)
    cfg.model.vocab_size, cfg.model.transformer_impl, cfg.training.seq_length = len(tok), "local", 96
    init_model_parallel(cfg.parallel, seed=3)
    model = build_reward_model(cfg)
    torch.nn.init.normal_(model.output_layer.weight, std=0.5)  # scores far from 0, so a mismatch shows
    save_checkpoint(f"{tmp}/rm", 1, model, config=cfg)
    del model

    pairs = build_pairs(
        "devtest", ("th", "en", "my"), range(2), ("accuracy", "leakage"), seed=2, tokenizer=tok
    )
    samples = [Sample(prompt=p.prompt, response=r) for p in pairs for r in (p.better, p.worse)]
    ckpt = f"{tmp}/rm"

    def score(placement):
        rewards = RewardsConfig(mt="rm", rm_checkpoint=ckpt, rm_placement=placement, rm_batch_size=3)
        rewards.validate()
        got = run_reward("rm", samples, rewards)
        return got.values, got.raw

    rm_term.clear_cache()
    resident = [score("resident") for _ in range(2)]
    model, mover = rm_term.loaded_model(ckpt, "resident")
    assert mover is None and all(p.device.type == "cpu" for p in model.parameters())
    assert len(samples) > 3 and max(abs(v) for v in resident[0][0]) > 0.1

    offloaded = []
    for _ in range(3):
        offloaded.append(score("offload"))
        model, mover = rm_term.loaded_model(ckpt, "offload")
        # Between calls the module holds the host copies, not the tensors it scored with.
        assert not mover.resident
        assert [p.data_ptr() for p in model.parameters()] == [t.data_ptr() for t in mover.host_params]
        assert [b.data_ptr() for b in model.buffers()] == [t.data_ptr() for t in mover.host_buffers]
    assert mover.nbytes == sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    # Bit for bit: the same weights, the same micro-batches.
    assert all(got == resident[0] for got in resident + offloaded)
    rm_term.clear_cache()


@pytest.mark.dist
def test_rm_scores_equal_resident_and_offloaded(tmp_path):
    run_processes(_scores, 1, args=(str(tmp_path),))
