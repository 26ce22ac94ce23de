"""The static-cache decoder on bf16 parameters (the toy recipe's RL on a CPU with AMX) against
megatron's own bf16 inference forward, both measured against megatron's fp32 forward on the same
(bf16-rounded) weights: bf16 rounding makes the two bf16 paths differ, so the check is that the
decoder's error is no larger than megatron's, not that they agree bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.support.threads import one_thread  # noqa: F401  (autouse)

VOCAB = 320
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [7]]
STEPS = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The same tiny Qwen2 as megatron GPTModels: "bf16" as an evaluation builds it (norm weights stay
    fp32), "trained" as the trainer wraps it (Float16Module: every parameter bf16), and "fp32" holding
    the bf16-rounded weights."""
    from megatron.core.transformer.module import Float16Module

    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.checkpoint.convert import load_hf_into_model, local_process_group, plan_hf_to_megatron
    from vepo_mcore.checkpoint.hf import HFCheckpoint
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    hf_dir = tmp_path_factory.mktemp("hf")
    with torch.no_grad():
        hf_model = tiny_qwen2_hf(hf_dir, vocab_size=VOCAB, num_layers=2)
        hf_model.lm_head.weight.mul_(12.0)  # a trained model's peaked logits
        hf_model.save_pretrained(hf_dir)
    with local_process_group():
        built = {}
        for name in ("bf16", "trained", "fp32"):
            cfg, _ = plan_hf_to_megatron(hf_dir, 1, 1, None)
            cfg.training.bf16 = name != "fp32"
            init_model_parallel(cfg.parallel)
            model = build_model(cfg).eval()
            reader = HFCheckpoint(hf_dir)
            load_hf_into_model(model, reader, cfg)
            reader.close()
            built[name] = Float16Module(model.config, model).module if name == "trained" else model
        assert {p.dtype for p in built["trained"].parameters()} == {torch.bfloat16}
        assert {p.dtype for p in built["bf16"].parameters()} == {torch.bfloat16, torch.float32}
        with torch.no_grad():
            for low, full in zip(built["trained"].parameters(), built["fp32"].parameters()):
                full.copy_(low.float())
        yield built


def _teacher_forced(decoder) -> torch.Tensor:
    """Logits [STEPS, b, VOCAB] (fp64) after the left-padded PROMPTS and a fixed continuation."""
    width, b = max(map(len, PROMPTS)), len(PROMPTS)
    tokens = torch.zeros(b, width, dtype=torch.long)
    key_valid = torch.zeros(b, width + STEPS, dtype=torch.bool)
    for i, p in enumerate(PROMPTS):
        tokens[i, width - len(p) :], key_valid[i, width - len(p) :] = torch.tensor(p), True
    continuation = torch.randint(1, VOCAB, (STEPS, b), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = [decoder.prefill(tokens, key_valid, width + STEPS)]
        out += [decoder.decode(continuation[t]) for t in range(STEPS - 1)]
    return torch.stack([z[:, :VOCAB].double() for z in out])


@pytest.mark.parametrize("name", ["trained", "bf16"])
def test_the_decoder_serves_bf16_parameters_no_less_exactly_than_megatron(models, name):
    from vepo_mcore.rollout.embedded import _MegatronDecoder
    from vepo_mcore.rollout.static_decode import StaticCacheDecoder, unsupported_reason

    assert unsupported_reason(models[name]) is None
    reference = _teacher_forced(_MegatronDecoder(models["fp32"]))
    ours = _teacher_forced(StaticCacheDecoder(models[name], VOCAB))
    megatron = _teacher_forced(_MegatronDecoder(models[name]))
    err_ours, err_megatron = (ours - reference).abs().max(), (megatron - reference).abs().max()
    assert 1e-3 < err_megatron < 0.2 * reference.abs().max()  # bf16 rounding, not a broken model
    assert err_ours <= 1.5 * err_megatron, (err_ours, err_megatron)
    logp = [torch.log_softmax(z, dim=-1) for z in (reference, ours, megatron)]
    assert (logp[1] - logp[0]).abs().max() <= 1.5 * (logp[2] - logp[0]).abs().max()
    # greedy choices: where the reference's top two are further apart than bf16 rounding, the same
    top2 = reference.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 4 * err_megatron
    assert clear.float().mean() > 0.5
    assert torch.equal(ours.argmax(-1)[clear], reference.argmax(-1)[clear])


def test_fp16_and_fp32_residuals_take_megatrons_forward(models):
    from vepo_mcore.rollout.static_decode import unsupported_reason

    config = models["trained"].config
    for name in ("fp16", "fp32_residual_connection"):
        setattr(config, name, True)
        try:
            assert name in unsupported_reason(models["trained"])
        finally:
            setattr(config, name, False)
