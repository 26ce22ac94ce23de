"""Training curves as PNG, smoothed with the raw values faint: by default reward, entropy, response length
and KL per RL step (one run or many); any metrics with `panels` (the reward model's losses and accuracies).
A metric logged on fewer than half the steps (KL measured every 10th step, validation every N) is drawn
point by point, unsmoothed. A legend says which line is raw and which smoothed (and which run is which);
steps are whole numbers on the axis, and no axis shows an offset label (values read as they are)."""

from __future__ import annotations

from pathlib import Path

# Imported where used: matplotlib (heavy; plots only, and the Agg backend is chosen before pyplot loads).

PANELS = (
    ("reward/mt", "R_mt: chrF++ / 100"),
    ("reward/total", "reward (raw total)"),
    ("rollout/entropy", "entropy"),
    ("rollout/len_mean", "response length (tokens)"),
    ("rl/kl_k3", "KL to reference (k3)"),
    ("constraint/overall", "constraint pass rate"),
)

VALIDATION_PANELS = (
    ("valid/overall_pass", "validation: overall pass (%, greedy)"),
    ("valid/chrf", "validation: chrF++ (greedy)"),
)
"""Added to PANELS when RL validates (rl.eval_sentences)."""


def ema(values: list[float], smooth: float) -> list[float]:
    """Exponential moving average with weight `smooth` on the past (0 = the raw values), debiased
    like TensorBoard's so the first points are not pulled towards zero."""
    out, acc, weight = [], 0.0, 0.0
    for value in values:
        acc = smooth * acc + (1 - smooth) * value
        weight = smooth * weight + (1 - smooth)
        out.append(acc / weight)
    return out


def plot_curves(
    history: list[dict] | dict[str, list[dict]],
    path: str | Path,
    panels=PANELS,
    xlabel: str = "RL step",
    smooth: float = 0.0,
) -> Path:
    """history: one run's per-step rows, or {run name: rows} to overlay several runs; panels:
    (metric key, title) pairs; smooth > 0 draws the EMA-smoothed curve over the raw values (faint).
    Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    runs = history if isinstance(history, dict) else {"run": history}
    cols = 3
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.2 * rows), squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        for name, rows_ in runs.items():
            points = [(r["step"], r[key]) for r in rows_ if key in r]
            if not points:
                continue
            steps, values = zip(*points)
            if 2 * len(points) < len(rows_):  # e.g. validation every N steps: each point marked, unsmoothed
                ax.plot(steps, values, label=name, linewidth=1.2, marker="o", markersize=3)
            elif smooth > 0:
                raw = ax.plot(steps, values, linewidth=0.8, alpha=0.25)[0]
                ax.plot(steps, ema(list(values), smooth), label=name, linewidth=1.4, color=raw.get_color())
            else:
                ax.plot(steps, values, label=name, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(useOffset=False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if len(runs) == 1:  # one run's name says nothing
        handles, labels = [], []
    if smooth > 0:  # which line is which: the same colour, faint = raw, solid = smoothed
        handles += [Line2D([], [], color="grey", linewidth=0.8, alpha=0.35), Line2D([], [], color="grey")]
        labels += ["raw", f"smoothed (EMA {smooth:g})"]
    if handles:
        axes.flat[0].legend(handles, labels, fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
