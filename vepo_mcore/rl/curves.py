"""Training curves as PNG: reward, entropy, response length and KL per RL step (one run or many)."""

from __future__ import annotations

from pathlib import Path

PANELS = (
    ("reward/mt", "R_mt: chrF++ / 100"),
    ("reward/total", "reward (raw total)"),
    ("rollout/entropy", "entropy"),
    ("rollout/len_mean", "response length (tokens)"),
    ("rl/kl_k3", "KL to reference (k3)"),
    ("constraint/overall", "constraint pass rate"),
)


def plot_curves(
    history: list[dict] | dict[str, list[dict]], path: str | Path, panels=PANELS, xlabel: str = "RL step"
) -> Path:
    """history: one run's per-step rows, or {run name: rows} to overlay several runs; panels:
    (metric key, title) pairs. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = history if isinstance(history, dict) else {"run": history}
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        for name, rows_ in runs.items():
            points = [(r["step"], r[key]) for r in rows_ if key in r]
            if points:
                ax.plot(*zip(*points), label=name, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if len(runs) > 1:
        axes.flat[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
