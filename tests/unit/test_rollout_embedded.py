"""The embedded engine at TP=1 on CPU (its static-cache decoder) against transformers and megatron.

One process, one Megatron model converted from a tiny random Qwen2ForCausalLM: the shared engine
contract (reference: transformers' full forward), greedy sequences equal to transformers'
`generate`, the static-cache decoder equal to megatron's own inference forward, and a chi-square
test that sampled tokens follow softmax(z / tau). tests/dist runs the TP=2 / PP=2 layouts.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.threads import one_thread  # noqa: F401  (autouse)
from tests.unit.test_rollout_contract import PROMPTS, hf_reference, run_contract
from vepo_mcore.rollout.base import SamplingParams

VOCAB = 320


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(engine, hf_model, hf_weights): the Megatron model (TP=1, CPU) holding the HF model's weights."""
    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.checkpoint.convert import load_hf_into_model, local_process_group, plan_hf_to_megatron
    from vepo_mcore.checkpoint.hf import HFCheckpoint
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout.embedded import EmbeddedEngine

    hf_dir = tmp_path_factory.mktemp("hf")
    with torch.no_grad():
        hf_model = tiny_qwen2_hf(hf_dir, vocab_size=VOCAB, num_layers=2)
        # peaked logits (a trained model's, not an init's): greedy far from ties, tau matters
        hf_model.lm_head.weight.mul_(12.0)
    weights = {k: v.detach().clone() for k, v in hf_model.state_dict().items()}
    with local_process_group():
        cfg, _ = plan_hf_to_megatron(hf_dir, 1, 1, None)
        init_model_parallel(cfg.parallel)
        model = build_model(cfg).eval()
        reader = HFCheckpoint(hf_dir)
        load_hf_into_model(model, reader, cfg)
        reader.close()
        engine = EmbeddedEngine(model, cfg, batch_size=4)
        engine.update_weights([("lm_head.weight", weights["lm_head.weight"])])
        yield engine, hf_model.eval(), weights


def _hf_generate(hf_model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' batched greedy generate on left-padded prompts, outside the CPU shim's mode."""
    from torch.overrides import _pop_mode_temporarily

    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    with _pop_mode_temporarily(), torch.no_grad():
        out = hf_model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=0
        )
    return out[:, width:].tolist()


def test_the_static_cache_decoder_serves_this_model(setup):
    from vepo_mcore.rollout.static_decode import StaticCacheDecoder, unsupported_reason

    engine, _, _ = setup
    assert unsupported_reason(engine.model) is None
    assert isinstance(engine._decoder(), StaticCacheDecoder)


def test_contract_against_transformers(setup):
    engine, hf_model, weights = setup
    run_contract(engine, hf_reference(hf_model, VOCAB), weights, atol=1e-5)


def test_greedy_sequences_equal_transformers_generate(setup):
    engine, hf_model, _ = setup
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (3, 17, 9, 30, 1, 12, 25, 8)]
    ours = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=40))
    assert [s.response_ids for s in ours] == _hf_generate(hf_model, prompts, 40)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0, max_new_tokens=12),
        SamplingParams(temperature=0.7, max_new_tokens=12, seed=4),
        SamplingParams(temperature=1.3, top_k=20, top_p=0.9, max_new_tokens=12, seed=9),
    ],
)
def test_static_cache_decoder_equals_megatrons_inference_forward(setup, sampling):
    """Same tokens, log-probs within 1e-5, left padding included (prompts of 1 to 10 tokens)."""
    engine, _, _ = setup
    fast = engine.generate(PROMPTS + [[7], [1, 2, 3, 4]], sampling)
    engine.static_cache_decoder = False
    try:
        slow = engine.generate(PROMPTS + [[7], [1, 2, 3, 4]], sampling)
    finally:
        engine.static_cache_decoder = True
    for a, b in zip(fast, slow):
        assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
        assert torch.allclose(torch.tensor(a.rollout_logprobs), torch.tensor(b.rollout_logprobs), atol=1e-5)


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of observed `counts` under `probs` (tokens expected < 5 times pooled into one bin)."""
    n = counts.sum()
    expected = probs.double() * n
    big = expected >= 5
    observed = torch.cat([counts[big].double(), counts[~big].double().sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat / 2))


def test_sampled_tokens_follow_the_softmax_at_tau(setup):
    """20,000 first tokens after one prompt at tau = 0.7 (full vocabulary): a chi-square test against
    softmax(z / 0.7) of transformers' logits accepts; against tau = 0.8 the same test rejects."""
    engine, hf_model, _ = setup
    prompt = [11, 42, 7, 300, 5]
    with torch.no_grad():
        z = hf_model(input_ids=torch.tensor([prompt])).logits[0, -1, :VOCAB].double()
    n = 20_000
    batch_size, engine.batch_size = engine.batch_size, n
    try:
        samples = engine.generate([prompt] * n, SamplingParams(temperature=0.7, max_new_tokens=1, seed=123))
    finally:
        engine.batch_size = batch_size
    counts = torch.bincount(torch.tensor([s.response_ids[0] for s in samples]), minlength=VOCAB)
    probs = torch.softmax(z / 0.7, -1)
    assert (probs > 1e-3).sum() >= 10, "the test needs a spread-out distribution"
    assert _chi_square_p(counts, probs) > 1e-3
    assert _chi_square_p(counts, torch.softmax(z / 0.8, -1)) < 1e-6
