"""Paired bootstrap: equals `sacrebleu --paired-bs` on one direction; group test semantics."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vepo_mcore.eval import bootstrap as bs
from vepo_mcore.eval.metrics import (
    aggregate_score,
    build_metric,
    read_lines,
    score_from_stats,
    sentence_stats,
)
from vepo_mcore.languages import load_flores

SACREBLEU = Path(sys.executable).parent / "sacrebleu"


def _systems(n: int) -> tuple[list[str], list[str], list[str]]:
    """Two close systems (so the p-value is not trivially 1/1001) on Thai references."""
    refs = load_flores("th")[:n]
    base = [r[: int(len(r) * 0.8)] if i % 3 == 0 else r for i, r in enumerate(refs)]
    system = [r[: int(len(r) * 0.8)] if i % 3 == 1 else r[: int(len(r) * 0.97)] for i, r in enumerate(refs)]
    return refs, base, system


def test_paired_bootstrap_equals_sacrebleu_cli(tmp_path):
    refs, base, system = _systems(150)
    files = {}
    for name, lines in (("ref", refs), ("base", base), ("sys", system)):
        files[name] = tmp_path / f"{name}.txt"
        files[name].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    proc = subprocess.run(
        [str(SACREBLEU), str(files["ref"]), "-i", str(files["base"]), str(files["sys"]), "-m", "bleu", "chrf",
         "-tok", "char", "--paired-bs", "-w", "4", "-f", "text"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    # rows: "│ <name> │ 68.9125 (68.7754 ± 4.9955) │ ... │" then "│  │ (p = 0.0010)* │ ... │"
    cells = re.findall(r"(-?\d+\.\d{4}) \((-?\d+\.\d{4}) ± (\d+\.\d{4})\)", proc.stdout)
    p_values = [float(p) for p in re.findall(r"\(p = (\d\.\d{4})\)", proc.stdout)]
    assert len(cells) == 4 and len(p_values) == 2, proc.stdout
    indices = bs.resample_indices(len(refs))
    refs_read = read_lines(files["ref"])
    for k, name in enumerate(("bleu", "chrf")):
        metric = build_metric(name, "th")
        stats = {s: sentence_stats(metric, read_lines(files[s]), refs_read) for s in ("base", "sys")}
        scores = {s: aggregate_score(metric, stats[s]) for s in stats}
        resampled = {
            s: bs.resample_scores(
                np.asarray(stats[s], float), indices, lambda x, m=metric: score_from_stats(m, x)
            )
            for s in stats
        }
        result = bs.paired_test(scores["base"], scores["sys"], resampled["base"], resampled["sys"])
        base_cell, sys_cell = cells[k], cells[2 + k]
        assert f"{result.base_score:.4f}" == base_cell[0]
        assert f"{result.base_mean:.4f}" == base_cell[1] and f"{result.base_ci:.4f}" == base_cell[2]
        assert f"{result.sys_score:.4f}" == sys_cell[0]
        assert f"{result.sys_mean:.4f}" == sys_cell[1] and f"{result.sys_ci:.4f}" == sys_cell[2]
        assert f"{result.p_value:.4f}" == f"{p_values[k]:.4f}"
    assert max(p_values) > 0.01  # the comparison exercised a non-trivial p-value


def test_p_value_formula_matches_naive_loop():
    rng = np.random.default_rng(0)
    base = rng.normal(30, 1, 1000)
    system = base + rng.normal(0.3, 1, 1000)
    result = bs.paired_test(30.0, 30.4, base, system)
    diffs = [abs(s - b) for s, b in zip(system, base)]
    mean = sum(diffs) / len(diffs)
    count = sum(1 for d in diffs if d - mean > 0.4)
    assert result.p_value == pytest.approx((count + 1) / 1001, abs=0)
    assert result.delta == pytest.approx(0.4)


def test_identical_systems_are_not_significant_and_groups_average():
    n = 80
    stats = np.random.default_rng(1).integers(0, 20, size=(n, 3)).astype(float)
    indices = bs.resample_indices(n, 200, seed=7)
    resampled = bs.resample_scores(stats, indices, lambda s: float(s[0] / max(s[1], 1)))
    naive = np.array([stats[row].sum(0)[0] / max(stats[row].sum(0)[1], 1) for row in indices])
    np.testing.assert_allclose(resampled, naive, rtol=1e-6)
    same = bs.paired_test(1.0, 1.0, resampled, resampled)
    assert same.p_value == 1 / 201  # zero difference: sacrebleu counts strict '>' only
    group = bs.paired_group_test(
        [1.0, 3.0], [2.0, 3.0], [resampled, resampled + 2], [resampled + 1, resampled + 2]
    )
    assert group.base_score == 2.0 and group.sys_score == 2.5
    single = bs.paired_test(1.0, 2.0, resampled, resampled + 1)
    assert bs.paired_group_test([1.0], [2.0], [resampled], [resampled + 1]) == single


def test_resample_indices_fixed_seed_and_errors():
    np.testing.assert_array_equal(bs.resample_indices(10, 5), bs.resample_indices(10, 5))
    assert bs.resample_indices(10, 5).shape == (5, 10)
    with pytest.raises(ValueError, match="empty"):
        bs.resample_indices(0)
    with pytest.raises(ValueError, match="shapes differ"):
        bs.paired_test(0, 0, np.zeros(3), np.zeros(4))
