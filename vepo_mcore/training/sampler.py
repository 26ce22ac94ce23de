"""Which samples a data-parallel rank reads, as a function of the global data position.

The data position is `consumed_samples`: how many samples of the (deterministic, map-style)
training dataset all DP ranks together have consumed. Global batch g holds samples
[g * GBS, (g + 1) * GBS); its micro-batch m holds [m * MBS * DP, (m + 1) * MBS * DP) of those,
of which DP rank r takes the r-th slice of MBS. Because the order depends only on
consumed_samples, a resumed run (with any DP size dividing the global batch) reads exactly the
samples the uninterrupted run would have read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch


def collate(samples: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Stack per-sample fields ([s] or [1, s, s] tensors / numpy arrays) into a micro-batch."""
    out = {}
    for key in samples[0]:
        values = [torch.as_tensor(s[key]) for s in samples]
        out[key] = torch.stack(values)
    return out


def micro_batches(
    dataset: Sequence[dict],
    consumed_samples: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches of this DP rank starting at global position consumed_samples.

    Wraps around the dataset (a new epoch in the same order) when it runs out.
    """
    n = len(dataset)
    if n == 0:
        raise ValueError("the training dataset is empty")
    step = micro_batch_size * dp_size
    position = consumed_samples
    while True:
        start = position + dp_rank * micro_batch_size
        yield collate([dataset[(start + i) % n] for i in range(micro_batch_size)])
        position += step
