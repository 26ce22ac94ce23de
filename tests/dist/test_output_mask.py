"""QwenGPTModel's output_mask: the output layer on the selected positions only gives the full
model's loss, logits and gradients there, with TP=1 and with the vocabulary split over 2 gloo
processes (TP=2), tied and untied embeddings."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import param_grads
from vepo_mcore.parallel.launch import run_processes

pytestmark = pytest.mark.dist


def _check(rank, world, tied):
    from tests.dist.model_utils import tiny_model

    model, tokens, labels, pos = tiny_model(world, tied, seed=5, batch_seed=0, batch_size=3, seq=12)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[0, 4:] = mask[1, 7:10] = mask[2, :1] = True

    full = model(tokens, pos, None, labels=labels)  # [b, s] per-token loss
    (full * mask).sum().backward()
    full_grads = param_grads(model)
    model.zero_grad(set_to_none=True)
    sel = model(tokens, pos, None, labels=labels, output_mask=mask)
    sel.sum().backward()
    sel_grads = param_grads(model)
    torch.testing.assert_close(sel, full * mask, atol=1e-6, rtol=1e-5)
    assert (sel[~mask] == 0).all()
    assert sel_grads.keys() == full_grads.keys() and len(sel_grads) > 5
    for name, grad in full_grads.items():
        torch.testing.assert_close(sel_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)

    with torch.no_grad():
        logits = model(tokens, pos, None)  # [b, s, V_pad / TP]
        picked = model(tokens, pos, None, output_mask=mask)
    assert picked.shape == (1, int(mask.sum()), logits.shape[-1])
    torch.testing.assert_close(picked[0], logits[mask], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_output_mask_equals_the_full_output_layer(world, tied):
    run_processes(_check, world, args=(tied,))
