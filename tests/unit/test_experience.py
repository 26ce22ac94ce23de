"""The typed experience record: rollout samples -> [B, S] / [B] tensors, sliced by rows."""

from __future__ import annotations

import torch

from vepo_mcore.rl.experience import make_experience
from vepo_mcore.translation.sample import Sample


def test_prompt_and_response_align_with_labels_and_mask():
    exp = make_experience([Sample(prompt_ids=[5, 6, 7], response_ids=[8, 9])], pad_id=0)
    assert exp.tokens.tolist() == [[5, 6, 7, 8]] and exp.labels.tolist() == [[6, 7, 8, 9]]
    assert exp.loss_mask.tolist() == [[0.0, 0.0, 1.0, 1.0]]  # labels 8 and 9 are the response
    assert exp.response_lengths.tolist() == [2]


def test_experience_rows_and_split_slice_every_row_field():
    samples = [
        Sample(prompt_ids=[1, 2], response_ids=[3 + i], group_id=i // 2, reward=float(i)) for i in range(4)
    ]
    exp = make_experience(samples, pad_id=0, max_response_length=8, temperature=0.4)
    exp.old_logp = torch.arange(8.0).view(4, 2)
    parts = exp.split(3)
    assert [p.num_rows for p in parts] == [3, 1]
    assert torch.equal(parts[1].rewards, torch.tensor([3.0])) and torch.equal(
        parts[1].old_logp, exp.old_logp[3:]
    )
    assert parts[1].max_response_length == 8 and parts[1].ref_logp is None
    # the sampling tau travels with every slice to the loss (its ratio and the log-probs use it)
    assert parts[1].temperature == 0.4 and parts[1].loss_batch().temperature == 0.4
    assert set(exp.loss_fields()) == {
        "old_logp",
        "rewards",
        "group_ids",
        "response_lengths",
        "max_response_length",
        "temperature",
    }
