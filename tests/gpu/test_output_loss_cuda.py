"""The output layer + loss from the hidden states (models/output_loss.py) on CUDA, the path every
CPT / SFT / RL loss of the 7B recipes takes, checked where the CPU tiers cannot:

  * through megatron.core's GPTModel on one GPU over NCCL (local spec): the chunked loss and every
    parameter's gradient equal megatron's own output layer + vocab_parallel_cross_entropy, in fp32
    (TF32 off) and with bf16 parameters (within bf16's rounding of the logits path);
  * at the 7B vocabulary (152,064 rows) the cross-entropy with the loss weights known (gradients
    built in forward) and the RL log-prob + entropy at tau 0.7 equal a naive float64 computation,
    values and gradients of hidden and weight;
  * CUDA's peak memory above the inputs does not grow with tokens x vocabulary: at 2,048 and 16,384
    tokens it stays under the chunk budget + dL/dweight + a few [N, h] tensors, under a third of one
    fp32 copy of the logits at the longer length.

Skipped without CUDA (tests/conftest.py); tests/gpu/device_checks.sh runs it on a lent GPU.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.dist.model_utils import param_grads, tiny_cfg

V7B = 152_064  # Qwen2.5-7B's padded vocabulary


@pytest.fixture(scope="module", autouse=True)
def no_tf32():
    """fp32 GEMMs in fp32 (the float64 comparisons below need it)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _loss_and_grads(model, chunked: bool, tokens, labels, weights):
    model.zero_grad(set_to_none=True)
    model.chunked_output_loss = chunked
    pos = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    extra = {"loss_mask": weights} if chunked else {}  # the loss's own weights: the early-gradient path
    loss = model(tokens, pos, None, labels=labels, **extra)
    (loss.float() * weights).sum().backward()
    return loss.detach().float(), {n: g.float() for n, g in param_grads(model).items()}


@pytest.mark.parametrize("bf16", [False, True])
def test_chunked_loss_through_megatron_equals_megatrons_own_on_cuda(nccl, bf16):
    from vepo_mcore.models.builder import build_model

    cfg = tiny_cfg(num_layers=2)
    cfg.model.vocab_size = 5_000
    cfg.training.bf16 = bf16
    cfg.training.fusions.gradient_accumulation = False  # param.grad without DDP: no main_grad to fuse into
    model = build_model(cfg)
    assert next(model.parameters()).is_cuda
    assert next(model.parameters()).dtype == (torch.bfloat16 if bf16 else torch.float32)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, cfg.model.vocab_size, (3, 65), generator=g).cuda()
    tokens, labels = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    weights = (torch.rand(tokens.shape, generator=g) * (torch.rand(tokens.shape, generator=g) > 0.3)).cuda()

    ref, ref_grads = _loss_and_grads(model, False, tokens, labels, weights)
    loss, grads = _loss_and_grads(model, True, tokens, labels, weights)
    assert grads.keys() == ref_grads.keys() and len(grads) > 5
    if not bf16:
        torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
        return
    # bf16: megatron's path rounds the logits to bf16 before its fp32 loss, ours keeps the GEMM's fp32
    # accumulation; both stay within bf16's relative precision (2^-8) of each other
    assert (loss - ref).abs().max().item() < 0.05
    for name, grad in ref_grads.items():
        rel = (grads[name] - grad).norm() / grad.norm().clamp_min(1e-12)
        assert rel.item() < 2e-2, (name, rel.item())


def _inputs(n, h, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, h, device="cuda", generator=g, dtype=torch.float64)
    weight = torch.randn(V7B, h, device="cuda", generator=g, dtype=torch.float64) * (4.0 / h**0.5)
    targets = torch.randint(0, V7B, (n,), device="cuda", generator=g)
    return hidden.to(dtype), weight.to(dtype), targets


def test_cross_entropy_and_logprob_entropy_equal_float64_at_the_7b_vocabulary(nccl):
    from tests.support.reference_logprobs import reference_logprobs_and_entropy
    from vepo_mcore.models.output_loss import output_layer_cross_entropy, output_layer_logprobs

    hidden, weight, targets = _inputs(600, 256, torch.float32)
    w = torch.rand(600, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref_lp, ref_ent = reference_logprobs_and_entropy(h64 @ w64.t(), targets, 0.7, None)
    ((ref_lp * w.double()).sum() + ref_ent.sum()).backward()
    ref_ce = -torch.log_softmax(h64.detach() @ w64.detach().t(), -1).gather(-1, targets[:, None])[:, 0]
    ce_h64, ce_w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    (
        -torch.log_softmax(ce_h64 @ ce_w64.t(), -1).gather(-1, targets[:, None])[:, 0] * w.double()
    ).sum().backward()

    # CPT / SFT: chunks of 256 tokens (three, the last short), gradients built in forward
    h, wt = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ce = output_layer_cross_entropy(h, wt, targets, chunk_size=256, loss_weights=w)
    (ce * w).sum().backward()
    torch.testing.assert_close(ce.double(), ref_ce, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(h.grad.double(), ce_h64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(wt.grad.double(), ce_w64.grad, atol=1e-5, rtol=1e-4)

    # RL: log-prob + entropy at tau 0.7, the default chunk (sized by bytes). The fp32 GEMM's rounding
    # of the logits (|logp| ~ 25 here) is part of any fp32 computation: each value and gradient is
    # within 1e-5 of float64 or within 1.5x of what a naive fp32 computation on this GPU (full logits,
    # log_softmax, autograd) is off by, whichever is larger.
    h, wt = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    lp, ent = output_layer_logprobs(h, wt, targets, 0.7)
    ((lp * w).sum() + ent.sum()).backward()
    h32, w32 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    naive_lp, naive_ent = reference_logprobs_and_entropy(h32 @ w32.t(), targets, 0.7, None)
    ((naive_lp * w).sum() + naive_ent.sum()).backward()
    for ours, naive, ref in ((lp, naive_lp, ref_lp), (ent, naive_ent, ref_ent), (h.grad, h32.grad, h64.grad),
                             (wt.grad, w32.grad, w64.grad)):  # fmt: skip
        err, naive_err = ((x.detach().double() - ref).abs().max().item() for x in (ours, naive))
        assert err <= max(1e-5, 1.5 * naive_err), (err, naive_err)


def _peak_above_inputs(n, h, dtype) -> tuple[int, int]:
    """(peak bytes above the inputs, one [n, V] copy of the logits in fp32) of the CE's forward +
    backward with the loss weights known, as CPT / SFT run it."""
    from vepo_mcore.models.output_loss import output_layer_cross_entropy

    hidden, weight, targets = _inputs(n, h, dtype)
    hidden.requires_grad_(), weight.requires_grad_()
    w = torch.ones(n, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    (output_layer_cross_entropy(hidden, weight, targets, loss_weights=w) * w).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del hidden, weight, targets
    torch.cuda.empty_cache()
    return peak, n * V7B * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_peak_memory_does_not_grow_with_tokens_times_vocabulary(nccl, dtype):
    from vepo_mcore.models.output_loss import CUDA_CHUNK_BYTES

    h = 512

    def bound(n):
        # the chunk budget (its fp32 buffer, the GEMM output in the weight's dtype), dL/dweight (its fp32
        # sum and the returned gradient) and a few [n, h] tensors (dL/dhidden, the scaled GEMM input)
        return 2 * CUDA_CHUNK_BYTES + 3 * V7B * h * 4 + 8 * n * h * 4

    short, _ = _peak_above_inputs(2048, h, dtype)
    long, logits_long = _peak_above_inputs(16_384, h, dtype)
    print(f"\n{dtype}: peak above inputs {short / 2**20:.0f} MiB at 2,048 tokens, {long / 2**20:.0f} MiB at "
          f"16,384; one fp32 copy of the logits at 16,384: {logits_long / 2**20:.0f} MiB")  # fmt: skip
    assert short < bound(2048) and long < bound(16_384), (short, long)
    assert long < 0.3 * logits_long, (long, logits_long)


def test_bf16_weight_gradient_lands_in_the_weights_dtype(nccl):
    """bf16 weights (the 7B recipes): dL/dweight comes back in bf16 and matches the fp32 computation
    on the same bf16 inputs within bf16's rounding."""
    from vepo_mcore.models.output_loss import output_layer_cross_entropy

    hidden, weight, targets = _inputs(300, 128, torch.bfloat16)
    w = torch.ones(300, device="cuda")
    h, wt = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    (output_layer_cross_entropy(h, wt, targets, loss_weights=w) * w).sum().backward()
    assert wt.grad.dtype == torch.bfloat16 and h.grad.dtype == torch.bfloat16
    h32, w32 = copy.deepcopy(hidden).float().requires_grad_(), copy.deepcopy(weight).float().requires_grad_()
    (output_layer_cross_entropy(h32, w32, targets, loss_weights=w) * w).sum().backward()
    for ours, ref in ((h.grad, h32.grad), (wt.grad, w32.grad)):
        rel = (ours.float() - ref).norm() / ref.norm()
        assert rel.item() < 1e-2, rel.item()
