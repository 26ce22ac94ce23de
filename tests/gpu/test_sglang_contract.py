"""The rollout contract suite against real SGLang (skipped without CUDA or the sglang package).

Same suite as tests/unit/test_rollout_contract.py (the fake) and tests/dist/test_rollout_embedded.py:
shapes, stop/length finish reasons, log-probs == log softmax(z / tau) of a full forward (transformers,
fp32), seeded reproducibility, release/resume + re-push, update_weights changes outputs, bucketed
and per-tensor pushes.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_rollout_contract import hf_reference, run_contract

pytestmark = pytest.mark.gpu


def _tiny_qwen2(path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)  # peaked logits: greedy far from ties under GPU kernels
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def sglang_engine(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("sglang")
    from vepo_mcore.checkpoint.hf import model_config_from_hf, read_hf_config
    from vepo_mcore.config import JobConfig
    from vepo_mcore.rollout.sglang_engine import SGLangEngine, sglang_backend

    path = tmp_path_factory.mktemp("qwen2")
    hf_model = _tiny_qwen2(path)
    cfg = JobConfig()
    cfg.model = model_config_from_hf(read_hf_config(path))
    engine = SGLangEngine(
        # triton: an attention backend deterministic inference (sampling_seed honoured) accepts
        cfg,
        sglang_backend(),
        model_path=path,
        attention_backend="triton",
        disable_cuda_graph=True,
    )
    yield engine, hf_model
    engine.shutdown()


def test_contract_real_sglang(sglang_engine):
    engine, hf_model = sglang_engine
    weights = {k: v.detach().clone().cuda() for k, v in hf_model.state_dict().items()}
    run_contract(engine, hf_reference(hf_model, 512), weights, atol=2e-3)


def test_bucketed_and_per_tensor_pushes_agree(sglang_engine):
    from vepo_mcore.rollout.base import SamplingParams

    engine, hf_model = sglang_engine
    weights = [(k, v.detach().clone().cuda()) for k, v in hf_model.state_dict().items()]
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    outs = []
    for bucket_bytes in (0, 1 << 20):
        engine.update_weights(weights, bucket_bytes=bucket_bytes)
        assert engine.last_sync["bytes"] == sum(t.numel() * t.element_size() for _, t in weights)
        outs.append([s.response_ids for s in engine.generate([[1, 2, 3], [4, 5]], greedy)])
    assert outs[0] == outs[1]
