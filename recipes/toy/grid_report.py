"""The grid's report: grid.json, the paper's figures, the decision-point study, claims.json, grid.md.

write_grid_report(runs, "reports/toy/grid_runs", "reports/toy", setup, wall_s)
"""

from __future__ import annotations

import json
from pathlib import Path

from recipes.toy.claims import all_claims, entropy_ratio, length_drift
from recipes.toy.figures import plot_decision_point, plot_grid_metric, plot_overlong
from recipes.toy.grid import GridRun, GridSetup, grid_records, read_histories


def _decision_study(runs: list[GridRun], out: Path, setup: GridSetup, report: Path) -> dict | None:
    """C7 on the first seed's VEPO (no KL) against the SFT checkpoint every run started from."""
    from recipes.toy.decision import decision_point_study
    from vepo_mcore.eval.heldout import read_records

    vepo = next((r for r in runs if r.keeps_checkpoint and (out / r.name / "checkpoint").is_dir()), None)
    heldout = setup.sft.parent / "heldout_sft.jsonl"
    if vepo is None or not heldout.is_file():
        return None
    study = decision_point_study(setup.sft, out / vepo.name / "checkpoint", read_records(heldout))
    point = study["point"]
    plot_decision_point(point["tokens"], point["ids"], point["p_sft"], point["p_rl"],
                        f"{point['direction']}, answer token {point['position']}: "
                        f"entropy SFT {point['entropy_sft']:.2f} -> VEPO {point['entropy_rl']:.2f} nats",
                        report / "grid_decision_point.png")  # fmt: skip
    return study


def write_grid_report(runs: list[GridRun], out: str | Path, report_dir: str | Path, setup: GridSetup,
                      wall_s: float | None = None, study: bool = True) -> dict:  # fmt: skip
    """Everything the grid's command regenerates; returns the claims."""
    out, report = Path(out), Path(report_dir)
    report.mkdir(parents=True, exist_ok=True)
    histories = read_histories(runs, out)
    records = grid_records(histories)
    (report / "grid.json").write_text(json.dumps(records, indent=1) + "\n")
    cells: dict[tuple[str, str], list[list[dict]]] = {}
    for run, rows in histories.items():
        if not run.overlong:
            cells.setdefault((run.algorithm, run.kl), []).append(rows)
    plot_grid_metric(
        cells, "rollout/entropy", "token entropy of the samples (nats)", report / "grid_entropy.png"
    )
    plot_grid_metric(cells, "rollout/len_mean", "response length (tokens)", report / "grid_length.png")
    seed0 = min((run.seed for run in histories), default=0)
    pair = [histories.get(GridRun("dapo", "none", seed0, overlong=o)) for o in (False, True)]
    overlong = tuple(pair) if all(pair) else None
    if overlong:
        vepo = histories.get(GridRun("vepo", "none", seed0))
        arms = {
            "DAPO": overlong[0],
            "DAPO + overlong penalty": overlong[1],
            **({"VEPO": vepo} if vepo else {}),
        }
        plot_overlong(arms, report / "grid_overlong.png")
    toy_summary_file = report / "summary.json"
    toy_summary = json.loads(toy_summary_file.read_text()) if toy_summary_file.is_file() else None
    decision = _decision_study(runs, out, setup, report) if study else None
    claims = all_claims(records, {run.name: rows for run, rows in histories.items()}, overlong, toy_summary,
                        decision)  # fmt: skip
    (report / "claims.json").write_text(json.dumps(claims, indent=1) + "\n")
    (report / "grid.md").write_text(grid_markdown(records, claims, setup, wall_s, decision))
    return claims


def grid_markdown(records: list[dict], claims: dict, setup: GridSetup, wall_s: float | None,
                  decision: dict | None) -> str:  # fmt: skip
    lines = ["# The paper's RL grid at toy scale", "",
             f"From `{setup.sft}`; tau {setup.temperature}, lr {setup.lr}, {setup.mini_batches} updates per "
             f"rollout batch, KL coefficient {setup.kl_coef} (k2/k3), "
             f"DAPO overlong buffer {setup.overlong_buffer}; prompts {setup.directions} dev sentences "
             f"`{setup.prompt_sentences}`." + (f" Wall time {wall_s / 60:.0f} min." if wall_s else ""), "",
             "Figures: grid_entropy.png, grid_length.png, grid_overlong.png, grid_decision_point.png.", "",
             "| run | steps | entropy first -> last (min) | ratio | length first -> last | drift | reward first -> last |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        lines.append(
            f"| {r['name']} | {r['steps']} | {r['entropy_first']:.2f} -> {r['entropy_last']:.2f} "
            f"({r['entropy_min']:.2f}) | {entropy_ratio(r):.2f} | {r['length_first']:.1f} -> "
            f"{r['length_last']:.1f} | {length_drift(r):+.0%} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} |"
        )
    lines += ["", "## Verdicts", "", "| claim | verdict | rule | evidence |", "|---|---|---|---|"]
    for name, claim in claims.items():
        evidence = ", ".join(f"{k} {v}" for k, v in claim["evidence"].items())
        lines.append(f"| {name} | **{claim['verdict']}** | {claim['rule']} | {evidence} |")
    if decision:
        p = decision["point"]
        lines += ["", f"Decision point ({p['direction']}, answer token {p['position']} after {p['context']!r}): "
                  f"the SFT policy's top tokens (id, text, probability SFT -> VEPO) "
                  + ", ".join(f"#{i} {t!r} {a:.3f} -> {b:.3f}" for i, t, a, b in zip(p["ids"], p["tokens"], p["p_sft"], p["p_rl"]))]  # fmt: skip
    return "\n".join(lines) + "\n"
