"""The paper's RL figures from the grid's histories: entropy and length per step, one panel per KL
regime, in the paper's colours (brown VEPO, purple PPO, green GRPO, orange RLOO, red DAPO, blue
REINFORCE++) and line styles (solid none, dashed k2, dotted k3); the overlong study; the
next-token distribution at one decision point; VEPO's ablations (entropy, within-group diversity
and held-out chrF++ per removed part).

Curves are EMA-smoothed with the raw values faint; where a cell has several seeds the line is the
seed mean and the band spans the seeds' smoothed minimum to maximum.
"""

from __future__ import annotations

from pathlib import Path

from vepo_mcore.training.curves import ema

COLORS = {"vepo": "#8c564b", "ppo": "#9467bd", "grpo": "#2ca02c", "rloo": "#ff7f0e", "dapo": "#d62728",
          "reinforce_pp": "#1f77b4"}  # fmt: skip
LABELS = {
    "vepo": "VEPO",
    "ppo": "PPO",
    "grpo": "GRPO",
    "rloo": "RLOO",
    "dapo": "DAPO",
    "reinforce_pp": "REINFORCE++",
}
STYLES = {"none": "-", "k2": "--", "k3": ":"}
SMOOTH = 0.8


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], row[key]) for row in history if key in row]
    return [p[0] for p in points], [p[1] for p in points]


def _draw_cell(ax, histories: list[list[dict]], key: str, color: str, style: str, label: str) -> None:
    """One cell (its seeds' histories): raw values faint, the smoothed seed mean, a seed band."""
    curves = []
    for history in histories:
        steps, values = _series(history, key)
        if values:
            ax.plot(steps, values, color=color, linestyle=style, linewidth=0.6, alpha=0.15)
            curves.append((steps, ema(values, SMOOTH)))
    if not curves:
        return
    n = min(len(c[1]) for c in curves)
    steps = curves[0][0][:n]
    columns = list(zip(*(c[1][:n] for c in curves)))
    ax.plot(steps, [sum(c) / len(c) for c in columns], color=color, linestyle=style, linewidth=1.6,
            label=label + (f" ({len(curves)} seeds)" if len(curves) > 1 else ""))  # fmt: skip
    if len(curves) > 1:
        ax.fill_between(steps, [min(c) for c in columns], [max(c) for c in columns], color=color, alpha=0.12)


def plot_grid_metric(cells: dict[tuple[str, str], list[list[dict]]], key: str, ylabel: str,
                     path: str | Path) -> Path:  # fmt: skip
    """cells: (algorithm, kl) -> the histories of its seeds; one panel per KL regime present."""
    plt = _pyplot()
    kls = [kl for kl in STYLES if any(cell_kl == kl for _, cell_kl in cells)]
    fig, axes = plt.subplots(1, len(kls), figsize=(5.2 * len(kls), 3.6), sharey=True, squeeze=False)
    for ax, kl in zip(axes[0], kls):
        for (algorithm, cell_kl), histories in cells.items():
            if cell_kl == kl and algorithm in COLORS:
                _draw_cell(ax, histories, key, COLORS[algorithm], STYLES[kl], LABELS[algorithm])
        ax.set_title(f"KL: {kl}")
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(ylabel)
    return _save(fig, path)


def plot_overlong(arms: dict[str, list[dict]], path: str | Path) -> Path:
    """DAPO with and without the soft overlong penalty (and VEPO, which has none): entropy, length,
    share of responses cut at the cap."""
    plt = _pyplot()
    panels = (("rollout/entropy", "token entropy (nats)"), ("rollout/len_mean", "response length (tokens)"),
              ("rollout/truncated_frac", "share cut at max_new_tokens"))  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.6), squeeze=False)
    styles = {
        "DAPO": ("#d62728", "-"),
        "DAPO + overlong penalty": ("#d62728", "--"),
        "VEPO": ("#8c564b", "-"),
    }
    for ax, (key, title) in zip(axes[0], panels):
        for label, history in arms.items():
            color, style = styles.get(label, ("gray", "-"))
            _draw_cell(ax, [history], key, color, style, label)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path)


ABLATION_COLORS = ("#7f7f7f", "#17becf", "#bcbd22", "#e377c2", "#9467bd", "#2ca02c", "#1f77b4")


def plot_ablations(histories: dict[str, list[list[dict]]], heldout: dict[str, dict[int, float]],
                   path: str | Path) -> Path:  # fmt: skip
    """VEPO and VEPO with one part removed. histories: variant ("full" first) -> its seeds' per-step
    rows; heldout: variant -> {seed: devtest chrF++ at the validation-chosen checkpoint}.
    Panels: sampled entropy, within-group chrF++ of the candidates (higher = more alike) per step
    (seed mean, seed band), and each ablation's held-out chrF++ minus full VEPO's on the same seed
    (bar = mean over the seeds both ran, dots = seeds)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 3.8), squeeze=False)
    variants = list(dict.fromkeys([*histories, *heldout]))
    colors = {v: (COLORS["vepo"] if v == "full" else ABLATION_COLORS[i % len(ABLATION_COLORS)])
              for i, v in enumerate(variants)}  # fmt: skip
    for ax, (key, title) in zip(axes[0][:2], (("rollout/entropy", "token entropy of the samples (nats)"),
                                              ("rollout/group_chrf", "within-group chrF++ of the candidates"))):  # fmt: skip
        for variant, seeds in histories.items():
            label = "VEPO" if variant == "full" else f"- {variant}"
            _draw_cell(ax, seeds, key, colors[variant], "-" if variant == "full" else "--", label)
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    ax, full = axes[0][2], heldout.get("full", {})
    diffs = {v: [scores[s] - full[s] for s in sorted(scores.keys() & full.keys())]
             for v, scores in heldout.items() if v != "full"}  # fmt: skip
    names = [v for v in variants if diffs.get(v)]
    for i, variant in enumerate(names):
        ax.bar(i, sum(diffs[variant]) / len(diffs[variant]), color=colors[variant], alpha=0.6)
        ax.scatter([i] * len(diffs[variant]), diffs[variant], color="black", s=10, zorder=3)
    ax.axhline(0.0, color=COLORS["vepo"], lw=1)
    ax.set_xticks(range(len(names)), [f"- {v}" for v in names], rotation=30, ha="right", fontsize=7)
    mean_full = f"{sum(full.values()) / len(full):.1f}" if full else "n/a"
    ax.set_title(f"devtest chrF++ minus full VEPO's ({mean_full}), same seed", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _renderable(text: str) -> bool:
    """Whether matplotlib's default font has a glyph for every character (it has none for Thai)."""
    from matplotlib.font_manager import FontProperties, findfont
    from matplotlib.ft2font import FT2Font

    font = FT2Font(findfont(FontProperties()))
    return all(font.get_char_index(ord(c)) for c in text if not c.isspace())


def plot_decision_point(tokens: list[str], ids: list[int], before: list[float], after: list[float], title: str,
                        path: str | Path, names=("SFT", "VEPO")) -> Path:  # fmt: skip
    """Next-token probabilities of two policies at one position, over the same tokens (bars); a
    token the font cannot draw is labelled by its id."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    x = range(len(tokens))
    ax.bar([i - 0.2 for i in x], before, width=0.4, color="#7f7f7f", label=names[0])
    ax.bar([i + 0.2 for i in x], after, width=0.4, color="#8c564b", label=names[1])
    labels = [repr(t)[1:-1] if _renderable(t) else f"#{i}" for t, i in zip(tokens, ids)]
    ax.set_xticks(list(x), labels, rotation=60, fontsize=7)
    ax.set_ylabel("probability (tau 1)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()
    _pyplot().close(fig)
    return path
