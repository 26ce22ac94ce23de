"""Published numbers of the VEPO paper (Table 3: FLORES-200 devtest, 90 directions) for side-by-side display.

Each cell is (BLEU, COMET-22, chrF) for one group: X->E, E->X, X->X and Avg (all 90). The Avg
column of the four systems SPEC section 7 lists is checked against SPEC in the tests.
"""

from __future__ import annotations

from typing import NamedTuple


class PaperCell(NamedTuple):
    bleu: float
    comet: float
    chrf: float


def _row(*cells: tuple[float, float, float]) -> dict[str, PaperCell]:
    return dict(zip(("x2e", "e2x", "x2x", "avg"), (PaperCell(*c) for c in cells)))


PAPER_TABLE3: dict[str, dict[str, dict[str, PaperCell]]] = {
    "Multilingual Chat Models": {
        "Gemma3-27B-IT": _row(
            (36.8, 0.882, 62.9), (30.7, 0.875, 54.2), (22.3, 0.847, 47.5), (24.7, 0.854, 49.7)
        ),
        "Qwen3-8B": _row((31.1, 0.862, 58.5), (23.3, 0.799, 46.4), (14.4, 0.752, 36.8), (16.9, 0.767, 39.9)),
        "Qwen2.5-7B-Inst.": _row(
            (24.8, 0.498, 19.4), (17.4, 0.455, 15.6), (9.2, 0.449, 14.5), (11.6, 0.454, 15.1)
        ),
        "Apertus-8B-Inst.": _row(
            (32.5, 0.870, 60.5), (25.7, 0.802, 46.6), (15.6, 0.750, 36.9), (18.3, 0.767, 40.2)
        ),
        "Tower-Plus-9B": _row(
            (28.2, 0.825, 54.7), (18.3, 0.671, 37.7), (9.8, 0.615, 29.3), (12.5, 0.641, 32.7)
        ),
    },
    "Translation-Focused Models": {
        "Qwen-MT-Plus": _row(
            (34.0, 0.881, 60.1), (29.6, 0.869, 53.4), (19.6, 0.839, 45.8), (22.1, 0.846, 48.2)
        ),
        "Seed-X-PPO-7B": _row(
            (25.9, 0.786, 51.6), (22.6, 0.708, 36.3), (10.5, 0.638, 24.7), (13.3, 0.660, 28.6)
        ),
        "Hunyuan-MT-7B": _row(
            (24.6, 0.839, 55.2), (23.4, 0.862, 48.4), (14.8, 0.802, 39.5), (16.6, 0.812, 42.0)
        ),
    },
    "Translation-Focused without LLM Models": {
        "Google Trans.": _row(
            (41.2, 0.884, 65.7), (32.2, 0.842, 55.7), (23.2, 0.820, 47.9), (25.9, 0.828, 50.5)
        ),
        "NLLB-200": _row((38.1, 0.875, 63.0), (28.3, 0.845, 52.1), (19.7, 0.830, 44.9), (22.4, 0.836, 47.5)),
    },
    "Our Models (VEPO Framework)": {
        "VEPO-7B w/o CPT": _row(
            (33.3, 0.862, 56.8), (31.7, 0.863, 51.8), (21.4, 0.822, 43.6), (23.7, 0.837, 46.9)
        ),
        "VEPO-7B-SFT": _row(
            (35.4, 0.875, 59.8), (32.0, 0.875, 52.9), (22.7, 0.839, 44.5), (24.3, 0.849, 48.3)
        ),
        "VEPO-7B (Full)": _row(
            (36.1, 0.881, 62.7), (32.7, 0.882, 56.2), (23.1, 0.854, 48.8), (24.9, 0.859, 50.9)
        ),
    },
}
"""Paper Table 3: section -> system -> group -> (BLEU, COMET, chrF)."""


def paper_systems() -> dict[str, dict[str, PaperCell]]:
    """All published systems flattened: name -> group -> cell."""
    return {name: row for section in PAPER_TABLE3.values() for name, row in section.items()}


PAPER_CONSTRAINTS: dict[str, tuple[float, float, float, float, float]] = {
    "VEPO-7B (Ours)": (97.8, 99.2, 92.15, 92.3, 95.3),
    "Qwen2.5-7B-Instruct": (92.0, 97.0, 51.8, 62.8, 75.9),
    "Gemma3-27B-IT": (97.4, 91.6, 42.1, 90.9, 80.5),
    "Qwen-MT-Plus": (97.6, 99.8, 82.5, 94.8, 93.6),
    "Seed-X-PPO-7B": (97.6, 79.8, 79.0, 90.3, 86.6),
    "DeepSeek-V3": (95.4, 95.7, 67.6, 95.0, 88.4),
    "Hunyuan-MT-7B": (91.8, 90.7, 71.1, 96.2, 87.4),
}
"""Paper Table 2 (constraint verification, %): Lang / Length / Format / Mixing / Overall."""
