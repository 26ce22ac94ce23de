"""Writers for evaluation results: per-direction CSV/JSON, the paper's Table 3 layout in markdown,
paired-bootstrap tables and the constraint table.

Table 3 cells read "BLEU/COMET/chrF" (e.g. 24.9/.859/50.9) per group X->E, E->X, X->X, Avg;
a metric that was not computed prints as "-".
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from vepo_mcore.eval.baselines import PAPER_TABLE3
from vepo_mcore.eval.paper_tables import paper_direction_scores
from vepo_mcore.translation.directions import GROUPS

GROUP_COLUMNS: dict[str, str] = {**GROUPS, "avg": "Avg."}
"""Group key -> Table 3 column header, in the paper's order."""


def format_score(metric: str, value: float | None, width: int = 1) -> str:
    """BLEU/chrF with `width` decimals (sacrebleu CLI style); COMET as .859 (paper style)."""
    if value is None:
        return "-"
    if metric == "comet":
        text = f"{value:.3f}"
        return text[1:] if text.startswith("0.") else text
    return f"{value:.{width}f}"


def table3_cell(scores: Mapping[str, float | None], width: int = 1) -> str:
    """'BLEU/COMET/chrF' for one group."""
    return "/".join(format_score(m, scores.get(m), width) for m in ("bleu", "comet", "chrf"))


def table3_markdown(
    systems: Mapping[str, Mapping[str, Mapping[str, float | None]]],
    *,
    include_paper: bool = True,
    width: int = 1,
) -> str:
    """Markdown table in the layout of the paper's Table 3.

    systems: name -> group key (x2e/e2x/x2x/avg) -> metric (bleu/comet/chrf) -> score.
    The paper's published rows follow under their section headers when include_paper.
    """
    header = "| Model | " + " | ".join(GROUP_COLUMNS.values()) + " |"
    lines = [
        'Cells: BLEU/COMET-22/chrF on FLORES-200 devtest ("-" = not computed).',
        "",
        header,
        "|:--" + "|:-:" * len(GROUP_COLUMNS) + "|",
    ]

    def row(name: str, groups: Mapping[str, Mapping[str, float | None]]) -> str:
        cells = [table3_cell(groups.get(g, {}), width) if g in groups else "-" for g in GROUP_COLUMNS]
        return f"| {name} | " + " | ".join(cells) + " |"

    if systems:
        lines.append("| *This evaluation* |" + " |" * len(GROUP_COLUMNS))
        lines.extend(row(name, groups) for name, groups in systems.items())
    if include_paper:
        for section, rows in PAPER_TABLE3.items():
            lines.append(f"| *{section} (paper)* |" + " |" * len(GROUP_COLUMNS))
            for name, cells in rows.items():
                lines.append(row(name, {g: cell._asdict() for g, cell in cells.items()}))
    return "\n".join(lines) + "\n"


def write_direction_csv(
    path: str | Path, rows: Sequence[Mapping[str, object]], metrics: Sequence[str], width: int = 1
) -> None:
    """One row per direction: direction, src, tgt, group, n, then one column per metric."""
    with Path(path).open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["direction", "src", "tgt", "group", "n", *metrics])
        for r in rows:
            scores = r["scores"]
            writer.writerow(
                [r["direction"], r["src"], r["tgt"], r["group"], r["n"]]
                + [
                    format_score(m, scores.get(m), width) if m != "comet" else f"{scores[m]:.4f}"
                    for m in metrics
                ]
            )


def write_json(path: str | Path, payload: object) -> None:
    Path(path).write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def bootstrap_markdown(
    results: Mapping[str, Mapping[str, Mapping[str, float]]],
    system: str,
    baseline: str,
    n_samples: int,
    seed: int,
    width: int = 1,
) -> str:
    """Paired-bootstrap table: rows = directions then groups, cells 'base -> sys (delta, p)'.

    results: row name -> metric -> PairedResult.to_dict().
    """
    metrics = list(next(iter(results.values())).keys()) if results else []
    w = {m: (4 if m == "comet" else width) for m in metrics}
    lines = [
        f"Paired bootstrap: {system} vs baseline {baseline}; {n_samples} resamples, seed {seed}.",
        "Cell: baseline -> system (delta, p); * marks p < 0.05.",
        "",
        "| direction | " + " | ".join(metrics) + " |",
        "|:--" + "|--:" * len(metrics) + "|",
    ]
    for name, by_metric in results.items():
        cells = []
        for m in metrics:
            r = by_metric[m]
            star = "*" if r["p_value"] < 0.05 else ""
            cells.append(
                f"{r['base_score']:.{w[m]}f} -> {r['sys_score']:.{w[m]}f} "
                f"({r['delta']:+.{w[m]}f}, p={r['p_value']:.4f}{star})"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CONSTRAINT_COLUMNS = ("Lang.", "Length", "Format", "Mixing", "Overall")


def constraint_markdown(
    rows: Mapping[str, Sequence[float | None]], paper: Mapping[str, Sequence[float]] | None = None
) -> str:
    """Constraint verification table (% pass) in the layout of the paper's Table 2."""
    lines = [
        "| Model | " + " | ".join(CONSTRAINT_COLUMNS) + " |",
        "|:--" + "|--:" * len(CONSTRAINT_COLUMNS) + "|",
    ]
    for name, values in rows.items():
        lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in values) + " |")
    for name, values in (paper or {}).items():
        lines.append(f"| {name} (paper) | " + " | ".join(f"{v:g}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def write_paper_comparison(
    path: str | Path, rows: Sequence[Mapping[str, object]], models: Sequence[str]
) -> None:
    """direction, metric, ours, then the paper appendix's number of each model (bleu / chrf / comet as computed)."""
    metrics = [m for m in ("bleu", "chrf", "comet") if rows and m in rows[0]["scores"]]
    paper = {(model, m): paper_direction_scores(model, m) for model in models for m in metrics}
    with Path(path).open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["direction", "metric", "ours", *models])
        for r in rows:
            for m in metrics:
                digits = 4 if m == "comet" else 1
                values = [paper[(model, m)].get(r["direction"]) for model in models]
                writer.writerow(
                    [r["direction"], m, f"{r['scores'][m]:.{digits}f}"]
                    + ["" if v is None else f"{v:.{digits}f}" for v in values]
                )
