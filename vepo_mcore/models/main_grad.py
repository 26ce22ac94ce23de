"""Weight gradients summed straight into megatron DDP's main_grad (gradient-accumulation fusion).

megatron's DDP keeps each parameter's gradient in an fp32 buffer (`param.main_grad`); its backward
hook adds `param.grad` into it unless the layer already did (`grad_added_to_main_grad`), which is
what megatron's linear layers do on GPU with gradient_accumulation_fusion. The chunked output layer
(models/output_loss.py) and the input embedding's lookup (below) do the same on every device: no
weight-sized gradient tensor is built, zero-filled or added a second time. At the toy benchmark's
shape (152k vocabulary, hidden 256) those weight-sized passes were a tenth of a CPU train step.
No megatron import here: rl.logprobs and the output layer's loss use these without loading it
(models/gpt.py's MainGradEmbedding is the embedding that calls `embedding_into_main_grad`).

A weight tied to the embedding on one stage gets no autograd gradient at all (both users return
None), so DDP's hook does not fire for it; with overlapped reduction megatron would stop with
"Communication call has not been issued for this bucket", which is why models/fusions.py keeps
overlap_grad_reduce off for tied embeddings at PP = 1. Any other weight gets dummy_weight_grad's
tensor, as the overlapped hook asserts (`param.grad is not None`).
"""

from __future__ import annotations

import torch


def fused_main_grad(weight: torch.Tensor) -> torch.Tensor | None:
    """weight.main_grad when megatron's DDP owns the weight's gradient (its grad buffer view, with the
    backward hook that reads `grad_added_to_main_grad`), else None. Then dL/dweight goes straight into
    it, as megatron's gradient_accumulation_fusion does: no weight-sized gradient tensor, no DDP add."""
    main_grad = getattr(weight, "main_grad", None)
    return main_grad if main_grad is not None and hasattr(weight, "grad_added_to_main_grad") else None


def dummy_weight_grad(weight: torch.Tensor) -> torch.Tensor | None:
    """What backward returns for a weight whose gradient went into main_grad: an untouched
    torch.empty (megatron's convention; no page is faulted in), which DDP's hook skips once
    `grad_added_to_main_grad` is set. A weight tied to the embedding on this stage
    (`zero_out_wgrad`) gets None, so whatever its other user returns reaches the hook alone and is
    added (megatron returns zeros there, which autograd must sum with the other: a weight-sized add)."""
    weight.grad_added_to_main_grad = True
    if getattr(weight, "zero_out_wgrad", False):
        return None
    return torch.empty_like(weight)


class _LookupIntoMainGrad(torch.autograd.Function):
    """F.embedding(ids, weight) whose weight gradient is index-added into weight.main_grad."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight = weight
        return torch.nn.functional.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight, ctx.weight = ctx.weight, None
        main_grad = fused_main_grad(weight)
        main_grad.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).to(main_grad.dtype))
        return None, dummy_weight_grad(weight)


def embedding_into_main_grad(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.embedding(ids, weight), its weight gradient index-added into weight.main_grad (which must
    exist: see fused_main_grad) instead of a dense zero-filled [V, h] tensor that DDP then adds."""
    return _LookupIntoMainGrad.apply(ids, weight)
