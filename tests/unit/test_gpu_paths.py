"""CUDA/NCCL code paths checked on CPU: helpers must build their tensors on the device of their inputs.

No GPU runs these paths in CI, and the CPU shim (parallel/device.py) maps device="cuda" to CPU, so a
tensor left on CPU next to a device tensor goes unnoticed there. The "meta" device has CUDA's rules
(a CPU tensor beside a meta tensor is an error, a CPU 0-dim scalar is allowed), so passing meta
inputs catches exactly the mixes that would fail on a GPU.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.fx.experimental._config as fx_config

from vepo_mcore.config.rl import LossConfig
from vepo_mcore.rl.experience import Experience
from vepo_mcore.rl.losses.ppo import PPOOptions

META = torch.device("meta")


def _critic_micro(device, b: int = 2, s: int = 5) -> Experience:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(b, s)
    mask[0, :2] = 0
    return Experience(
        tokens=torch.zeros(b, s, dtype=torch.long),
        labels=torch.zeros(b, s, dtype=torch.long),
        position_ids=torch.arange(s).expand(b, s),
        loss_mask=mask,
        rewards=torch.zeros(b),
        group_ids=torch.zeros(b, dtype=torch.long),
        old_values=torch.randn(b, s, generator=g),
        returns=torch.randn(b, s, generator=g),
        response_lengths=torch.tensor([3, 5]),
    ).to(device)


@pytest.mark.parametrize("agg", ["tokens", "seq_mean", "global_tokens"])
def test_critic_loss_func_reports_on_the_values_device(agg):
    from vepo_mcore.rl.experience import critic_forward_step

    micro = _critic_micro(META)
    values = torch.empty(2, 5, 1, device=META)
    output, loss_func = critic_forward_step(
        iter([micro]), lambda tokens, pos, mask: values, loss_cfg=LossConfig(loss_agg=agg)
    )
    loss, num_tokens, report = loss_func(output)
    assert loss.device == META and num_tokens.device == META
    assert report["loss"].device == META and report["loss"].shape == (2,)


def test_critic_loss_func_values_on_cpu_match_a_float64_reference():
    from vepo_mcore.rl.experience import critic_forward_step

    micro = _critic_micro("cpu")
    values = torch.randn(2, 5, 1, generator=torch.Generator().manual_seed(1))
    clip = PPOOptions().value_clip
    _, loss_func = critic_forward_step(
        iter([micro]), lambda *a: values, loss_cfg=LossConfig(loss_agg="tokens")
    )
    loss, num_tokens, report = loss_func(values)
    v, old, ret = values[..., 0].double(), micro.old_values.double(), micro.returns.double()
    m = micro.loss_mask.double()
    clipped = old + (v - old).clamp(-clip, clip)
    ref = (0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2) * m).sum() / m.sum()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert int(num_tokens) == 1 and report["loss"].tolist() == pytest.approx([ref.item(), 1.0], rel=1e-6)


def test_logprob_mismatch_is_computed_on_the_training_device():
    from vepo_mcore.rl.trainer import logprob_mismatch

    old = torch.empty(2, 4, device=META)
    mask = torch.ones(2, 4, dtype=torch.bool, device=META)
    # Boolean indexing on meta needs a guess at the number of selected entries: all (mask is all ones).
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):
        out = logprob_mismatch(old, mask, [[-0.5] * 4, [-1.0] * 4])
    assert out.device == META and out.shape == ()


def test_logprob_mismatch_value_on_cpu():
    from vepo_mcore.rl.trainer import logprob_mismatch

    old = torch.tensor([[0.0, -1.0, -2.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[False, True, True], [True, False, False]])
    out = logprob_mismatch(old, mask, [[-1.5, -2.0], [0.5]])
    assert out.item() == pytest.approx((0.5 + 0.0 + 1.0) / 3)


def test_rl_forward_step_reads_the_experience_record():
    """rl_forward_step hands the model the micro-batch's tokens, positions and response mask."""
    from vepo_mcore.rl.losses.loss_func import rl_forward_step

    seen = {}

    def model(tokens, positions, mask, output_mask, defer_output_layer=False):
        seen.update(positions=positions, output_mask=output_mask, defer=defer_output_layer)
        return torch.empty(1, 10, 8, device=tokens.device)

    micro = _rl_micro(META)
    for chunked in (False, True):  # rl.loss.chunked_output_layer: the output layer inside the loss
        rl_forward_step(
            iter([micro]), model, cfg=LossConfig(chunked_output_layer=chunked), kl=None, vocab_size=8
        )
        assert seen["positions"] is micro.position_ids
        assert seen["output_mask"].device == META and seen["output_mask"].dtype == torch.bool
        assert seen["defer"] is chunked


def _rl_micro(device, b: int = 2, s: int = 5) -> Experience:
    zeros = partial(torch.zeros, device=device)
    return Experience(
        tokens=zeros(b, s, dtype=torch.long),
        labels=zeros(b, s, dtype=torch.long),
        position_ids=zeros(b, s, dtype=torch.long),
        loss_mask=torch.ones(b, s, device=device),
        **{k: zeros(b, s) for k in ("old_logp", "ref_logp", "advantages", "old_values", "returns")},
        rewards=zeros(b),
        group_ids=zeros(b, dtype=torch.long),
        keep=torch.ones(
            b, dtype=torch.bool, device=device
        ),  # decided on the whole batch, as the trainer does
        response_lengths=torch.ones(b, dtype=torch.long, device=device),
        max_response_length=8,
    )


@pytest.mark.parametrize("name", ["vepo", "grpo", "dapo", "rloo", "reinforce_pp", "ppo"])
@pytest.mark.parametrize("agg", ["tokens", "global_tokens", "seq_mean"])
def test_rl_loss_func_forward_and_backward_stay_on_the_logits_device(name, agg):
    """The whole loss path (fused log-probs, ratio, KL, metrics, megatron's count) on device tensors."""
    from vepo_mcore.config.rl import KLConfig
    from vepo_mcore.rl.losses.loss_func import rl_loss_func

    logits = torch.empty(1, 10, 16, device=META, requires_grad=True)  # output_mask: all 2 x 5 positions
    cfg = LossConfig(name=name, loss_agg=agg, entropy_topk_frac=0.25 if name == "vepo" else None)
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):  # metrics select masked tokens
        loss, num_tokens, metrics = rl_loss_func(_rl_micro(META), cfg, KLConfig(), 16, logits)
        loss.backward()
    assert loss.device == META and num_tokens.device == META and logits.grad.device == META
    assert [k for k, v in metrics.items() if v.device != META] == []


def test_embedded_engine_refuses_sequence_parallelism_with_a_clear_error():
    from vepo_mcore.config import JobConfig
    from vepo_mcore.rollout.base import build_engine

    cfg = JobConfig()
    cfg.parallel.tensor_model_parallel_size, cfg.parallel.sequence_parallel = 2, True
    with pytest.raises(ValueError, match="sequence_parallel.*sglang"):
        build_engine(cfg, model=torch.nn.Linear(2, 2))
