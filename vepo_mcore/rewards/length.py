"""Length-ratio reward r_len (SPEC section 5).

rho = (|y| / |x|) / typical(src, tgt), lengths in characters of the stripped strings, where
typical(src, tgt) is the median ratio over FLORES-200 dev pairs of that direction (the table in
vepo_mcore/assets/length_ratios.json, written by tools/build_length_table.py). A normal
translation therefore has rho ~ 1 in every direction, whatever the scripts involved.
r_len = +1 if rho is in [lo, hi], else -sigma_len * (distance from rho to the interval). With the
option ``length_taper`` t (not in the paper), r_len = (hi - rho) / (hi - t) for rho in (t, hi]:
continuous at hi.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import ASSETS
from vepo_mcore.rewards.registry import TermResult, register_reward
from vepo_mcore.translation.sample import Sample

LENGTH_TABLE = ASSETS / "length_ratios.json"


@functools.lru_cache(maxsize=4)
def load_length_table(path: str | Path = LENGTH_TABLE) -> dict[str, float]:
    """{"src-tgt": median char-length ratio} from the shipped JSON table."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"length-ratio table {path} is missing; run tools/build_length_table.py")
    table = json.loads(path.read_text(encoding="utf-8"))["ratios"]
    return {key: float(value) for key, value in table.items()}


def typical_ratio(src_lang: str, tgt_lang: str) -> float:
    """Median |y|/|x| of the direction (1.0 when source and target language are the same)."""
    if src_lang == tgt_lang:
        return 1.0
    table = load_length_table()
    key = f"{src_lang}-{tgt_lang}"
    if key not in table:
        raise ValueError(
            f"no typical length ratio for direction {key!r} in {LENGTH_TABLE}; "
            f"known directions: {', '.join(sorted(table))}"
        )
    return table[key]


def length_ratio(source: str, hypothesis: str, src_lang: str, tgt_lang: str) -> float:
    """Normalised rho = (|y| / |x|) / typical(src, tgt); an empty source counts as one character."""
    src_len = max(len(source.strip()), 1)
    return (len(hypothesis.strip()) / src_len) / typical_ratio(src_lang, tgt_lang)


def length_term(
    rho: float, interval: tuple[float, float] = (0.5, 2.0), sigma: float = 1.0, taper: float | None = None
) -> float:
    """+1 inside the interval (falling linearly to 0 at its upper end from rho = taper, if given),
    else -sigma * distance to it."""
    low, high = interval
    if low <= rho <= high:
        return 1.0 if taper is None or rho <= taper else (high - rho) / (high - taper)
    distance = low - rho if rho < low else rho - high
    return -sigma * distance if math.isfinite(distance) else -math.inf


@register_reward("length", constraint="length")
def length_reward(samples: list[Sample], cfg: RewardsConfig | None = None) -> TermResult:
    """r_len per sample; raw = rho; passed = rho inside cfg.length_interval."""
    cfg = cfg or RewardsConfig()
    rhos = [length_ratio(s.source, s.response, s.src_lang, s.tgt_lang) for s in samples]
    low, high = cfg.length_interval
    return TermResult(
        values=[length_term(rho, cfg.length_interval, cfg.sigma_len, cfg.length_taper) for rho in rhos],
        raw=rhos,
        passed=[low <= rho <= high for rho in rhos],
    )
