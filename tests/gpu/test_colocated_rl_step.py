"""A colocated RL rollout on one GPU with a real SGLang engine and a Transformer Engine model.

Skipped without CUDA, sglang or transformer_engine (tests/conftest.py). Run in the image
(docker/README.md):  python -m pytest -q tests/gpu/test_colocated_rl_step.py

What the CPU fake can only claim, checked here on the real engine (sglang 0.5.23):
  * the memory order: built -> released at once; wake (empty_cache, resume weights) -> sync ->
    generate (resumes kv_cache + cuda_graph) -> sleep; the first wake does not hit KeyError;
  * the release takes effect: after sleep() the GPU's free memory is back near where it was before
    the engine was built (within the engine process's context and non-releasable buffers);
  * seeded rollouts reproduce with enable_deterministic_inference (rl.rollout.deterministic_inference);
  * the engine's log-probs match the Megatron TE model's on the same tokens (bf16 tolerance);
  * FP8: the TE model's GEMM dimensions are multiples of 16 (hidden 128, ffn 256, heads of 32).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.dist.model_utils import VOCAB, tiny_cfg

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang missing"),
    pytest.mark.skipif(
        importlib.util.find_spec("transformer_engine") is None, reason="transformer_engine missing"
    ),
]
GIB = 1 << 30


@pytest.fixture
def te_model_and_engine():
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import destroy, init_distributed, init_model_parallel
    from vepo_mcore.rollout.base import build_engine

    cfg = tiny_cfg(num_layers=2)
    cfg.model.hidden_size, cfg.model.ffn_hidden_size = 128, 256  # TE FP8 GEMMs need dims % 16 == 0
    cfg.model.num_attention_heads, cfg.model.num_query_groups = 4, 2
    cfg.model.transformer_impl = "transformer_engine"
    cfg.model.init_method_std = 0.2
    cfg.training.bf16 = True
    cfg.rl.rollout.engine = "sglang"
    cfg.rl.rollout.mem_fraction_static = 0.3
    init_distributed("nccl", rank=0, world_size=1)
    init_model_parallel(cfg.parallel, seed=1)
    model = build_model(cfg).eval()
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    engine = build_engine(cfg)  # colocated: released right after it is built
    yield cfg, model, engine, free_before
    engine.shutdown()
    destroy()


def test_colocated_step_memory_order_seeds_and_logprobs(te_model_and_engine):
    from tests.support.checkpoints import megatron_forward
    from vepo_mcore.rollout.base import SamplingParams
    from vepo_mcore.rollout.weight_sync import sync_weights

    cfg, model, engine, free_before = te_model_and_engine
    assert engine.released == {"kv_cache", "weights", "cuda_graph"}
    released_free = torch.cuda.mem_get_info()[0]
    # The engine process keeps its CUDA context and small buffers; weights and KV cache are back.
    assert released_free > free_before - 2 * GIB, (free_before, released_free)

    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    sampling = SamplingParams(temperature=0.8, max_new_tokens=8, seed=3)
    for _ in range(2):  # two RL steps: the second wake resumes what the first sleep released
        engine.wake()
        sync_weights(engine, model, cfg)
        first = engine.generate(prompts, sampling)
        again = engine.generate(prompts, sampling)
        assert [s.response_ids for s in first] == [s.response_ids for s in again]  # deterministic inference
        engine.sleep()
        assert torch.cuda.mem_get_info()[0] > free_before - 2 * GIB

    for s in first:
        tokens = torch.tensor([s.prompt_ids + s.response_ids], device="cuda")
        logits = megatron_forward(model, tokens)[0, len(s.prompt_ids) - 1 : -1, :VOCAB].float() / 0.8
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.response_ids, device="cuda")[:, None])[
            :, 0
        ]
        assert torch.allclose(torch.tensor(s.rollout_logprobs, device="cuda"), ref, atol=0.1), (s, ref)
