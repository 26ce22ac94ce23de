"""The evaluation run end to end on small slices: sanity systems, reports, bootstrap, serial == parallel, COMET plumbing."""

from __future__ import annotations

import csv
import importlib.util
import json
from types import SimpleNamespace

import numpy as np
import pytest

from vepo_mcore.config.eval import EvalConfig, EvalSystemConfig
from vepo_mcore.eval.comet import comet_segment_scores, load_comet
from vepo_mcore.eval.metrics import corpus_score
from vepo_mcore.eval.report import table3_cell
from vepo_mcore.eval.runner import EvalJob, run_evaluation
from vepo_mcore.languages import load_flores

DIRS = "en-th,zh-en,km-lo,vi-zh"


def job(tmp_path, system, baseline=None, workers=1, constraints=False, comet_model=None, **kw) -> EvalJob:
    cfg = EvalConfig(
        directions=DIRS,
        max_sentences=40,
        system=system,
        baseline=baseline,
        out_dir=str(tmp_path),
        workers=workers,
        **kw,
    )
    return EvalJob(eval=cfg, constraints=constraints, comet_model=comet_model, progress=False)


def test_reference_scores_100_and_reports_are_written(tmp_path):
    payload = run_evaluation(job(tmp_path, EvalSystemConfig(kind="reference"), constraints=True))
    for row in payload["directions"]:
        assert row["scores"]["bleu"] == pytest.approx(100.0) and row["scores"]["chrf"] == pytest.approx(100.0)
    with (tmp_path / "scores.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["direction"] for r in rows] == ["en-th", "zh-en", "km-lo", "vi-zh"]
    assert {r["group"] for r in rows} == {"e2x", "x2e", "x2x"} and rows[0]["bleu"] == "100.0"
    table = (tmp_path / "table3.md").read_text()
    assert "| reference | 100.0/-/100.0 | 100.0/-/100.0 | 100.0/-/100.0 | 100.0/-/100.0 |" in table
    assert "| VEPO-7B (Full) | 36.1/.881/62.7 | 32.7/.882/56.2 | 23.1/.854/48.8 | 24.9/.859/50.9 |" in table
    vs_paper = (tmp_path / "vs_paper.csv").read_text().splitlines()
    assert (
        vs_paper[0] == "direction,metric,ours,VEPO,Google,NLLB,Gem3"
        and "en-th,bleu,100.0,32.0,37.6,23.8,34.1" in vs_paper
    )
    import matplotlib.image

    for name in ("bleu", "chrf", "chrfpp"):
        image = matplotlib.image.imread(tmp_path / f"heatmap_{name}.png")
        assert image.ndim == 3 and image.shape[0] > 300
    saved = json.loads((tmp_path / "scores.json").read_text())
    assert any("tok:char" in s and "th lo" in s for s in saved["signatures"])
    assert any("tok:zh" in s for s in saved["signatures"])
    assert (
        saved["constraints"]["reference"]["n"] == 160
        and "| reference | 160 |" in (tmp_path / "constraints.md").read_text()
    )


def test_copy_source_groups_bootstrap_and_parallel_equals_serial(tmp_path):
    copy_vs_reference = dict(
        system=EvalSystemConfig(kind="copy-source"),
        baseline=EvalSystemConfig(kind="reference"),
        bootstrap_samples=200,
    )
    serial = run_evaluation(job(tmp_path / "s", workers=1, **copy_vs_reference))
    parallel = run_evaluation(job(tmp_path / "p", workers=2, **copy_vs_reference))
    assert serial["directions"] == parallel["directions"]
    assert serial["bootstrap"] == parallel["bootstrap"]
    # reference check of one direction and of the group mean
    sources, refs = load_flores("km")[:40], load_flores("lo")[:40]
    km_lo = next(r for r in serial["directions"] if r["direction"] == "km-lo")
    assert km_lo["scores"]["chrf++"] == corpus_score("chrf++", sources, refs, "lo").score
    avg = np.mean([r["scores"]["bleu"] for r in serial["directions"]])
    assert serial["groups"]["avg"]["bleu"] == pytest.approx(avg)
    assert serial["groups"]["x2x"]["chrf"] == pytest.approx(
        np.mean([r["scores"]["chrf"] for r in serial["directions"] if r["group"] == "x2x"])
    )
    results = serial["bootstrap"]["results"]
    assert set(results) == {"en-th", "zh-en", "km-lo", "vi-zh", "X->E", "E->X", "X->X", "Avg."}
    assert results["Avg."]["bleu"]["p_value"] == pytest.approx(1 / 201)  # copying the source is far worse
    assert results["Avg."]["bleu"]["base_score"] == pytest.approx(100.0)
    assert (tmp_path / "s" / "bootstrap.md").read_text().count("p=0.0050*") == 8 * 3


def test_hyp_dir_line_count_error(tmp_path):
    hyps = tmp_path / "hyps"
    hyps.mkdir()
    for d in DIRS.split(","):
        (hyps / f"{d}.txt").write_text("only one line\n")
    with pytest.raises(ValueError, match="en-th.txt has 1 lines, expected at least 40"):
        run_evaluation(job(tmp_path / "out", EvalSystemConfig(kind="hyp-dir", hyp_dir=str(hyps))))


def test_table3_cell_formats():
    assert table3_cell({"bleu": 24.94, "comet": 0.8591, "chrf": 50.87}) == "24.9/.859/50.9"
    assert table3_cell({"bleu": 3.0, "chrf": 4.0}) == "3.0/-/4.0"


def test_comet_errors_and_per_direction_split(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.ckpt"):
        load_comet(tmp_path / "missing.ckpt")
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"")
    if importlib.util.find_spec("comet") is None:
        with pytest.raises(ImportError, match="unbabel-comet"):
            load_comet(ckpt)

    class LengthRatioModel:  # stands in for a COMET model object: scores are len(mt)/len(ref)
        def predict(self, data, batch_size, gpus):
            assert gpus == 0 and batch_size == 2
            return SimpleNamespace(scores=[len(d["mt"]) / len(d["ref"]) for d in data], system_score=0.0)

    scores = comet_segment_scores(
        LengthRatioModel(),
        [["a", "b"], ["c"]],
        [["xx", "y"], ["zzz"]],
        [["x", "yy"], ["z"]],
        batch_size=2,
        gpus=0,
    )
    assert scores == [[2.0, 0.5], [3.0]]
    with pytest.raises(ValueError, match="direction 1: 1 sources, 2 hypotheses"):
        comet_segment_scores(LengthRatioModel(), [["a"], ["b"]], [["a"], ["b", "c"]], [["a"], ["b"]], gpus=0)


def test_merged_constraint_rates_equal_the_rewards_table_over_all_samples():
    from vepo_mcore.eval.constraints import direction_rates, merge_rates
    from vepo_mcore.rewards.constraints import constraint_table
    from vepo_mcore.translation.directions import Direction
    from vepo_mcore.translation.sample import Sample

    per_direction, samples = [], []
    for d, wrap in ((Direction("en", "th"), 3), (Direction("vi", "id"), 4)):
        sources = [f"<b>{s}</b>" if i % wrap == 0 else s for i, s in enumerate(load_flores(d.src)[:30])]
        # every 5th hypothesis is left in the source language; tags kept on every other wrapped line
        hyps = [
            (s if i % 5 == 0 else (f"<b>{r}</b>" if i % (2 * wrap) == 0 else r))
            for i, (s, r) in enumerate(zip(sources, load_flores(d.tgt)[:30]))
        ]
        per_direction.append(direction_rates(d, sources, hyps))
        samples += [
            Sample(source=s, response=h, src_lang=d.src, tgt_lang=d.tgt) for s, h in zip(sources, hyps)
        ]
    merged = merge_rates(per_direction)
    overall = constraint_table(samples)["overall"]
    assert merged["n"] == overall["n"] == 60 and merged["format_n"] == overall["format_n"] > 0
    for key in ("lang", "length", "format", "mixing", "overall"):
        assert merged[key] == pytest.approx(overall[key]), key
    assert merged["ms_id_swapped"] == overall["ms_id_swapped"]
    assert 0 < merged["overall"] < 100 and merged["format"] < 100


def test_comet_through_the_run_scores_tables_and_bootstrap(tmp_path):
    """COMET plumbing of run_evaluation with a stand-in model (unbabel-comet is an optional extra):
    the direction score is the mean of its segment scores, Table 3 prints it as .xxx, the paired
    bootstrap covers it."""

    class CharOverlapModel:  # segment score = share of reference characters present in mt
        def predict(self, data, batch_size, gpus):
            return SimpleNamespace(
                scores=[len(set(d["mt"]) & set(d["ref"])) / max(len(set(d["ref"])), 1) for d in data]
            )

    spec = job(tmp_path, EvalSystemConfig(kind="copy-source"), EvalSystemConfig(kind="reference"), bootstrap_samples=100,
               comet_model=CharOverlapModel())  # fmt: skip
    payload = run_evaluation(spec)
    refs, sources = load_flores("th")[:40], load_flores("en")[:40]
    en_th = next(r for r in payload["directions"] if r["direction"] == "en-th")
    naive = sum(len(set(s) & set(r)) / len(set(r)) for s, r in zip(sources, refs)) / 40
    assert en_th["scores"]["comet"] == pytest.approx(naive)
    assert "comet:CharOverlapModel|batch:64" in en_th["signatures"]["comet"]
    avg = payload["groups"]["avg"]["comet"]
    assert f"/{table3_cell({'comet': avg})[2:6]}/" in (tmp_path / "table3.md").read_text()
    assert "| reference | 100.0/1.000/100.0 |" in (tmp_path / "table3.md").read_text()
    boot = payload["bootstrap"]["results"]["Avg."]["comet"]
    assert boot["base_score"] == pytest.approx(1.0) and boot["p_value"] == pytest.approx(1 / 101)
    header = (tmp_path / "scores.csv").read_text().splitlines()[0]
    assert header.endswith(",comet")
