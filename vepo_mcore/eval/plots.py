"""10x10 source-by-target heatmaps of one metric (PNG, matplotlib's Agg backend, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from vepo_mcore.languages import LANGS

# Imported where used: matplotlib (heavy; plots only, and the Agg backend is chosen before pyplot loads).


def score_matrix(scores: Mapping[str, float], langs: tuple[str, ...] = LANGS) -> np.ndarray:
    """{'en-th': 31.2, ...} -> float array [len(langs), len(langs)], rows = source, cols = target; NaN where absent."""
    matrix = np.full((len(langs), len(langs)), np.nan)
    index = {code: i for i, code in enumerate(langs)}
    for direction, value in scores.items():
        src, tgt = direction.split("-")
        matrix[index[src], index[tgt]] = value
    return matrix


def plot_heatmap(
    scores: Mapping[str, float],
    path: str | Path,
    *,
    title: str,
    fmt: str = "{:.1f}",
    langs: tuple[str, ...] = LANGS,
) -> Path:
    """Write a heatmap PNG of per-direction scores; missing directions (and the diagonal) stay blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = score_matrix(scores, langs)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="viridis")
    ax.set_xticks(range(len(langs)), labels=list(langs))
    ax.set_yticks(range(len(langs)), labels=list(langs))
    ax.set_xlabel("target")
    ax.set_ylabel("source")
    ax.set_title(title)
    finite = matrix[np.isfinite(matrix)]
    middle = float(finite.mean()) if finite.size else 0.0
    for i in range(len(langs)):
        for j in range(len(langs)):
            if np.isfinite(matrix[i, j]):
                color = "black" if matrix[i, j] > middle else "white"
                ax.text(j, i, fmt.format(matrix[i, j]), ha="center", va="center", fontsize=7, color=color)
    fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
