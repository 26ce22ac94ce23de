"""COMET-22 (wmt22-comet-da) scoring through unbabel-comet, an optional extra (`pip install -e ".[comet]"`).

The checkpoint is a local path (e.g. .../wmt22-comet-da/checkpoints/model.ckpt): nothing is
downloaded. All directions are scored in one `predict` call so the model loads once and batches
stay full; the system score of a direction is the mean of its segment scores (what COMET reports).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

# Imported where used: comet (optional: the [comet] extra, unbabel-comet), torch (heavy: only to count GPUs
# when `gpus` is not given).

COMET_INSTALL_HINT = 'COMET-22 needs unbabel-comet: pip install -e ".[comet]" (or pip install unbabel-comet)'


def load_comet(checkpoint: str | Path):
    """Load a COMET checkpoint from a local path; clear errors when the package or file is missing."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(
            f"COMET checkpoint {path} does not exist (eval.comet_checkpoint expects the model.ckpt file)"
        )
    try:
        from comet import load_from_checkpoint
    except ImportError as exc:
        raise ImportError(f"{COMET_INSTALL_HINT} ({exc})") from exc
    return load_from_checkpoint(str(path))


def comet_segment_scores(
    model,
    sources: Sequence[Sequence[str]],
    hypotheses: Sequence[Sequence[str]],
    references: Sequence[Sequence[str]],
    *,
    batch_size: int = 64,
    gpus: int | None = None,
) -> list[list[float]]:
    """Segment scores per direction: D lists of n_d strings each -> D lists of n_d floats.

    `model` is anything with COMET's `predict(data, batch_size=, gpus=)` returning an object
    with `.scores` (one float per {"src", "mt", "ref"} item).
    """
    if not len(sources) == len(hypotheses) == len(references):
        raise ValueError("COMET needs sources, hypotheses and references for the same directions")
    data, sizes = [], []
    for d, (src, mt, ref) in enumerate(zip(sources, hypotheses, references)):
        if not len(src) == len(mt) == len(ref):
            raise ValueError(
                f"COMET direction {d}: {len(src)} sources, {len(mt)} hypotheses, {len(ref)} references"
            )
        data.extend({"src": s, "mt": m, "ref": r} for s, m, r in zip(src, mt, ref))
        sizes.append(len(src))
    if gpus is None:
        import torch

        gpus = 1 if torch.cuda.is_available() else 0
    output = model.predict(data, batch_size=batch_size, gpus=gpus)
    scores = [float(s) for s in output.scores]
    if len(scores) != len(data):
        raise ValueError(f"COMET returned {len(scores)} scores for {len(data)} segments")
    per_direction, start = [], 0
    for size in sizes:
        per_direction.append(scores[start : start + size])
        start += size
    return per_direction
