"""megatron.core's GPTModel, with the output layer run only where a loss reads it, and with the loss
computed chunk by chunk from the hidden states (never a [tokens, vocab] logits tensor).

    out = model(tokens, positions, mask, labels=labels, output_mask=loss_mask > 0)  # loss [b, s]
    logits = model(tokens, positions, mask, output_mask=response)                   # [1, N, V_pad/TP]
    out = model(tokens, positions, mask, output_mask=response, defer_output_layer=True)
    logp, entropy = out.logprobs_and_entropy(targets[response], tau, vocab_size)    # [N] each

SFT trains on the assistant turn and RL on the response: at the toy's shapes the prompt and
the padding are half or more of the positions, and the output layer (hidden x vocabulary) is
most of a small model's FLOPs. `output_mask` ([b, s] bool) picks the positions before the
output layer: with labels the per-token loss comes back [b, s] as usual (0 where the mask is
off); without labels the logits of the N selected positions come back as [1, N, V_pad / TP],
in row-major (b, s) order, i.e. the order of `x[output_mask]` for any [b, s] tensor x.

With labels, the per-token cross-entropy is models.output_loss.output_layer_cross_entropy of the
final hidden states and the output weight (the same value as megatron's output layer +
vocab_parallel_cross_entropy, every padded vocabulary row included as there), so the memory of the
output layer no longer grows with tokens x vocabulary. `defer_output_layer=True` (no labels)
returns a models.output_loss.DeferredOutputLayer (hidden states of the selected positions + the
output weight) for the RL loss, which computes log-probs and entropy the same way.

Without `output_mask` and labels this is GPTModel exactly (the engine, conversion and checkpoints
see no difference: no parameter is added or renamed). Everything falls back to megatron's own path
(logits, then its loss) where the output layer is not a plain ColumnParallelLinear of GPTModel
(the critic's and reward model's heads), or where selection would change the meaning: pipeline
stages before the last, multi-token prediction, inference with a KV cache. With sequence
parallelism the hidden states are gathered first (as the output layer itself would).
"""

from __future__ import annotations

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel import (
    ColumnParallelLinear,
    VocabParallelEmbedding,
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
)

from vepo_mcore.models.main_grad import embedding_into_main_grad, fused_main_grad
from vepo_mcore.models.output_loss import DeferredOutputLayer, output_layer_cross_entropy


class MainGradEmbedding(VocabParallelEmbedding):
    """megatron's VocabParallelEmbedding; where DDP owns the weight's gradient and the lookup is the
    plain one (TP = 1, not deterministic_mode, no reduce-scatter), its gradient goes into main_grad
    by index_add instead of a dense zero-filled [V, h] tensor that DDP then adds."""

    def forward(self, input_):
        if (
            fused_main_grad(self.weight) is None
            or self.tp_group.size() > 1
            or self.deterministic_mode
            or self.reduce_scatter_embeddings
        ):
            return super().forward(input_)
        return embedding_into_main_grad(input_, self.weight)


class QwenGPTModel(GPTModel):
    """GPTModel + `forward(..., output_mask=[b, s] bool, defer_output_layer=False)`; see the module
    docstring. `chunked_output_loss = False` (class or instance) restores megatron's logits + loss."""

    chunked_output_loss: bool = True
    _output_mask: torch.Tensor | None = None
    _defer_output_layer: bool = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.pre_process:  # the same module and parameter; its gradient into DDP's main_grad
            self.embedding.word_embeddings.__class__ = MainGradEmbedding

    def forward(
        self, *args, output_mask: torch.Tensor | None = None, defer_output_layer: bool = False, **kwargs
    ):
        self._output_mask, self._defer_output_layer = output_mask, defer_output_layer
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._output_mask, self._defer_output_layer = None, False

    def _chunked_output_applies(self, labels, kwargs) -> bool:
        layer = self.output_layer
        return (
            self.chunked_output_loss
            and (labels is not None or self._defer_output_layer)
            and not self.mtp_process
            and kwargs.get("inference_context") is None
            and not kwargs.get("runtime_gather_output")
            and type(layer) is ColumnParallelLinear  # the critic / RM heads keep their own path
            and layer.bias is None
            and not self.config.defer_embedding_wgrad_compute
        )

    def _postprocess(self, hidden_states, **kwargs):
        if not self.post_process:
            return super()._postprocess(hidden_states, **kwargs)
        labels = kwargs.get("labels")
        if self._chunked_output_applies(labels, kwargs):
            return self._chunked_output(hidden_states, labels, kwargs.get("loss_mask"))
        if self._output_mask is None:
            return super()._postprocess(hidden_states, **kwargs)
        mask = self._output_mask.to(torch.bool)
        labels = kwargs.pop("labels")
        if self.mtp_process or self.config.sequence_parallel or kwargs.get("inference_context") is not None:
            # The same contract, computed at every position.
            out = super()._postprocess(hidden_states, labels=labels, **kwargs)
            return out * mask if labels is not None else out[mask].unsqueeze(0)
        # [s, b, h] -> the selected positions in (b, s) order, as [N, 1, h] ("s" = N, "b" = 1).
        hidden = hidden_states.transpose(0, 1)[mask].unsqueeze(1)
        if labels is None:
            return super()._postprocess(hidden, labels=None, **kwargs)  # [1, N, V_pad / TP]
        loss = super()._postprocess(hidden, labels=labels[mask].unsqueeze(0), **kwargs)  # [1, N]
        return loss.new_zeros(mask.shape).masked_scatter(mask, loss[0])

    def _chunked_output(self, hidden_states, labels, loss_mask=None):
        """hidden [s, b, h] -> per-token loss [b, s] (labels) or a DeferredOutputLayer (no labels).

        loss_mask [b, s] (GPTModel's own keyword): the weights the loss multiplies the per-token
        values by; given, the gradients are built in forward, saving the backward's recomputation."""
        group = self.pg_collection.tp
        if self.config.sequence_parallel:
            # each TP rank holds s / TP positions: gather them (backward reduce-scatters the gradient)
            hidden_states = gather_from_sequence_parallel_region(hidden_states, True, group)
        hidden = hidden_states.transpose(0, 1)  # [b, s, h]
        mask = self._output_mask
        if mask is not None:
            mask = mask.to(torch.bool)
            hidden = hidden[mask]  # [N, h] in (b, s) order
        else:
            hidden = hidden.reshape(-1, hidden.shape[-1])
        if not self.config.sequence_parallel:
            # replicated over TP: backward all-reduces the partial gradients of the vocab shards
            hidden = copy_to_tensor_model_parallel_region(hidden, group=group)
        if self.share_embeddings_and_output_weights:
            weight = self.shared_embedding_or_output_weight()
        else:
            weight = self.output_layer.weight
        tp_group = group if torch.distributed.is_initialized() else None
        if labels is None:
            return DeferredOutputLayer(hidden, weight, tp_group)
        flat_labels = labels[mask] if mask is not None else labels.reshape(-1)
        weights = None
        if loss_mask is not None and loss_mask.shape == labels.shape:
            weights = (loss_mask[mask] if mask is not None else loss_mask.reshape(-1)).float()
        loss = output_layer_cross_entropy(hidden, weight, flat_labels, group=tp_group, loss_weights=weights)
        if mask is None:
            return loss.reshape(labels.shape)
        return loss.new_zeros(mask.shape).masked_scatter(mask, loss)
