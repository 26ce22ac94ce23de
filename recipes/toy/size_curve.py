"""chrf_source after SFT against model size, from the runs of recipes/toy/model_size.sh:

    python -m recipes.toy.size_curve runs/toy_sizes      # -> reports/toy/size_curve.{json,md,png}

Each size (OUT/L<layers>_h<hidden>/seed0) went through the toy recipe up to SFT with the same data,
budgets and seed. Its SFT policy is scored on FLORES devtest (the first 50 sentences per direction)
and the in-domain held-out pairs; the intervals are 95% paired-bootstrap intervals of the change
against the recipe's size (4 layers, hidden 256), sentence by sentence.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipes.toy.figures import _pyplot, _save
from vepo_mcore.config.base import load_config
from vepo_mcore.config.job import JobConfig
from vepo_mcore.eval.heldout import paired_deltas, read_records, summarize
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.training.memory_plan import parameter_counts

RECIPE_SIZE = "L4_h256"
"""The toy recipe's model (recipes/toy/configs): the reference of every interval."""
SETS = {"devtest": "heldout_sft.jsonl", "indomain": "heldout_sft_indomain.jsonl"}
GOALS = {"devtest": 3.0, "indomain": 10.0}
"""The chrf_source the toy aims for after SFT on each test set."""
KEYS = ("chrf", "chrf_source", "copy_rate", "overall_pass", "same_opening")


def size_record(run: Path, reference: Path) -> dict:
    """One size: its model, parameters and, per test set, the SFT policy's summary and the intervals
    of its change against `reference` (a run directory of the recipe's size)."""
    model = load_config(JobConfig, run / "seed0" / "sft" / "config.yaml").model  # what SFT trained
    params = parameter_counts(
        model, padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by)
    ).total(model.num_layers, model.tie_word_embeddings)
    record = {"run": run.name, "layers": model.num_layers, "hidden": model.hidden_size, "parameters": params}
    for name, file in SETS.items():
        records = read_records(run / "seed0" / file)
        summary = summarize(records)
        record[name] = {key: summary[key] for key in KEYS if key in summary} | {"n": len(records)}
        if run != reference:
            deltas = paired_deltas(read_records(reference / "seed0" / file), records)
            record[name]["delta_ci95"] = {key: deltas[key] for key in ("chrf", "chrf_source")}
    return record


def size_curve(out: Path) -> list[dict]:
    """Every finished size under `out`, smallest first."""
    runs = sorted(p for p in out.glob("L*_h*") if (p / "seed0" / SETS["indomain"]).is_file())
    if not any(p.name == RECIPE_SIZE for p in runs):
        raise FileNotFoundError(
            f"{out / RECIPE_SIZE}: the recipe's size has no SFT evaluation to compare with"
        )
    reference = out / RECIPE_SIZE
    return sorted((size_record(run, reference) for run in runs), key=lambda r: r["parameters"])


def plot_size_curve(records: list[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    params = [r["parameters"] / 1e6 for r in records]
    for (name, goal), color in zip(GOALS.items(), ("C0", "C1")):
        ax.plot(
            params, [r[name]["chrf_source"] for r in records], "o-", color=color, label=f"{name} chrf_source"
        )
        ax.axhline(goal, color=color, ls=":", lw=1, label=f"{name} goal ({goal:g})")
    for r, x in zip(records, params):
        ax.annotate(f"{r['layers']}x{r['hidden']}", (x, r["indomain"]["chrf_source"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=8)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(params, [f"{x:.1f}M" for x in params])
    ax.minorticks_off()
    ax.set_xlabel("parameters (tied embedding included)")
    ax.set_ylabel("chrf_source after SFT (chrF++ points)")
    ax.set_title("The toy's SFT policy by model size (the recipe's data, steps, learning rates, seed)",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=8)
    return _save(fig, path)


def size_table(records: list[dict]) -> list[str]:
    lines = ["| model | parameters | devtest chrF++ | devtest chrf_source | in-domain chrF++ | in-domain chrf_source "
             "| change against 4 x 256 (devtest / in-domain chrf_source) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        dev, ind = r["devtest"], r["indomain"]
        change = " / ".join(
            "[{:+.1f}, {:+.1f}]".format(*s["delta_ci95"]["chrf_source"]) if "delta_ci95" in s else "reference"
            for s in (dev, ind)
        )
        lines.append(f"| {r['layers']} x {r['hidden']} | {r['parameters'] / 1e6:.1f}M | {dev['chrf']:.1f} | "
                     f"{dev['chrf_source']:.2f} | {ind['chrf']:.1f} | {ind['chrf_source']:.2f} | {change} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="recipes/toy/model_size.sh's OUT")
    p.add_argument("--report-dir", type=Path, default=Path("reports/toy"))
    args = p.parse_args(argv)
    records = size_curve(args.out)
    args.report_dir.mkdir(parents=True, exist_ok=True)
    (args.report_dir / "size_curve.json").write_text(json.dumps(records, indent=1) + "\n")
    (args.report_dir / "size_curve.md").write_text("\n".join(size_table(records)) + "\n")
    print("\n".join(size_table(records)))
    print(f"figure: {plot_size_curve(records, args.report_dir / 'size_curve.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
