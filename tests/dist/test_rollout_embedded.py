"""The embedded engine: the same tokens at TP=1, TP=2 and PP=2 from the same weights (moved between
layouts by dist_checkpointing); at TP=2 the shared contract suite and greedy == a cache-free recompute loop.
One set of 2 processes runs it all: spawning and importing dominate the time of these tests."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import VOCAB, gather_logits, load_model, positions, save_model, tiny_cfg
from vepo_mcore.parallel.launch import run_processes


def _cfg(tp=1, pp=1):
    cfg = tiny_cfg(tp=tp, pp=pp, num_layers=2)
    cfg.model.init_method_std = 0.2  # peaked logits: greedy choices far from ties
    cfg.rl.rollout.engine = "embedded"
    cfg.rl.rollout.batch_size = 2  # 3 prompts -> two batches, the second smaller
    return cfg


def _build(cfg, seed=1):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    init_model_parallel(cfg.parallel, seed=seed)
    return build_model(cfg)


def _megatron_reference(model):
    def reference(prompt_ids, response_ids, tau):
        ids = torch.tensor([list(prompt_ids) + list(response_ids)])
        with torch.no_grad():
            logits = gather_logits(model(ids, positions(ids), None))[
                0, len(prompt_ids) - 1 : -1, :VOCAB
            ].double()
        logp = torch.log_softmax(logits / tau, dim=-1)
        return logp.gather(-1, torch.tensor(response_ids)[:, None])[:, 0].tolist()

    return reference


def _contract():
    from tests.unit.test_rollout_contract import PROMPTS, run_contract
    from vepo_mcore.rollout.base import SamplingParams, build_engine
    from vepo_mcore.rollout.weight_sync import hf_tensors

    cfg = _cfg(tp=2)
    model = _build(cfg).eval()
    engine = build_engine(cfg, model=model)
    import torch.distributed as dist

    weights = {}
    for dst in range(dist.get_world_size()):  # full HF tensors on every rank (rank 1: sent by TP rank 0)
        weights.update({name: t.clone() for name, t in hf_tensors(model, cfg, dst=dst)})
    run_contract(engine, _megatron_reference(model), weights, atol=1e-5)

    # greedy with the KV cache and left padding == argmax of a full forward, token by token
    samples = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))
    for prompt, sample in zip(PROMPTS, samples):
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(8):
                ids = torch.tensor([seq])
                seq.append(int(gather_logits(model(ids, positions(ids), None))[0, -1, :VOCAB].argmax()))
        assert sample.response_ids == seq[len(prompt) :]
    assert model.training is False  # generate restores the mode it found

    with pytest.raises(ValueError, match="not weights of this model"):
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", weights["model.norm.weight"])])

    # batches of equal-length prompts only (what Transformer Engine layers get): no padding, same tokens
    engine.equal_length_batches = True
    again = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=8))
    assert [s.response_ids for s in again] == [s.response_ids for s in samples]


def _generate(cfg, tmp, sampling_list):
    from vepo_mcore.rollout.base import build_engine

    model = _build(cfg, seed=7)
    load_model(model, f"{tmp}/tp1")
    engine = build_engine(cfg, model=model)
    return [engine.generate([[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8]], sp) for sp in sampling_list]


def _layouts(rank, world, tmp):
    from vepo_mcore.rollout.base import SamplingParams

    sampling = [
        SamplingParams(temperature=0, max_new_tokens=6),
        SamplingParams(temperature=0.9, top_k=50, max_new_tokens=6, seed=3),
    ]
    ref_model = _build(_cfg())
    save_model(ref_model, f"{tmp}/tp1")
    expected = _generate(_cfg(), tmp, sampling)
    for tp, pp in ((2, 1), (1, 2)):
        got = _generate(_cfg(tp=tp, pp=pp), tmp, sampling)
        for exp_batch, got_batch in zip(expected, got):
            for e, g in zip(exp_batch, got_batch):
                assert g.response_ids == e.response_ids, (tp, pp, g.response_ids, e.response_ids)
                assert g.finish_reason == e.finish_reason
                diff = (torch.tensor(g.rollout_logprobs) - torch.tensor(e.rollout_logprobs)).abs().max()
                assert diff <= 1e-5, f"TP={tp} PP={pp} log-probs differ from TP=1 by {diff}"
    _contract()


def test_embedded_engine_layouts_and_contract(tmp_path):
    run_processes(_layouts, 2, args=(str(tmp_path),))
