"""The FLORES-200 evaluation run behind `tools/evaluate.py`: hypotheses -> metrics -> reports.

run_evaluation(job) reads the FLORES sources/references of every selected direction, gets the
system's hypotheses (files or a sanity system), scores BLEU / chrF / chrF++ per direction in
parallel processes (a progress bar on stderr), adds COMET-22 when a checkpoint is given, runs
the paired bootstrap against a baseline system when one is given, and writes into job.eval.out_dir:

  scores.csv, scores.json     per direction (+ group means, signatures)
  table3.md                   group table in the paper's Table 3 layout, paper rows beside it
  heatmap_<metric>.png        10x10 source x target
  bootstrap.md, bootstrap.json  paired bootstrap per direction and per group (with a baseline)
  constraints.md, .json       constraint pass rates of the system and of the references

The model side (checkpoints, engines, megatron.core) and COMET are imported inside the functions
that use them: scoring hypothesis files never loads them.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from vepo_mcore.config.cli import check_output_folder
from vepo_mcore.config.eval import EvalConfig, EvalSystemConfig
from vepo_mcore.eval import bootstrap as bs
from vepo_mcore.eval import report
from vepo_mcore.eval.comet import comet_segment_scores, load_comet
from vepo_mcore.eval.constraints import constraint_markdown, direction_rates, merge_rates
from vepo_mcore.eval.metrics import (
    METRICS,
    aggregate_score,
    clean_lines,
    metric_with_references,
    score_from_stats,
    sentence_stats,
)
from vepo_mcore.eval.plots import plot_heatmap
from vepo_mcore.eval.systems import engine_from_hf, greedy_sampling, system_hypotheses, translate_directions
from vepo_mcore.languages import load_flores
from vepo_mcore.tokenizer.tokenizer import load_tokenizer
from vepo_mcore.translation.directions import Direction, group_members, parse_directions
from vepo_mcore.translation.prompts import DEFAULT_TEMPLATE

# Imported where used: torch, vepo_mcore.eval.translate_checkpoint and vepo_mcore.parallel (pull torch:
# scoring hypothesis files never loads it), vepo_mcore.rewards.constraints (probed: without it the run has no
# constraint table).


@dataclass(kw_only=True)
class EvalJob:
    """One evaluation run: the eval config (directions, systems, metrics, outputs) and what only a
    caller in Python can hand over (a loaded COMET model, progress bars, the paper comparison)."""

    eval: EvalConfig = field(default_factory=EvalConfig)
    comet_batch_size: int = 64
    comet_model: Any = None
    """An already loaded COMET model (anything with COMET's `predict`), e.g. shared across runs;
    takes the place of loading eval.comet_checkpoint."""
    paper_models: tuple[str, ...] = ("VEPO", "Google", "NLLB", "Gem3")
    """Appendix systems whose per-direction numbers go beside ours in vs_paper.csv."""
    constraints: bool = True
    """Constraint table (needs vepo_mcore.rewards.constraints; skipped with a note when absent)."""
    progress: bool = True


@dataclass
class DirectionTask:
    direction: Direction
    sources: list[str]
    references: list[str]
    hypotheses: list[str]
    baseline: list[str] | None
    metrics: tuple[str, ...]
    spm_model: str | None
    bootstrap_samples: int
    seed: int
    constraints: bool = False
    """Also run the constraint checks on the hypotheses."""
    reference_constraints: bool = False
    """... and on the references (the row the Lang column is read against)."""


@dataclass
class DirectionResult:
    direction: Direction
    n: int
    scores: dict[str, float]
    signatures: dict[str, str]
    baseline_scores: dict[str, float] = field(default_factory=dict)
    resamples: dict[str, np.ndarray] = field(default_factory=dict)
    """metric -> system scores of every bootstrap resample [B] (only with a baseline)."""
    baseline_resamples: dict[str, np.ndarray] = field(default_factory=dict)
    constraints: dict | None = None
    reference_constraints: dict | None = None


def score_direction(task: DirectionTask) -> DirectionResult:
    """All string metrics of one direction (and bootstrap resample scores when a baseline is given)."""
    refs = clean_lines(task.references)
    result = DirectionResult(task.direction, len(refs), {}, {})
    indices = (
        bs.resample_indices(len(refs), task.bootstrap_samples, task.seed)
        if task.baseline is not None
        else None
    )
    for name in task.metrics:
        metric = metric_with_references(name, task.direction.tgt, refs, task.spm_model)
        stats = sentence_stats(metric, task.hypotheses, None)
        result.scores[name] = aggregate_score(metric, stats)
        result.signatures[name] = str(metric.get_signature())
        if indices is not None:
            base_stats = sentence_stats(metric, task.baseline, None)
            result.baseline_scores[name] = aggregate_score(metric, base_stats)
            score_fn = lambda summed, metric=metric: score_from_stats(metric, summed)  # noqa: E731
            result.resamples[name] = bs.resample_scores(np.asarray(stats, np.float64), indices, score_fn)
            result.baseline_resamples[name] = bs.resample_scores(
                np.asarray(base_stats, np.float64), indices, score_fn
            )
    if task.constraints:
        result.constraints = direction_rates(task.direction, task.sources, task.hypotheses)
        if task.reference_constraints:
            result.reference_constraints = direction_rates(task.direction, task.sources, task.references)
    return result


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable

    return tqdm(iterable, total=total, desc=desc, unit="dir", file=sys.stderr)


def score_all(
    tasks: Sequence[DirectionTask], workers: int = 0, progress: bool = True
) -> list[DirectionResult]:
    """score_direction over every task, in `workers` processes (0 = all cores, 1 = serial)."""
    workers = workers or os.cpu_count() or 1
    # score targets together so each process preprocesses a target's references once
    order = sorted(range(len(tasks)), key=lambda i: (tasks[i].direction.tgt, i))
    ordered = [tasks[i] for i in order]
    if workers == 1 or len(tasks) == 1:
        scored = [score_direction(t) for t in _progress(ordered, len(tasks), progress, "metrics")]
    else:
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
            chunk = max(1, math.ceil(len(tasks) / (4 * workers)))
            scored = list(
                _progress(
                    pool.map(score_direction, ordered, chunksize=chunk),
                    len(tasks),
                    progress,
                    f"metrics ({workers} procs)",
                )
            )
    results: list[DirectionResult | None] = [None] * len(tasks)
    for i, result in zip(order, scored):
        results[i] = result
    return results


def _load_direction(job: EvalJob, direction: Direction) -> tuple[list[str], list[str]]:
    sources = load_flores(direction.src, job.eval.split)
    references = load_flores(direction.tgt, job.eval.split)
    if job.eval.max_sentences is not None:
        sources, references = sources[: job.eval.max_sentences], references[: job.eval.max_sentences]
    return sources, references


def _add_comet(job: EvalJob, tasks: list[DirectionTask], results: list[DirectionResult]) -> None:
    model = job.comet_model if job.comet_model is not None else load_comet(job.eval.comet_checkpoint)
    systems = [[t.hypotheses for t in tasks]]
    if job.eval.baseline is not None:
        systems.append([t.baseline for t in tasks])
    per_system = [
        comet_segment_scores(
            model,
            [t.sources for t in tasks],
            hyps,
            [t.references for t in tasks],
            batch_size=job.comet_batch_size,
        )
        for hyps in systems
    ]
    source = Path(job.eval.comet_checkpoint).name if job.eval.comet_checkpoint else type(model).__name__
    signature = f"comet:{source}|batch:{job.comet_batch_size}"
    for d, result in enumerate(results):
        segments = np.asarray(per_system[0][d], dtype=np.float64)
        result.scores["comet"] = float(segments.mean())
        result.signatures["comet"] = signature
        if job.eval.baseline is not None:
            base_segments = np.asarray(per_system[1][d], dtype=np.float64)
            result.baseline_scores["comet"] = float(base_segments.mean())
            indices = bs.resample_indices(result.n, job.eval.bootstrap_samples, job.eval.seed)
            mean_fn = lambda summed, n=result.n: float(summed[0]) / n  # noqa: E731
            result.resamples["comet"] = bs.resample_scores(segments[:, None], indices, mean_fn)
            result.baseline_resamples["comet"] = bs.resample_scores(base_segments[:, None], indices, mean_fn)


def group_scores(
    results: Sequence[DirectionResult], metrics: Sequence[str], which: str = "scores"
) -> dict[str, dict[str, float]]:
    """group key (x2e/e2x/x2x/avg) -> metric -> mean of the per-direction scores."""
    by_direction = {r.direction: getattr(r, which) for r in results}
    out = {}
    for group, members in group_members([r.direction for r in results]).items():
        out[group] = {m: float(np.mean([by_direction[d][m] for d in members])) for m in metrics}
    return out


def paired_bootstrap(
    results: Sequence[DirectionResult], metrics: Sequence[str]
) -> dict[str, dict[str, dict[str, float]]]:
    """row (direction or group) -> metric -> PairedResult dict."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for r in results:
        table[str(r.direction)] = {
            m: bs.paired_test(
                r.baseline_scores[m], r.scores[m], r.baseline_resamples[m], r.resamples[m]
            ).to_dict()
            for m in metrics
        }
    by_direction = {r.direction: r for r in results}
    for group, members in group_members(list(by_direction)).items():
        rs = [by_direction[d] for d in members]
        table[report.GROUP_COLUMNS[group]] = {
            m: bs.paired_group_test(
                [r.baseline_scores[m] for r in rs],
                [r.scores[m] for r in rs],
                [r.baseline_resamples[m] for r in rs],
                [r.resamples[m] for r in rs],
            ).to_dict()
            for m in metrics
        }
    return table


def _signature_lines(results: Sequence[DirectionResult], metrics: Sequence[str]) -> list[str]:
    """One line per distinct signature of each metric, with the targets it applies to."""
    lines = []
    for m in metrics:
        targets: dict[str, list[str]] = {}
        for r in results:
            targets.setdefault(r.signatures[m], [])
            if r.direction.tgt not in targets[r.signatures[m]]:
                targets[r.signatures[m]].append(r.direction.tgt)
        for signature, tgts in targets.items():
            lines.append(f"{m:7s} {signature}  (targets: {' '.join(tgts)})")
    return lines


def _constraints_available() -> bool:
    try:
        import vepo_mcore.rewards.constraints  # noqa: F401
    except ImportError:
        return False
    return True


def _write_constraints(job: EvalJob, results: Sequence[DirectionResult], out: Path) -> dict:
    per_direction = {job.eval.system.label: {str(r.direction): r.constraints for r in results}}
    if results and results[0].reference_constraints is not None:
        per_direction["reference"] = {str(r.direction): r.reference_constraints for r in results}
    rows = {name: merge_rates(list(directions.values())) for name, directions in per_direction.items()}
    (out / "constraints.md").write_text(constraint_markdown(rows, per_direction), encoding="utf-8")
    payload = {"overall": rows, "directions": per_direction}
    report.write_json(out / "constraints.json", payload)
    return payload


def _translate_with_model(
    job: EvalJob, spec: EvalSystemConfig, directions: list[Direction], out: Path
) -> EvalSystemConfig:
    """Greedy translations of every direction into spec.hyp_dir; returns spec as a hyp-dir system."""
    if not spec.model_path:
        raise ValueError("system 'hf-model' needs model_path (--eval.system.model_path DIR)")
    tok_dir = spec.tokenizer_path
    if tok_dir is None and (Path(spec.model_path) / "tokenizer.json").is_file():
        tok_dir = spec.model_path
    tokenizer = load_tokenizer(tok_dir)
    hyp_dir = spec.hyp_dir or str(out / "hyps")
    engine = engine_from_hf(spec.model_path, spec.engine, tokenizer)
    try:
        translate_directions(
            engine,
            directions,
            hyp_dir,
            tokenizer=tokenizer,
            load=lambda d: _load_direction(job, d),
            sampling=greedy_sampling(tokenizer, spec.max_new_tokens),
            template=spec.template or DEFAULT_TEMPLATE,
            batch_size=spec.batch_size,
            progress=job.progress,
        )
    finally:
        engine.shutdown()
    return replace(spec, kind="hyp-dir", hyp_dir=hyp_dir, name=spec.name or Path(spec.model_path).name)


def _hypothesis_source(
    job: EvalJob, spec: EvalSystemConfig | None, directions: list[Direction], out: Path
) -> EvalSystemConfig | None:
    """spec with its kind resolved; an hf-model is translated first and becomes its hyp-dir."""
    if spec is None:
        return None
    kind = spec.resolved_kind
    if kind == "hf-model":
        return _translate_with_model(job, spec, directions, out)
    if kind == "checkpoint":
        raise ValueError(
            "a checkpoint system is translated inside a process group: run tools/evaluate.py "
            "(evaluate_config), or translate it first and give its hyps as a hyp-dir system"
        )
    return replace(spec, kind=kind)


def check_inputs(cfg: EvalConfig) -> None:
    """What a run would otherwise find out only after translating or scoring: the metric names, the
    COMET checkpoint and the output folder (ValueError / FileNotFoundError naming the field)."""
    for name in (m.strip() for m in cfg.metrics.split(",") if m.strip()):
        if name == "comet":
            raise ValueError(
                "eval.metrics: 'comet' is not a string metric; COMET-22 runs when eval.comet_checkpoint "
                f"names its checkpoint (wmt22-comet-da model.ckpt); string metrics: {', '.join(METRICS)}"
            )
        if name not in METRICS:
            raise ValueError(f"eval.metrics: unknown metric {name!r}; known: {', '.join(METRICS)}")
    if cfg.comet_checkpoint and not Path(cfg.comet_checkpoint).is_file():
        raise FileNotFoundError(f"eval.comet_checkpoint {cfg.comet_checkpoint} is not a file")
    check_output_folder("eval.out_dir", cfg.out_dir)


def run_evaluation(job: EvalJob) -> dict:
    """Evaluate job.eval.system on the selected directions and write every report; returns the scores.json payload."""
    job.eval.validate()
    directions = parse_directions(job.eval.directions)
    metrics = tuple(m.strip() for m in job.eval.metrics.split(",") if m.strip())
    out = Path(job.eval.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    system = _hypothesis_source(job, job.eval.system, directions, out)
    baseline = _hypothesis_source(job, job.eval.baseline, directions, out)
    job = replace(job, eval=replace(job.eval, system=system, baseline=baseline))
    with_constraints = job.constraints and _constraints_available()
    tasks = []
    for d in directions:
        sources, references = _load_direction(job, d)
        hyps = system_hypotheses(job.eval.system.kind, d, sources, references, job.eval.system.hyp_dir)
        base = None
        if job.eval.baseline is not None:
            base = system_hypotheses(
                job.eval.baseline.kind, d, sources, references, job.eval.baseline.hyp_dir
            )
        tasks.append(
            DirectionTask(
                d,
                sources,
                references,
                hyps,
                base,
                metrics,
                job.eval.spm_model,
                job.eval.bootstrap_samples,
                job.eval.seed,
                constraints=with_constraints,
                reference_constraints=with_constraints and job.eval.system.kind != "reference",
            )
        )
    results = score_all(tasks, job.eval.workers, job.progress)
    all_metrics = metrics
    if job.eval.comet_checkpoint or job.comet_model is not None:
        _add_comet(job, tasks, results)
        all_metrics = (*metrics, "comet")

    rows = [
        {
            "direction": str(r.direction),
            "src": r.direction.src,
            "tgt": r.direction.tgt,
            "group": r.direction.group,
            "n": r.n,
            "scores": r.scores,
            "signatures": r.signatures,
        }
        for r in results
    ]
    groups = group_scores(results, all_metrics)
    payload = {
        "system": job.eval.system.label,
        "split": job.eval.split,
        "metrics": list(all_metrics),
        "directions": rows,
        "groups": groups,
        "signatures": _signature_lines(results, all_metrics),
    }
    report.write_direction_csv(out / "scores.csv", rows, all_metrics, job.eval.width)
    if job.paper_models:
        report.write_paper_comparison(out / "vs_paper.csv", rows, job.paper_models)
    systems = {job.eval.system.label: groups}
    if job.eval.baseline is not None:
        systems[job.eval.baseline.label] = group_scores(results, all_metrics, "baseline_scores")
    (out / "table3.md").write_text(report.table3_markdown(systems, width=job.eval.width), encoding="utf-8")
    if job.eval.plots:
        for m in all_metrics:
            fmt = "{:.3f}" if m == "comet" else "{:.1f}"
            scores = {row["direction"]: row["scores"][m] for row in rows}
            plot_heatmap(
                scores,
                out / f"heatmap_{m.replace('+', 'p')}.png",
                title=f"{job.eval.system.label}: {m}",
                fmt=fmt,
            )
    if job.eval.baseline is not None:
        table = paired_bootstrap(results, all_metrics)
        payload["bootstrap"] = {
            "baseline": job.eval.baseline.label,
            "n_samples": job.eval.bootstrap_samples,
            "seed": job.eval.seed,
            "results": table,
        }
        report.write_json(out / "bootstrap.json", payload["bootstrap"])
        (out / "bootstrap.md").write_text(
            report.bootstrap_markdown(
                table,
                job.eval.system.label,
                job.eval.baseline.label,
                job.eval.bootstrap_samples,
                job.eval.seed,
                job.eval.width,
            ),
            encoding="utf-8",
        )
    if with_constraints:
        payload["constraints"] = _write_constraints(job, results, out)["overall"]
    else:
        payload["constraints"] = (
            "skipped" if not job.constraints else "pending (vepo_mcore.rewards.constraints missing)"
        )
    report.write_json(out / "scores.json", payload)
    return payload


def print_summary(payload: dict, out_dir: str | Path, file=None) -> None:
    """Console summary: sacreBLEU signatures, the group table of this run, bootstrap groups, outputs."""
    file = file or sys.stdout
    print("sacreBLEU signatures:", file=file)
    for line in payload["signatures"]:
        print(f"  {line}", file=file)
    print(report.table3_markdown({payload["system"]: payload["groups"]}, include_paper=False), file=file)
    if "bootstrap" in payload:
        boot = payload["bootstrap"]
        groups = {k: v for k, v in boot["results"].items() if k in report.GROUP_COLUMNS.values()}
        print(
            report.bootstrap_markdown(
                groups, payload["system"], boot["baseline"], boot["n_samples"], boot["seed"]
            ),
            file=file,
        )
    constraints = payload["constraints"]
    if isinstance(constraints, dict):
        print(constraint_markdown(constraints), file=file)
    else:
        print(f"constraint table: {constraints}", file=file)
    print(f"reports written to {out_dir}", file=file)


def evaluate_config(cfg: EvalConfig) -> dict | None:
    """tools/evaluate.py's run: translate a checkpoint system first (every rank of the process group
    helps; rank 0 scores), evaluate, print the summary. Returns the payload (None on other ranks)."""
    check_inputs(cfg)
    if cfg.system.resolved_kind == "checkpoint":
        import torch.distributed as dist

        from vepo_mcore.eval.translate_checkpoint import translate_checkpoint
        from vepo_mcore.parallel import init_distributed

        init_distributed()
        spec = cfg.system
        hyp_dir = spec.hyp_dir or str(Path(cfg.out_dir) / "hyps")
        translate_checkpoint(
            spec.checkpoint, hyp_dir, cfg.directions, cfg.split, cfg.max_sentences, spec.max_new_tokens,
            spec.batch_size,
        )  # fmt: skip
        name = spec.name or Path(spec.checkpoint).name
        cfg = replace(cfg, system=replace(spec, kind="hyp-dir", hyp_dir=hyp_dir, name=name))
        if dist.get_rank() != 0:  # the model-parallel ranks helped translate; scoring is rank 0's
            return None
    payload = run_evaluation(EvalJob(eval=cfg))
    print_summary(payload, cfg.out_dir)
    return payload
