"""The CUDA paths that need neither Transformer Engine nor SGLang, on one GPU over NCCL
(megatron-core 0.16.1, local spec): what the CPU tiers check through the CPU shim, checked here on
the real device with the shim off.

  * megatron.core's GPTModel holding a transformers Qwen2 checkpoint gives transformers' logits on
    CUDA (fp32 with TF32 off: 1e-4; bf16: the error a bf16 forward makes);
  * the fused vocab-parallel log-prob + entropy agrees with a float64 computation on CUDA, forward
    and backward, at the 7B vocabulary;
  * the embedded engine's greedy decoding on CUDA equals transformers' `generate` on CUDA.

Skipped without CUDA (tests/conftest.py). On a GPU machine (tests/gpu/device_checks.sh runs it):
    python -m pytest -q tests/gpu/test_cuda_paths.py
"""

from __future__ import annotations

import pytest
import torch

VOCAB = 320


@pytest.fixture(scope="module")
def hf_and_megatron(nccl, tmp_path_factory):
    """(hf_model on CUDA, megatron model on CUDA, cfg), the same random weights in both."""
    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.checkpoint.convert import load_hf_into_model, plan_hf_to_megatron
    from vepo_mcore.checkpoint.hf import HFCheckpoint
    from vepo_mcore.models.builder import build_model

    hf_dir = tmp_path_factory.mktemp("hf")
    hf_model = tiny_qwen2_hf(hf_dir, vocab_size=VOCAB, num_layers=2)
    with torch.no_grad():
        hf_model.lm_head.weight.mul_(12.0)  # peaked logits: greedy choices far from ties
    hf_model.save_pretrained(hf_dir)
    cfg, _ = plan_hf_to_megatron(hf_dir, 1, 1, None)
    model = build_model(cfg).eval()
    reader = HFCheckpoint(hf_dir)
    load_hf_into_model(model, reader, cfg)
    reader.close()
    assert next(model.parameters()).is_cuda, "build_model must place the model on the GPU"
    return hf_model.cuda().eval(), model, cfg, hf_dir


def _megatron_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions, None)[..., :VOCAB].float()


def test_logits_match_transformers_fp32(hf_and_megatron):
    hf_model, model, _, _ = hf_and_megatron
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0)).cuda()
    ours = _megatron_logits(model, tokens)
    with torch.no_grad():
        ref = hf_model(tokens).logits.float()
    assert (ours - ref).abs().max().item() < 1e-4


def test_logits_match_transformers_bf16(hf_and_megatron):
    """training.bf16 (bf16 parameters, as the 7B recipes train) against transformers in bf16: the
    distance to a float64 forward stays within what bf16 rounding makes of these logits."""
    import copy

    from vepo_mcore.checkpoint.convert import load_hf_into_model
    from vepo_mcore.checkpoint.hf import HFCheckpoint
    from vepo_mcore.models.builder import build_model

    hf_model, _, cfg, hf_dir = hf_and_megatron
    cfg = copy.deepcopy(cfg)
    cfg.training.bf16 = True
    model = build_model(cfg).eval()
    reader = HFCheckpoint(hf_dir)
    load_hf_into_model(model, reader, cfg)
    reader.close()
    assert next(model.parameters()).dtype == torch.bfloat16
    tokens = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        ref64 = copy.deepcopy(hf_model).double()(tokens).logits
        ref = copy.deepcopy(hf_model).bfloat16()(tokens).logits.double()
    ours = _megatron_logits(model, tokens).double()
    hf_err = (ref - ref64).abs().max().item()
    our_err = (ours - ref64).abs().max().item()
    assert our_err < 3 * hf_err + 1e-3, (our_err, hf_err)


def test_fused_logprob_entropy_matches_float64_at_7b_vocab(nccl):
    from vepo_mcore.rl.logprobs import logprobs_and_entropy

    g = torch.Generator(device="cuda").manual_seed(0)
    tokens, vocab, tau = 512, 152_064, 0.7
    logits = (8.0 * torch.randn(tokens, vocab, device="cuda", generator=g)).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    w_lp, w_ent = (
        torch.randn(tokens, device="cuda", generator=g),
        torch.randn(tokens, device="cuda", generator=g),
    )

    logp, ent = logprobs_and_entropy(logits, targets, temperature=tau)
    (logp * w_lp + ent * w_ent).sum().backward()
    grad = logits.grad.double()

    x = (logits.detach().double() / tau).requires_grad_()
    logq = torch.log_softmax(x, dim=-1)
    ref_logp = logq.gather(-1, targets[:, None]).squeeze(-1)
    ref_ent = -(logq.exp() * logq).sum(-1)
    (ref_logp * w_lp.double() + ref_ent * w_ent.double()).sum().backward()
    ref_grad = x.grad / tau

    assert (logp.double() - ref_logp).abs().max().item() < 1e-4
    assert (ent.double() - ref_ent).abs().max().item() < 1e-4
    assert (grad - ref_grad).abs().max().item() < 1e-5


def test_embedded_greedy_equals_transformers_generate(hf_and_megatron):
    from vepo_mcore.rollout.base import SamplingParams
    from vepo_mcore.rollout.embedded import EmbeddedEngine

    hf_model, model, cfg, _ = hf_and_megatron
    torch.backends.cuda.matmul.allow_tf32 = False
    prompts = [[5, 17, 42, 9], [3, 8], [100, 101, 102, 103, 104, 105], [7]]
    new_tokens = 12
    engine = EmbeddedEngine(model, cfg, batch_size=4)
    engine.update_weights([("lm_head.weight", hf_model.lm_head.weight.detach().cpu())])
    samples = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=new_tokens))
    ours = [list(s.response_ids) for s in samples]

    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    with torch.no_grad():
        out = hf_model.generate(
            input_ids=ids.cuda(),
            attention_mask=mask.cuda(),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    ref = [row[:new_tokens] for row in out[:, width:].tolist()]
    assert [o[:new_tokens] for o in ours] == ref
