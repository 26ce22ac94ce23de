"""chrf_source after SFT against model size, learning rate and SFT steps, from runs of
recipes/toy/model_size.sh:

    python -m recipes.toy.size_curve runs/toy_sizes [runs/toy_sizes_lr5e-4 ...]
    # -> reports/toy/size_curve.{json,md,png}

Each run (OUT/L<layers>_h<hidden>/seed0) went through the toy recipe up to SFT with the same data
and seed; the OUT folders differ in their learning rates or SFT steps (model_size.sh's ARGS). Its SFT
policy is scored on FLORES devtest and the in-domain held-out pairs (the first 50 sentences per
direction); the intervals are 95% paired-bootstrap intervals of the change against the recipe itself
(4 layers, hidden 256, the recipe's learning rates and SFT steps), sentence by sentence.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipes.toy.figures import _pyplot, _save
from recipes.toy.recipe import CONFIGS
from recipes.toy.report import COMPARE_SENTENCES, heldout_records
from vepo_mcore.config.base import load_config
from vepo_mcore.config.job import JobConfig
from vepo_mcore.eval.heldout import paired_deltas, summarize
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.training.memory_plan import parameter_counts

RECIPE_SIZE = "L4_h256"
"""The toy recipe's model (recipes/toy/configs)."""
SETS = {"devtest": "sft", "indomain": "sft_indomain"}
GOALS = {"devtest": 3.0, "indomain": 10.0}
"""The chrf_source the toy aims for after SFT on each test set."""
TITLES = {
    "devtest": "FLORES devtest (first 50 sentences per direction)",
    "indomain": "in-domain held-out pairs",
}
KEYS = ("chrf", "chrf_source", "copy_rate", "overall_pass", "same_opening")


def run_record(run: Path, heldout: dict[str, list[dict]]) -> dict:
    """One run: its model, parameters, SFT learning rate and steps and, per test set in `heldout`
    (name -> its held-out records), the SFT policy's summary."""
    cfg = load_config(JobConfig, run / "seed0" / "sft" / "config.yaml")  # what SFT trained
    model = cfg.model
    params = parameter_counts(
        model, padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by)
    ).total(model.num_layers, model.tie_word_embeddings)
    record = {"run": f"{run.parent.name}/{run.name}", "layers": model.num_layers, "hidden": model.hidden_size,
              "parameters": params, "lr": cfg.training.optimizer.lr, "sft_iters": cfg.training.train_iters}  # fmt: skip
    for name, records in heldout.items():
        summary = summarize(records)
        record[name] = {key: summary[key] for key in KEYS} | {"n": summary["n"]}
    return record


def size_curve(outs: list[Path]) -> list[dict]:
    """Every run under `outs` scored on devtest, by SFT steps (most first), learning rate (highest
    first) then size, with its intervals against the recipe's run (its size, SFT learning rate and
    steps)."""

    def scored(run: Path, stem: str) -> bool:
        return (run / "seed0" / f"heldout_{stem}.jsonl").is_file()

    runs = sorted(p for out in outs for p in out.glob("L*_h*") if scored(p, SETS["devtest"]))
    heldout = {run: {name: heldout_records(run / "seed0", stem, COMPARE_SENTENCES) for name, stem in SETS.items()
                     if scored(run, stem)} for run in runs}  # fmt: skip
    records = {run: run_record(run, heldout[run]) for run in runs}
    recipe = load_config(JobConfig, CONFIGS / "sft.yaml").training
    settings = (recipe.train_iters, recipe.optimizer.lr)
    reference = next(
        (run for run in runs if run.name == RECIPE_SIZE and _settings(records[run]) == settings), None
    )
    if reference is None:
        raise FileNotFoundError(
            f"no {RECIPE_SIZE} run at the recipe's SFT learning rate ({settings[1]:g}) and steps "
            f"({settings[0]}) under {', '.join(map(str, outs))}: the curve compares every run with "
            "the recipe itself"
        )
    records[reference]["recipe"] = True
    for run, record in records.items():
        for name, system in heldout[run].items():
            if run != reference and name in heldout[reference]:
                deltas = paired_deltas(heldout[reference][name], system)
                record[name]["delta_ci95"] = {key: deltas[key] for key in ("chrf", "chrf_source")}
    return sorted(records.values(), key=lambda r: (-r["sft_iters"], -r["lr"], r["parameters"]))


def _settings(record: dict) -> tuple[int, float]:
    """A run's SFT steps and learning rate."""
    return record["sft_iters"], record["lr"]


def plot_size_curve(records: list[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, (*axes, key) = plt.subplots(1, 3, figsize=(12, 4.2), width_ratios=(1, 1, 0.55))
    lines = sorted({_settings(r) for r in records}, reverse=True)
    params = sorted({r["parameters"] / 1e6 for r in records})
    for ax, (name, goal) in zip(axes, GOALS.items()):
        for (iters, lr), color in zip(lines, ("C0", "C1", "C2", "C3", "C4", "C5")):
            points = [
                (r["parameters"] / 1e6, r[name]["chrf_source"])
                for r in records
                if _settings(r) == (iters, lr) and name in r
            ]
            if points:
                ax.plot(*zip(*points), "o-", color=color, label=f"learning rate {lr:g}, {iters:,} SFT steps")
        ax.axhline(goal, color="grey", ls=":", lw=1, label=f"goal ({goal:g})")
        ax.set_xscale("log")
        ax.set_xticks(params, [f"{x:.1f}M" for x in params])
        ax.minorticks_off()
        ax.set_xlabel("parameters (tied embedding included)")
        ax.set_ylabel("chrf_source after SFT (chrF++ points)")
        ax.set_title(TITLES[name], fontsize=9)
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    key.axis("off")
    key.legend(handles.values(), handles.keys(), loc="center left", fontsize=8)
    fig.suptitle(
        "The toy's SFT policy by model size, learning rate and SFT steps (the recipe's data, seed)",
        fontsize=10,
    )
    return _save(fig, path)


def _change(record: dict, name: str) -> str:
    """The table cell of one test set's chrf_source change against the recipe."""
    if name not in record:
        return "-"
    if record.get("recipe"):
        return "the recipe"
    if "delta_ci95" not in record[name]:
        return "-"  # the recipe's run was not scored on this set
    return "[{:+.1f}, {:+.1f}]".format(*record[name]["delta_ci95"]["chrf_source"])


def size_table(records: list[dict]) -> list[str]:
    lines = ["| model | learning rate | SFT steps | parameters | devtest chrF++ | devtest chrf_source | devtest copy_rate "
             "| in-domain chrF++ | in-domain chrf_source | change of chrf_source against the recipe (devtest / in-domain) |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        cells = []
        for name in SETS:
            s = r.get(name)
            cells.append(["-", "-"] if s is None else [f"{s['chrf']:.1f}", f"{s['chrf_source']:.2f}"])
        change = " / ".join(_change(r, name) for name in SETS)
        copy = f"{r['devtest']['copy_rate']:.1f}%"
        lines.append(f"| {r['layers']} x {r['hidden']} | {r['lr']:g} | {r['sft_iters']:,} | {r['parameters'] / 1e6:.1f}M | "
                     f"{' | '.join(cells[0])} | {copy} | {' | '.join(cells[1])} | {change} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outs", type=Path, nargs="+", help="recipes/toy/model_size.sh's OUT folders")
    p.add_argument("--report-dir", type=Path, default=Path("reports/toy"))
    args = p.parse_args(argv)
    records = size_curve(args.outs)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    (args.report_dir / "size_curve.json").write_text(json.dumps(records, indent=1) + "\n")
    (args.report_dir / "size_curve.md").write_text("\n".join(size_table(records)) + "\n")
    print("\n".join(size_table(records)))
    print(f"figure: {plot_size_curve(records, args.report_dir / 'size_curve.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
