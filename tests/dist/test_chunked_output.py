"""QwenGPTModel's chunked output layer + loss (models/output_loss.py) on the real megatron model, TP=1
and TP=2 over gloo, tied and untied: the CPT/SFT loss and every parameter's gradient equal megatron's
own output layer + vocab_parallel_cross_entropy (gradients built in forward for the loss mask); the RL log-prob and entropy of the deferred output
layer equal the same computation at TP=1 (the gathered weight, one process) and a naive full-vocab
float64 one, gradients of hidden and weight included; nothing [tokens, vocab]-sized is saved for
backward (megatron's own path does save it, so the check can fail)."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import param_grads
from vepo_mcore.parallel.launch import run_processes

pytestmark = pytest.mark.dist


def _largest_saved(model, fn) -> int:
    """Elements of the largest non-parameter tensor autograd saves while `fn` runs."""
    params = {p.data_ptr() for p in model.parameters()}
    sizes = [0]

    def pack(t):
        sizes.append(0 if t.data_ptr() in params else t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return max(sizes), out


def _gather_rows(weight: torch.Tensor) -> torch.Tensor:
    """[V/TP, h] -> [V, h] on every TP rank."""
    from megatron.core import parallel_state as ps

    world = ps.get_tensor_model_parallel_world_size()
    if world == 1:
        return weight
    parts = [torch.empty_like(weight) for _ in range(world)]
    torch.distributed.all_gather(parts, weight.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts)


def _check(rank, world, tied, masked):
    from tests.dist.model_utils import VOCAB, tiny_model
    from tests.support.reference_logprobs import reference_logprobs_and_entropy
    from vepo_mcore.models import output_loss
    from vepo_mcore.models.output_loss import DeferredOutputLayer, output_layer_logprobs

    model, tokens, labels, pos = tiny_model(world, tied, seed=7, batch_seed=1, batch_size=3, seq=12)
    # the CPU cross-entropy's vocabulary blocks: several, the last short (this spawned worker's global)
    output_loss.BLOCK_BYTES = 7 * 4 * tokens.numel()
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[0, 4:] = mask[1, 7:10] = mask[2, :3] = True
    kwargs = {"output_mask": mask} if masked else {}
    n_tokens = int(mask.sum()) if masked else tokens.numel()
    shard = (
        model.output_layer.weight.shape[0] if not tied else model.embedding.word_embeddings.weight.shape[0]
    )
    weights = torch.rand(tokens.shape) * mask  # a per-token loss weight, 0 off the mask

    # CPT / SFT: the chunked loss and its gradients against megatron's output layer + loss
    model.chunked_output_loss = False
    ref_saved, ref = _largest_saved(model, lambda: model(tokens, pos, None, labels=labels, **kwargs))
    (ref * weights).sum().backward()
    ref_grads = param_grads(model)
    model.zero_grad(set_to_none=True)
    model.chunked_output_loss = True
    # loss_mask: the loss's own weights, so the gradients are built in forward (the early path)
    run = lambda: model(tokens, pos, None, labels=labels, loss_mask=weights, **kwargs)  # noqa: E731
    saved, loss = _largest_saved(model, run)
    (loss * weights).sum().backward()
    grads = param_grads(model)
    assert loss.shape == ref.shape == tokens.shape
    torch.testing.assert_close(loss * mask, ref * mask, atol=1e-5, rtol=1e-5)
    assert grads.keys() == ref_grads.keys() and len(grads) > 5
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)
    assert ref_saved >= n_tokens * shard > saved, (ref_saved, saved, n_tokens * shard)
    model.zero_grad(set_to_none=True)

    # RL: the deferred output layer; log-prob + entropy over the real vocabulary at tau 0.7
    out = model(tokens, pos, None, output_mask=mask, defer_output_layer=True)
    assert isinstance(out, DeferredOutputLayer) and out.hidden.shape[0] == int(mask.sum())
    targets = labels[mask]
    hidden = out.hidden.detach().requires_grad_()
    weight = out.weight.detach().requires_grad_()
    logp, ent = output_layer_logprobs(hidden, weight, targets, 0.7, VOCAB, group=out.group)
    w_lp, w_h = torch.linspace(-1, 1, len(targets)), torch.linspace(0.5, -0.5, len(targets))
    ((logp * w_lp).sum() + (ent * w_h).sum()).backward()
    grad_hidden = hidden.grad.clone()
    if world > 1:  # the partial sums of the vocab shards (the model's copy region all-reduces them)
        torch.distributed.all_reduce(grad_hidden, group=out.group)
    full_weight = _gather_rows(weight.detach())

    # TP = 1 on the gathered weight, one process
    h1, w1 = hidden.detach().clone().requires_grad_(), full_weight.clone().requires_grad_()
    logp1, ent1 = output_layer_logprobs(h1, w1, targets, 0.7, VOCAB, group=None)
    ((logp1 * w_lp).sum() + (ent1 * w_h).sum()).backward()
    torch.testing.assert_close(logp, logp1, atol=2e-6, rtol=0)
    torch.testing.assert_close(ent, ent1, atol=2e-6, rtol=0)
    torch.testing.assert_close(grad_hidden, h1.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(_gather_rows(weight.grad), w1.grad, atol=1e-6, rtol=1e-5)

    # naive full-vocab float64
    h64, w64 = hidden.detach().double().requires_grad_(), full_weight.double().requires_grad_()
    ref_lp, ref_h = reference_logprobs_and_entropy(h64 @ w64.t(), targets, 0.7, VOCAB)
    ((ref_lp * w_lp.double()).sum() + (ref_h * w_h.double()).sum()).backward()
    torch.testing.assert_close(logp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_h, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_hidden.double(), h64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(_gather_rows(weight.grad).double(), w64.grad, atol=1e-5, rtol=1e-4)
    assert (_gather_rows(weight.grad)[VOCAB:] == 0).all()  # padding rows

    # through the model: the deferred layer's gradients reach every parameter like the logits path's
    model.zero_grad(set_to_none=True)
    lp, h = model(tokens, pos, None, output_mask=mask, defer_output_layer=True).logprobs_and_entropy(
        targets, 0.7, VOCAB
    )
    ((lp * w_lp).sum() + (h * w_h).sum()).backward()
    deferred_grads = param_grads(model)
    model.zero_grad(set_to_none=True)
    logits = model(tokens, pos, None, output_mask=mask)
    from vepo_mcore.rl.logprobs import logprobs_and_entropy

    lp2, h2 = logprobs_and_entropy(logits[0], targets, 0.7, vocab_size=VOCAB)
    ((lp2 * w_lp).sum() + (h2 * w_h).sum()).backward()
    for name, grad in param_grads(model).items():
        torch.testing.assert_close(deferred_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_output_layer_equals_megatron_and_float64(world, tied, masked):
    run_processes(_check, world, args=(tied, masked))


def _check_ddp(rank, world, tied):
    from tests.dist.model_utils import VOCAB, tiny_model, wrap_ddp

    model, tokens, labels, pos = tiny_model(world, tied, seed=7, batch_seed=2, batch_size=2, seq=10)
    weights = torch.rand(tokens.shape) * (torch.arange(10) % 3 != 0)
    mask = weights > 0.3
    targets = labels[mask]
    w_lp, w_h = torch.linspace(-1, 1, len(targets)), torch.linspace(0.5, -0.5, len(targets))

    def two_micro_batches(m):
        loss = m(tokens, pos, None, labels=labels, loss_mask=weights)  # gradients built in forward
        ((loss * weights).sum() * 0.5).backward()  # a loss scale: s = 0.5
        out = m(tokens, pos, None, output_mask=mask, defer_output_layer=True)  # recomputed in backward
        lp, h = out.logprobs_and_entropy(targets, 0.7, VOCAB)
        ((lp * w_lp).sum() + (h * w_h).sum()).backward()

    two_micro_batches(model)
    ref = param_grads(model)
    model.zero_grad(set_to_none=True)
    ddp = wrap_ddp(model)
    ddp.zero_grad_buffer()
    two_micro_batches(ddp)
    weight = model.embedding.word_embeddings.weight if tied else model.output_layer.weight
    assert weight.grad_added_to_main_grad  # the output layer wrote main_grad itself
    embedding = model.embedding.word_embeddings.weight  # its lookup too, where it is the plain one
    assert embedding.grad_added_to_main_grad is (world == 1 or tied)
    assert getattr(weight, "zero_out_wgrad", False) is tied  # megatron's mark: the hook adds the rest
    assert ref.keys() == {n for n, p in model.named_parameters() if p.requires_grad} and len(ref) > 5
    for name, param in model.named_parameters():
        assert param.grad is None, name
        torch.testing.assert_close(param.main_grad, ref[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_output_weight_gradient_fused_into_ddp_main_grad(world, tied):
    """Under megatron's DDP the output weight's gradient goes straight into main_grad (as megatron's
    gradient_accumulation_fusion), and at TP = 1 the input embedding's (models/main_grad.py): after
    two micro-batches (the CPT loss, its gradients built in
    forward, at a loss scale of 0.5; an RL log-prob + entropy loss, recomputed in backward) every
    main_grad equals the gradients without DDP, the tied embedding's share included."""
    run_processes(_check_ddp, world, args=(tied,))
