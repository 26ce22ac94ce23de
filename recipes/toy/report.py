"""The toy recipe's results: summary.json (stable key names), results.md, data.json, curves.

    summary = write_report(seed_dirs, shared_dir, "reports/toy")

Per seed: held-out records of the SFT and the RL policy (eval/heldout.py) -> means and the 95%
paired-bootstrap interval of each RL - SFT difference; the constraint table of each policy from
tools/verify_constraints.py; the RL curves (reward, entropy, length, pass rate) of every seed.
summary.json holds the means over seeds and, per metric, the worst interval over seeds (the one
with the lowest lower end); `per_seed` keeps each seed's numbers. The headline numbers use the first
COMPARE_SENTENCES devtest sentences of each direction (the headline comparison set);
when the evaluation covered more, `all_sentences` holds the same summary over all of them (tighter
intervals, same policies).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recipes.toy.recipe import TOOLS, curve_record, sft_curve_steps
from vepo_mcore.eval.heldout import LABELS, METRICS, paired_deltas, read_records, summarize
from vepo_mcore.rewards.constraints import PAPER_VEPO_7B

COMPARE_SENTENCES = 50
"""Devtest sentences per direction behind the headline numbers."""
CURVES = (
    ("reward/total", "reward (raw weighted total, all candidates)"),
    ("reward/mt", "R_mt: chrF++ / 100"),
    ("rollout/entropy", "token entropy (nats)"),
    ("rollout/len_mean", "response length (tokens)"),
    ("constraint/overall", "constraint pass rate (samples)"),
    ("rollout/truncated_frac", "share cut at max_new_tokens"),
)
SUMMARY = (*METRICS, "same_opening", "copy_rate")
"""The summary values averaged over seeds: METRICS (with intervals), same_opening and copy_rate."""
INDOMAIN = ("chrf_indomain", "chrf_source_indomain")
"""With the parallel text: chrF++ and chrf_source on its in-domain held-out pairs (with intervals)."""
ROLLOUT_WINDOW = 10
"""RL steps averaged at each end of a run for group_chrf and entropy_ratio."""


def _seed_of(root: Path) -> int:
    return int(root.name.removeprefix("seed"))


def heldout_records(root: Path, name: str, limit: int | None = None) -> list[dict]:
    """root/heldout_<name>.jsonl, only the first `limit` sentences of each direction when given."""
    records = read_records(root / f"heldout_{name}.jsonl")
    return records if limit is None else [r for r in records if r["index"] < limit]


def seed_result(root: Path) -> dict:
    """One seed's summaries on the comparison set: SFT, RL, the RL - SFT intervals, and (when the
    policy before SFT was evaluated) its summary and the SFT - before intervals; `all` the SFT / RL
    summaries over every evaluated sentence when there are more."""
    sft, rl = heldout_records(root, "sft", COMPARE_SENTENCES), heldout_records(root, "rl", COMPARE_SENTENCES)
    result = {
        "seed": _seed_of(root),
        "sft": summarize(sft),
        "rl": summarize(rl),
        "delta_ci95": paired_deltas(sft, rl),
        "wall_s": json.loads((root / "timings.json").read_text()),
    }
    if (root / "rl_selected.json").is_file():  # run_toy --rl-validation: the checkpoint validation chose
        result["rl_step"] = json.loads((root / "rl_selected.json").read_text())["step"]
    if (root / "heldout_cpt.jsonl").is_file():
        before = heldout_records(root, "cpt", COMPARE_SENTENCES)
        result["before_sft"] = summarize(before)
        result["sft_delta_ci95"] = paired_deltas(before, sft)
    if (root / "heldout_sft_indomain.jsonl").is_file():
        _add_indomain(root, result)
    _add_rollout_measures(root, result)
    sft_all, rl_all = heldout_records(root, "sft"), heldout_records(root, "rl")
    if len(sft_all) > len(sft):
        result["all"] = {
            "sft": summarize(sft_all),
            "rl": summarize(rl_all),
            "delta_ci95": paired_deltas(sft_all, rl_all),
        }
    return result


def _add_indomain(root: Path, result: dict) -> None:
    """chrf_indomain / chrf_source_indomain (with their RL - SFT intervals) and copy_rate_indomain of
    the SFT and RL policies."""
    sft, rl = (
        heldout_records(root, "sft_indomain", COMPARE_SENTENCES),
        heldout_records(root, "rl_indomain", COMPARE_SENTENCES),
    )
    deltas = paired_deltas(sft, rl)
    for name, records in (("sft", sft), ("rl", rl)):
        summary = summarize(records)
        result[name] |= {
            "chrf_indomain": summary["chrf"],
            "chrf_source_indomain": summary["chrf_source"],
            "copy_rate_indomain": summary["copy_rate"],
        }
    result["delta_ci95"] |= {"chrf_indomain": deltas["chrf"], "chrf_source_indomain": deltas["chrf_source"]}


def _add_rollout_measures(root: Path, result: dict) -> None:
    """From the RL run's metrics: group_chrf (mean pairwise chrF++ of a prompt's samples) of the SFT
    policy (the first ROLLOUT_WINDOW steps) and of the RL policy (the last), and entropy_ratio, the
    sampled token entropy of the last ROLLOUT_WINDOW steps over the first's."""
    from vepo_mcore.training.logging import read_metrics

    rows = [r for r in read_metrics(root / "rl" / "metrics.jsonl") if "rollout/entropy" in r]
    if not rows:
        return
    first, last = rows[:ROLLOUT_WINDOW], rows[-ROLLOUT_WINDOW:]

    def mean(window: list[dict], key: str) -> float:
        values = [r[key] for r in window if key in r]
        return sum(values) / len(values) if values else float("nan")

    result["sft"]["group_chrf"] = mean(first, "rollout/group_chrf")
    result["rl"]["group_chrf"] = mean(last, "rollout/group_chrf")
    result["rl"]["entropy_ratio"] = mean(last, "rollout/entropy") / mean(first, "rollout/entropy")


CURVE_GOALS = {"chrf_source": 3.0, "chrf_source_indomain": 10.0, "copy_rate": 50.0}
"""The toy's goals after SFT, drawn on the by-SFT-step curves."""


def sft_curve(root: Path) -> list[dict]:
    """chrF++, chrf_source and copy_rate (devtest and in-domain, the first COMPARE_SENTENCES per
    direction) of every kept SFT checkpoint of one seed, the last one included; [] when only the
    last was kept."""
    steps = sft_curve_steps(root)
    if not steps:
        return []
    points = [
        _curve_point(
            step, read_records(curve_record(root, step, False)), read_records(curve_record(root, step, True))
        )
        for step in steps
    ]
    last = int((root / "sft" / "latest_checkpointed_iteration.txt").read_text())
    points.append(
        _curve_point(
            last,
            heldout_records(root, "sft", COMPARE_SENTENCES),
            heldout_records(root, "sft_indomain", COMPARE_SENTENCES),
        )
    )
    return points


def _curve_point(step: int, devtest: list[dict], indomain: list[dict]) -> dict:
    dev, ind = summarize(devtest), summarize(indomain)
    return {"step": step, "chrf": dev["chrf"], "chrf_source": dev["chrf_source"], "copy_rate": dev["copy_rate"],
            "numbers_kept": dev["numbers_kept"], "names_kept": dev["names_kept"], "chrf_indomain": ind["chrf"],
            "chrf_source_indomain": ind["chrf_source"], "copy_rate_indomain": ind["copy_rate"]}  # fmt: skip


def plot_sft_curve(curves: dict[str, list[dict]], path: Path) -> Path:
    """chrf_source on devtest and in-domain, devtest chrF++, and the names and numbers kept (devtest
    solid, its names alone dash-dotted, in-domain dotted) by SFT step, one line per seed, the goals
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
    panels = (("chrf_source", "devtest chrf_source"), ("chrf_source_indomain", "in-domain chrf_source"),
              ("chrf", "devtest chrF++"), ("copy_rate", "names and numbers kept, %\n(devtest names alone -., in-domain :)"))  # fmt: skip
    for ax, (key, title) in zip(axes, panels):
        for i, (seed, points) in enumerate(curves.items()):
            steps = [p["step"] for p in points]
            ax.plot(steps, [p[key] for p in points], marker="o", color=f"C{i}", label=seed)
            if key == "copy_rate":
                for other, style in (("names_kept", "-."), ("copy_rate_indomain", ":")):
                    ax.plot(steps, [p[other] for p in points], marker=".", linestyle=style, color=f"C{i}")
        if key in CURVE_GOALS:
            ax.axhline(CURVE_GOALS[key], color="grey", linestyle="--", label="goal")
        ax.set_title(title)
        ax.set_xlabel("SFT step (8 packed sequences of 256 tokens)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def constraint_tables(root: Path, out_dir: Path) -> dict[str, dict]:
    """tools/verify_constraints.py on the SFT and RL hypotheses of one seed (markdown + JSON);
    returns each policy's overall row (percent)."""
    rows = {}
    for name in ("sft", "rl"):
        records = heldout_records(root, name, COMPARE_SENTENCES)
        hyps = out_dir / f"{root.name}_{name}_hyps.jsonl"
        hyps.write_text("".join(json.dumps({"source": r["source"], "hypothesis": r["hypothesis"],
                                            "src_lang": r["direction"].split("-")[0],
                                            "tgt_lang": r["direction"].split("-")[1]}, ensure_ascii=False) + "\n"
                                for r in records), encoding="utf-8")  # fmt: skip
        subprocess.run([sys.executable, str(TOOLS / "verify_constraints.py"), "--input", str(hyps),
                        "--out", str(out_dir / f"{root.name}_constraints_{name}")],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        hyps.unlink()
        table = json.loads((out_dir / f"{root.name}_constraints_{name}.json").read_text())
        rows[name] = table["overall"]
    return rows


def plot_rl_curves(seed_dirs: list[Path], path: Path) -> Path:
    from vepo_mcore.training.curves import plot_curves
    from vepo_mcore.training.logging import read_metrics

    histories = {root.name: read_metrics(root / "rl" / "metrics.jsonl") for root in seed_dirs}
    return plot_curves(histories, path, panels=CURVES, smooth=0.9)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


SEED_STAGES = ("resize", "cpt", "sft", "rl", "eval_sft", "eval_rl")
"""The stages every seed runs (timings.json keys); a seed dir whose checkpoints were copied in did
not time them."""


def one_seed_wall(
    shared: dict[str, float], seed_walls: list[dict[str, float]]
) -> tuple[float | None, int | None]:
    """(wall seconds of one seed of the recipe, index of the seed it comes from): the shared stages
    plus the fastest seed that timed every stage of SEED_STAGES (every seed does the same work, and
    other work sharing the machine only slows a seed down); (None, None) when no seed timed them all."""
    complete = [i for i, w in enumerate(seed_walls) if all(stage in w for stage in SEED_STAGES)]
    if not complete:
        return None, None
    fastest = min(complete, key=lambda i: sum(seed_walls[i].values()))
    return sum(shared.values()) + sum(seed_walls[fastest].values()), fastest


def write_report(seed_dirs: list[Path], shared_dir: Path, out_dir: str | Path) -> dict:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [seed_result(root) for root in seed_dirs]
    for root, seed in zip(seed_dirs, seeds):
        seed["constraint_table"] = constraint_tables(root, out)
    shared = (
        json.loads((shared_dir / "timings.json").read_text())
        if (shared_dir / "timings.json").is_file()
        else {}
    )
    wall, fastest = one_seed_wall(shared, [s["wall_s"] for s in seeds])
    summary = {
        "seeds": [s["seed"] for s in seeds],
        "wall_s_one_seed": wall,
        "sft": _means(seeds, "sft"),
        "rl": _means(seeds, "rl"),
        "delta_ci95": {
            name: min((s["delta_ci95"][name] for s in seeds), key=lambda ci: ci[0])
            for name in seeds[0]["delta_ci95"]
        },
        "stage_wall_s": {**shared, **(seeds[fastest]["wall_s"] if fastest is not None else {})},
        "per_seed": seeds,
    }
    if all("all" in s for s in seeds):
        summary["all_sentences"] = {
            "n": [s["all"]["sft"]["n"] for s in seeds],
            "sft": {name: _mean([s["all"]["sft"][name] for s in seeds]) for name in SUMMARY},
            "rl": {name: _mean([s["all"]["rl"][name] for s in seeds]) for name in SUMMARY},
            "delta_ci95": {name: min((s["all"]["delta_ci95"][name] for s in seeds), key=lambda ci: ci[0])
                           for name in METRICS},
        }  # fmt: skip
    if all("before_sft" in s for s in seeds):
        summary["before_sft"] = {name: _mean([s["before_sft"][name] for s in seeds]) for name in SUMMARY}
        summary["sft_delta_ci95"] = {name: min((s["sft_delta_ci95"][name] for s in seeds), key=lambda ci: ci[0])
                                     for name in METRICS}  # fmt: skip
    curves = {f"seed{s['seed']}": points for s, root in zip(seeds, seed_dirs) if (points := sft_curve(root))}
    if curves:
        summary["sft_curve"] = curves
        plot_sft_curve(curves, out / "sft_curve.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if (shared_dir / "bitext" / "data.json").is_file():
        (out / "data.json").write_text((shared_dir / "bitext" / "data.json").read_text())
    data = out / "data.json"
    (out / "results.md").write_text(
        results_markdown(summary) + (data_markdown(json.loads(data.read_text())) if data.is_file() else "")
    )
    plot_rl_curves(seed_dirs, out / "rl_curves.png")
    return summary


def _means(seeds: list[dict], policy: str) -> dict[str, float]:
    """Mean over seeds of every value the seeds' `policy` summaries share (n excluded)."""
    names = [k for k in seeds[0][policy] if k != "n" and all(k in s[policy] for s in seeds)]
    return {name: _mean([s[policy][name] for s in seeds]) for name in names}


def _row(label: str, values: list[float], fmt: str = "{:.1f}") -> str:
    return f"| {label} | " + " | ".join(fmt.format(v) for v in values) + " |"


def _header(names: list[str]) -> str:
    return "| | " + " | ".join(LABELS[n] for n in names) + " |\n|---|" + "---|" * len(names)


def results_markdown(summary: dict) -> str:
    names, deltas = list(SUMMARY), list(METRICS)
    header = _header(names)
    lines = ["# Toy recipe: held-out results (generated by tools/run_toy.py)", "",
             f"FLORES devtest, the first {COMPARE_SENTENCES} sentences of each direction; greedy decoding. "
             "Seeds: " + ", ".join(map(str, summary["seeds"])) + ".",
             _wall_line(summary["wall_s_one_seed"]), "",
             header]  # fmt: skip
    for s in summary["per_seed"]:
        if "before_sft" in s:
            lines.append(_row(f"before SFT (CPT), seed {s['seed']}", [s["before_sft"][n] for n in names]))
        lines.append(_row(f"SFT, seed {s['seed']}", [s["sft"][n] for n in names]))
        lines.append(_row(_rl_label(s), [s["rl"][n] for n in names]))
    lines.append(_row("SFT, mean", [summary["sft"][n] for n in names]))
    lines.append(_row("RL, mean", [summary["rl"][n] for n in names]))
    lines += ["", "RL - SFT, 95% paired-bootstrap interval (percentage points; chrF++ points):", "",
              _header(deltas)]  # fmt: skip
    for s in summary["per_seed"]:
        cells = [f"[{lo:+.1f}, {hi:+.1f}]" for lo, hi in (s["delta_ci95"][n] for n in deltas)]
        lines.append(f"| seed {s['seed']} | " + " | ".join(cells) + " |")
    if "all_sentences" in summary:
        lines += ["", f"The same policies on every evaluated devtest sentence ({summary['per_seed'][0]['all']['sft']['n']} "
                  "prompts per policy and seed):", "", header]  # fmt: skip
        for s in summary["per_seed"]:
            lines.append(_row(f"SFT, seed {s['seed']}", [s["all"]["sft"][n] for n in names]))
            lines.append(_row(f"RL, seed {s['seed']}", [s["all"]["rl"][n] for n in names]))
        lines += ["", _header(deltas)]
        for s in summary["per_seed"]:
            cells = [f"[{lo:+.1f}, {hi:+.1f}]" for lo, hi in (s["all"]["delta_ci95"][n] for n in deltas)]
            lines.append(f"| RL - SFT, seed {s['seed']} | " + " | ".join(cells) + " |")
    extra = [
        k
        for k in (
            "chrf_indomain",
            "chrf_source_indomain",
            "copy_rate_indomain",
            "group_chrf",
            "entropy_ratio",
        )
        if k in summary["rl"]
    ]
    if extra:
        lines += ["", "In-domain held-out pairs (the parallel text's test set), the within-group pairwise chrF++ of the "
                  f"RL samples (SFT: its first {ROLLOUT_WINDOW} steps, RL: its last) and the sampled entropy of the "
                  "last steps over the first:", "", "| | " + " | ".join(extra) + " |", "|---|" + "---|" * len(extra)]  # fmt: skip
        for s in summary["per_seed"]:
            for policy in ("sft", "rl"):
                cells = [f"{s[policy][k]:.2f}" if k in s[policy] else "" for k in extra]
                lines.append(f"| {policy.upper()}, seed {s['seed']} | " + " | ".join(cells) + " |")
    if "sft_curve" in summary:
        lines += ["", f"The SFT policy by SFT step (sft_curve.png; the first {COMPARE_SENTENCES} sentences per direction):",
                  "", "| seed | step | devtest chrF++ | devtest chrf_source | names/numbers kept (numbers, names) | "
                  "in-domain chrF++ | in-domain chrf_source | in-domain names/numbers kept |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for seed, points in summary.get("sft_curve", {}).items():
        for p in points:
            lines.append(f"| {seed} | {p['step']} | {p['chrf']:.1f} | {p['chrf_source']:.2f} | {p['copy_rate']:.1f} "
                         f"({p['numbers_kept']:.0f}, {p['names_kept']:.0f}) | "
                         f"{p['chrf_indomain']:.1f} | {p['chrf_source_indomain']:.2f} | "
                         f"{p['copy_rate_indomain']:.1f} |")  # fmt: skip
    lines += ["", "The paper's constraint table (tools/verify_constraints.py on the same hypotheses; Format is",
              "rated only where the source has structure, N of them):", "",
              "| system | Lang | Length | Format (N) | Mixing | Overall |", "|---|---|---|---|---|---|"]  # fmt: skip
    for s in summary["per_seed"]:
        for name in ("sft", "rl"):
            row = s["constraint_table"][name]
            fmt = "n/a" if row["format"] is None else f"{row['format']:.1f}"
            lines.append(f"| {name.upper()}, seed {s['seed']} | {row['lang']:.1f} | {row['length']:.1f} | "
                         f"{fmt} ({row['format_n']}) | {row['mixing']:.1f} | {row['overall']:.1f} |")  # fmt: skip
    paper = PAPER_VEPO_7B
    lines.append(f"| paper, VEPO-7B (90 directions) | {paper['lang']} | {paper['length']} | {paper['format']} | "
                 f"{paper['mixing']} | {paper['overall']} |")  # fmt: skip
    lines += ["", "Wall time per seed (s, tokenizer and data once on top): "
              + ", ".join(f"seed {s['seed']} {_seed_wall(s['wall_s'])}" for s in summary["per_seed"]),
              "", "Stage wall times (s, the fastest seed that timed every stage; tokenizer and data once):", "",
              "| " + " | ".join(summary["stage_wall_s"]) + " |",
              "|" + "---|" * len(summary["stage_wall_s"]),
              "| " + " | ".join(f"{v:.0f}" for v in summary["stage_wall_s"].values()) + " |", ""]  # fmt: skip
    return "\n".join(lines)


def data_markdown(manifest: dict) -> str:
    """The parallel text's sources (data.json): package, version, license, pairs kept per language."""
    langs = sorted(manifest["pairs_total"])
    lines = ["", "Parallel text (tools/build_parallel_corpus.py; pairs kept per language, held-out pairs included):", "",
             "| source | package | version | license | " + " | ".join(langs) + " |",
             "|---|---|---|---|" + "---|" * len(langs)]  # fmt: skip
    for s in manifest["sources"]:
        cells = [f"{s['pairs'][lang]:,}" if lang in s["pairs"] else "" for lang in langs]
        lines.append(
            f"| {s['source']} | {s['package']} | {s['version']} | {s['license']} | "
            + " | ".join(cells)
            + " |"
        )
    lines.append(
        "| **train** | | | | " + " | ".join(f"{manifest['pairs_total'][lang]:,}" for lang in langs) + " |"
    )
    lines.append(
        "| **held out** | | | | " + " | ".join(f"{manifest['heldout'][lang]:,}" for lang in langs) + " |"
    )
    return "\n".join(lines) + "\n"


def _rl_label(seed: dict) -> str:
    step = f" (step {seed['rl_step']}, chosen by validation)" if "rl_step" in seed else ""
    return f"RL{step}, seed {seed['seed']}"


def _wall_line(wall: float | None) -> str:
    if wall is None:
        return (
            "One seed of the whole recipe: not timed here (no seed ran every stage in these run directories)."
        )
    return (
        f"One seed of the whole recipe: {wall / 60:.1f} min wall on this machine (the shared stages and the "
        "fastest seed's, as they ran: seeds run side by side share the cores and take longer than one alone)."
    )


def _seed_wall(wall: dict[str, float]) -> str:
    missing = [stage for stage in SEED_STAGES if stage not in wall]
    total = f"{sum(wall.values()):.0f}"
    return total if not missing else f"{total} (not timed here: {', '.join(missing)})"
