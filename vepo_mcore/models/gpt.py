"""megatron.core's GPTModel, with the output layer run only where a loss reads it.

    out = model(tokens, positions, mask, labels=labels, output_mask=loss_mask > 0)  # loss [b, s]
    logits = model(tokens, positions, mask, output_mask=response)                   # [1, N, V_pad/TP]

SFT trains on the assistant turn and RL on the response: at the toy's shapes the prompt and
the padding are half or more of the positions, and the output layer (hidden x vocabulary) is
most of a small model's FLOPs. `output_mask` ([b, s] bool) picks the positions before the
output layer: with labels the per-token loss comes back [b, s] as usual (0 where the mask is
off); without labels the logits of the N selected positions come back as [1, N, V_pad / TP],
in row-major (b, s) order, i.e. the order of `x[output_mask]` for any [b, s] tensor x.

Without `output_mask` this is GPTModel exactly (the engine, conversion and checkpoints see no
difference: no parameter is added or renamed). The mask is ignored, and every position computed,
where selection would change the meaning: pipeline stages before the last, multi-token prediction,
inference with a KV cache, and sequence parallelism (each TP rank holds a slice of the sequence
there; the output layer's own gather comes first).
"""

from __future__ import annotations

import torch
from megatron.core.models.gpt import GPTModel


class QwenGPTModel(GPTModel):
    """GPTModel + `forward(..., output_mask=[b, s] bool)`; see the module docstring."""

    _output_mask: torch.Tensor | None = None

    def forward(self, *args, output_mask: torch.Tensor | None = None, **kwargs):
        self._output_mask = output_mask
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._output_mask = None

    def _postprocess(self, hidden_states, **kwargs):
        if self._output_mask is None or not self.post_process:
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
