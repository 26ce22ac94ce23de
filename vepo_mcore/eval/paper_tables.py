"""Per-direction numbers of the VEPO paper's appendix tables (BLEU, COMET, chrF for 16 systems x 90 directions).

They ship as data/paper_directions.csv (metric, src, tgt, model, value), extracted once from the
paper's LaTeX with `extract_appendix_tables` (the paper itself is not shipped). BLEU is stored on
the 0-100 scale (the appendix prints it as a fraction, 0.247 = 24.7), chrF on 0-100, COMET on 0-1.

Note: the group means of these tables do not all equal the paper's Table 3 (e.g. VEPO E->X BLEU
32.0 here vs 32.7 there; Google chrF Avg 52.3 vs 50.5); baselines.py keeps Table 3 as printed.
"""

from __future__ import annotations

import csv
import re
from functools import lru_cache
from pathlib import Path

from vepo_mcore.languages import LANGUAGES

PAPER_DIRECTIONS_CSV = Path(__file__).resolve().parent / "data" / "paper_directions.csv"
APPENDIX_LABELS = {"bleu": "tab:blue-breakdown", "comet": "tab:comet-breakdown", "chrf": "tab:chrf-breakdown"}
"""Metric -> LaTeX label of its appendix longtable."""
_CODE_BY_NAME = {lang.name: lang.code for lang in LANGUAGES.values()}


def extract_appendix_tables(tex_path: str | Path) -> list[tuple[str, str, str, str, float]]:
    """Rows (metric, src, tgt, model, value) from the paper's three appendix longtables."""
    tex = Path(tex_path).read_text(encoding="utf-8")
    rows = []
    for metric, label in APPENDIX_LABELS.items():
        start = tex.find(label)
        if start < 0:
            raise ValueError(f"{tex_path}: no table labelled {label}")
        body = tex[start : tex.index(r"\end{longtable}", start)]
        header = re.search(r"& & (Gem3.*?)\\\\", body)
        if header is None:
            raise ValueError(f"{tex_path}: table {label} has no model header row")
        models = [m.strip() for m in header.group(1).split("&")]
        for line in body.splitlines():
            parts = [p.strip() for p in line.strip().rstrip("\\").strip().split("&")]
            if len(parts) != len(models) + 2 or parts[0] not in _CODE_BY_NAME:
                continue
            src, tgt = _CODE_BY_NAME[parts[0]], _CODE_BY_NAME[parts[1]]
            for model, value in zip(models, parts[2:]):
                number = float(value)
                rows.append((metric, src, tgt, model, 100.0 * number if metric == "bleu" else number))
    return rows


def write_csv(rows: list[tuple[str, str, str, str, float]], path: str | Path = PAPER_DIRECTIONS_CSV) -> None:
    with Path(path).open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["metric", "src", "tgt", "model", "value"])
        writer.writerows((m, s, t, model, f"{v:.4f}") for m, s, t, model, v in rows)


@lru_cache(maxsize=1)
def _load() -> dict[tuple[str, str], dict[str, float]]:
    table: dict[tuple[str, str], dict[str, float]] = {}
    with PAPER_DIRECTIONS_CSV.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            table.setdefault((row["metric"], row["model"]), {})[f"{row['src']}-{row['tgt']}"] = float(
                row["value"]
            )
    return table


def paper_models() -> list[str]:
    """Short model names of the appendix tables in the paper's column order (Gem3, ..., VEPO, ..., NLLB)."""
    return list(dict.fromkeys(model for _, model in _load()))


def paper_direction_scores(model: str, metric: str) -> dict[str, float]:
    """{'th-ms': 24.3, ...} for one appendix model and metric (bleu / comet / chrf)."""
    key = (metric, model)
    if key not in _load():
        known_models = sorted({m for _, m in _load()})
        raise ValueError(
            f"no paper numbers for model {model!r} / metric {metric!r}; models: {', '.join(known_models)}; metrics: bleu, comet, chrf"
        )
    return dict(_load()[key])
