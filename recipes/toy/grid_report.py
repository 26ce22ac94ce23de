"""The grid's report: grid.json, the paper's figures, the ablation figure, the decision-point study,
claims.json, grid.md (with the held-out table).

write_grid_report(runs, "reports/toy/grid_runs", "reports/toy", setup, wall_s)
"""

from __future__ import annotations

import json
from pathlib import Path

from recipes.toy.claims import all_claims, entropy_ratio, length_drift
from recipes.toy.figures import plot_ablations, plot_decision_point, plot_grid_metric, plot_overlong
from recipes.toy.grid import (
    ABLATION_KL,
    FULL,
    SFT_HELDOUT,
    GridRun,
    GridSetup,
    grid_records,
    heldout_summary,
    is_complete,
    read_heldout,
    read_histories,
)
from vepo_mcore.eval.heldout import read_records

DECISION = "decision.json"
"""The decision-point study of a VEPO run without KL, kept in its folder (committed): the report reads
it when the run's checkpoint is gone, so a fresh clone regenerates C7."""


def _decision_study(runs: list[GridRun], out: Path, setup: GridSetup, report: Path) -> dict | None:
    """C7 on the first VEPO run without KL that has its study (DECISION) or its checkpoint, against
    the SFT checkpoint every run started from and its held-out answers (SFT_HELDOUT)."""
    from recipes.toy.decision import decision_point_study

    study = None
    for run in (r for r in runs if r.keeps_checkpoint):
        saved, checkpoint = out / run.name / DECISION, out / run.name / "checkpoint"
        if saved.is_file():
            study = json.loads(saved.read_text())
        elif checkpoint.is_dir() and (out / SFT_HELDOUT).is_file():
            study = {"run": run.name,
                     **decision_point_study(setup.sft, checkpoint, read_records(out / SFT_HELDOUT))}  # fmt: skip
            saved.write_text(json.dumps(study, indent=1) + "\n")
        if study:
            break
    if study is None:
        return None
    point = study["point"]
    plot_decision_point(point["tokens"], point["ids"], point["p_sft"], point["p_rl"],
                        f"{point['direction']}, answer token {point['position']}: "
                        f"entropy SFT {point['entropy_sft']:.2f} -> VEPO {point['entropy_rl']:.2f} nats",
                        report / "grid_decision_point.png")  # fmt: skip
    return study


FIGURES = ("grid_entropy.png", "grid_length.png", "grid_overlong.png", "grid_ablations.png",
           "grid_decision_point.png")  # fmt: skip


def write_grid_report(runs: list[GridRun], out: str | Path, report_dir: str | Path, setup: GridSetup,
                      wall_s: float | None = None, study: bool = True, steps: int | None = None) -> dict:  # fmt: skip
    """Everything the grid's command regenerates, from the runs that finished (with `steps`: every
    step logged and, with validation, the held-out records written); returns the claims."""
    out, report = Path(out), Path(report_dir)
    report.mkdir(parents=True, exist_ok=True)
    for name in FIGURES:  # each is drawn again below when the finished runs hold what it shows
        (report / name).unlink(missing_ok=True)
    if steps is not None:
        runs = [run for run in runs if is_complete(out, run, steps, setup.validates)]
    histories = read_histories(runs, out)
    records = grid_records(histories, read_heldout(runs, out))
    (report / "grid.json").write_text(json.dumps(records, indent=1) + "\n")
    cells: dict[tuple[str, str], list[list[dict]]] = {}
    for run, rows in histories.items():
        if not run.twin and run.variant == FULL:
            cells.setdefault((run.algorithm, run.kl), []).append(rows)
    plot_grid_metric(
        cells, "rollout/entropy", "token entropy of the samples (nats)", report / "grid_entropy.png"
    )
    plot_grid_metric(cells, "rollout/len_mean", "response length (tokens)", report / "grid_length.png")
    seed0 = min((run.seed for run in histories), default=0)
    pair = [histories.get(GridRun("dapo", "none", seed0, twin=t)) for t in ("", "overlong")]
    overlong = tuple(pair) if all(pair) else None
    if overlong:
        vepo = histories.get(GridRun("vepo", "none", seed0))
        arms = {
            "DAPO": overlong[0],
            "DAPO + overlong penalty": overlong[1],
            **({"VEPO": vepo} if vepo else {}),
        }
        plot_overlong(arms, report / "grid_overlong.png")
    ablations: dict[str, list[list[dict]]] = {}
    for run, rows in histories.items():
        if run.algorithm == "vepo" and run.kl == ABLATION_KL and not run.twin:
            ablations.setdefault(run.variant, []).append(rows)
    if len(ablations) > 1:
        chrf: dict[str, dict[int, float]] = {}
        for r in records:
            if r["algorithm"] == "vepo" and r["kl"] == ABLATION_KL and r["heldout_chrf"] is not None:
                chrf.setdefault(r["variant"], {})[r["seed"]] = r["heldout_chrf"]
        order = [FULL, *sorted(v for v in ablations if v != FULL)]
        plot_ablations(
            {v: ablations[v] for v in order if v in ablations}, chrf, report / "grid_ablations.png"
        )
    toy_summary_file = report / "summary.json"
    toy_summary = json.loads(toy_summary_file.read_text()) if toy_summary_file.is_file() else None
    decision = _decision_study(runs, out, setup, report) if study else None
    claims = all_claims(records, {run.name: rows for run, rows in histories.items()}, overlong, toy_summary,
                        decision)  # fmt: skip
    (report / "claims.json").write_text(json.dumps(claims, indent=1) + "\n")
    sft_heldout = out / SFT_HELDOUT
    start = heldout_summary(read_records(sft_heldout)) if sft_heldout.is_file() else None
    figures = [name for name in FIGURES if (report / name).is_file()]
    (report / "grid.md").write_text(grid_markdown(records, claims, setup, wall_s, decision, start, figures))
    return claims


def grid_markdown(records: list[dict], claims: dict, setup: GridSetup, wall_s: float | None,
                  decision: dict | None, start: dict | None = None, figures: list[str] = ()) -> str:  # fmt: skip
    lines = ["# The paper's RL grid at toy scale", "",
             f"From the SFT checkpoint `{setup.sft.parent.name}/{setup.sft.name}`, every run in {'bf16' if setup.bf16 else 'fp32'}; tau {setup.temperature}, lr {setup.update_lr:g}, {setup.mini_batches} updates per "
             f"rollout batch, KL coefficient {setup.kl_coef} (k2/k3), "
             f"DAPO overlong buffer {setup.overlong_buffer}; prompts {setup.directions} dev sentences "
             f"`{setup.prompt_sentences}`." + (f" Wall time {wall_s / 60:.0f} min." if wall_s else ""), "",
             f"K = {setup.num_candidates} candidates -> G = {setup.group_size} by RLVR filtering, "
             f"{setup.ppo_epochs} epoch(s) x {setup.mini_batches} mini-batches; validation `{setup.eval_sentences}` "
             f"every {setup.eval_interval} steps.", "",
             "Figures: " + (", ".join(figures) or "none yet") + ".", "",
             "| run | steps | entropy first -> last (min) | ratio | length first -> last | drift | reward first -> last "
             "| clip max | filtered | group chrF++ first -> last |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        lines.append(
            f"| {r['name']} | {r['steps']} | {r['entropy_first']:.2f} -> {r['entropy_last']:.2f} "
            f"({r['entropy_min']:.2f}) | {entropy_ratio(r):.2f} | {r['length_first']:.1f} -> "
            f"{r['length_last']:.1f} | {length_drift(r):+.0%} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} "
            f"| {_num(r.get('clip_fraction_max'), '.3f')} | {_num(r.get('filtered_share_mean'), '.2f')} "
            f"| {_num(r.get('group_chrf_first'), '.1f')} -> {_num(r.get('group_chrf_last'), '.1f')} |"
        )
    lines += ["", *mechanism_lines(records)]
    lines += ["", "## Held-out (devtest) at each run's validation-chosen checkpoint", "",
              *heldout_table(records, start)]  # fmt: skip
    lines += ["", "## Verdicts", "", "| claim | verdict | rule | evidence |", "|---|---|---|---|"]
    for name, claim in claims.items():
        evidence = ", ".join(f"{k} {v}" for k, v in claim["evidence"].items())
        lines.append(f"| {name} | **{claim['verdict']}** | {claim['rule']} | {evidence} |")
    if decision:
        p = decision["point"]
        lines += ["", f"Decision point ({decision.get('run', 'VEPO')} against the SFT policy; {p['direction']}, answer token {p['position']} after {p['context']!r}): "
                  f"the SFT policy's top tokens (id, text, probability SFT -> VEPO) "
                  + ", ".join(f"#{i} {t!r} {a:.3f} -> {b:.3f}" for i, t, a, b in zip(p["ids"], p["tokens"], p["p_sft"], p["p_rl"]))]  # fmt: skip
    return "\n".join(lines) + "\n"


MECHANISMS = (("clip_fraction_max", "a clip acts on more than 1% of tokens at some step", lambda x: x > 0.01),
              ("filtered_share_mean", "RLVR filtering removes candidates", lambda x: x > 0),
              ("ratio_max", "importance ratios leave 1", lambda x: abs(x - 1.0) > 1e-3))  # fmt: skip
"""What shows a mechanism acting in a run: (grid.json field, what it shows, test)."""


def mechanism_lines(records: list[dict]) -> list[str]:
    """One line per mechanism: in how many runs it acted, naming those where it did not."""
    lines = []
    for key, what, acts in MECHANISMS:
        measured = [r for r in records if r.get(key) is not None]
        idle = [r["name"] for r in measured if not acts(r[key])]
        lines.append(f"- {what}: {len(measured) - len(idle)} of {len(measured)} runs"
                     + (f" (not in {', '.join(idle)})" if idle else ""))  # fmt: skip
    return lines


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


HELDOUT_COLUMNS = (("heldout_chrf", "chrF++"), ("heldout_chrf_source", "chrF++ from source"),
                   ("heldout_same_opening", "same opening %"), ("heldout_overall", "overall %"),
                   ("heldout_overall_worst", "worst direction overall %"), ("heldout_step", "chosen step"))  # fmt: skip
START_KEYS = {"heldout_chrf": "chrf", "heldout_chrf_source": "chrf_source", "heldout_same_opening": "same_opening",
              "heldout_overall": "overall_pass", "heldout_overall_worst": "worst_overall_pass"}  # fmt: skip
"""The grid.heldout_summary key of each held-out column, for the SFT start's row."""
DELTA_COLUMNS = (("heldout_chrf_delta_ci95", "chrF++ - SFT"),
                 ("heldout_chrf_source_delta_ci95", "from source - SFT"))  # fmt: skip
"""Paired 95% intervals against the SFT policy, one per seed."""


def heldout_table(records: list[dict], start: dict | None = None) -> list[str]:
    """Markdown rows: one per algorithm (or VEPO ablation) and KL regime, each held-out value as the
    seed mean with the seeds' range, then each seed's paired interval against the SFT policy; '-'
    where no run of the cell was evaluated. start: the SFT checkpoint's eval.heldout summary on the
    same sentences, the first row."""
    cells: dict[tuple[str, str, str], list[dict]] = {}
    for r in records:
        cells.setdefault((r["algorithm"], r.get("variant", FULL), r["kl"]), []).append(r)
    columns = (*HELDOUT_COLUMNS, *DELTA_COLUMNS)
    lines = ["| algorithm | removed part | KL | seeds | " + " | ".join(c[1] for c in columns) + " |",
             "|---|---|---|---|" + "---|" * len(columns)]  # fmt: skip
    if start:
        values = [f"{start[START_KEYS[key]]:.1f}" for key, _ in HELDOUT_COLUMNS[:-1]]
        values[-1] += f" ({start['worst_direction']})"
        lines.append("| SFT (the start) |  |  | 1 | " + " | ".join(values) + " | - | - | - |")
    for (algorithm, variant, kl), rows in cells.items():
        values = []
        for key, _ in HELDOUT_COLUMNS:
            xs = [row[key] for row in rows if row.get(key) is not None]
            if not xs:
                values.append("-")
            elif key == "heldout_overall_worst":
                values.append(", ".join(f"{row[key]:.1f} ({row['heldout_worst_direction']})" for row in rows
                                        if row.get(key) is not None))  # fmt: skip
            elif len(xs) == 1:
                values.append(f"{xs[0]:.1f}" if key != "heldout_step" else str(xs[0]))
            elif key == "heldout_step":
                values.append(", ".join(str(x) for x in xs))
            else:
                values.append(f"{sum(xs) / len(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})")
        for key, _ in DELTA_COLUMNS:
            intervals = [row[key] for row in rows if row.get(key)]
            values.append("; ".join(f"[{lo:+.1f}, {hi:+.1f}]" for lo, hi in intervals) or "-")
        part = "" if variant == FULL else variant
        lines.append(f"| {algorithm} | {part} | {kl} | {len(rows)} | " + " | ".join(values) + " |")
    return lines
