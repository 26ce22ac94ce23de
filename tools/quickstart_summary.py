"""Print the quickstart's summary: RL reward and constraint pass rates, RM accuracy, chrF before/after
RL, plots.

python tools/quickstart_summary.py runs/quickstart
"""

import argparse
import json
from pathlib import Path

import yaml


def _rows(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )


def _scores(run: Path, name: str) -> dict:
    path = run / name / "scores.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="the quickstart's output directory")
    run = Path(p.parse_args(argv).run)
    lines = ["", "=" * 72, f"vepo_mcore quickstart summary ({run})", "=" * 72]
    for stage in ("cpt", "sft"):
        rows = [r for r in _rows(run / stage / "metrics.jsonl") if "train/loss" in r]
        if rows:
            lines.append(
                f"{stage.upper():4s} loss {rows[0]['train/loss']:.3f} -> {rows[-1]['train/loss']:.3f} ({len(rows)} steps)"
            )
    rm = run / "rm_eval" / "eval.json"
    if rm.is_file():
        result = json.loads(rm.read_text())
        ap = result.get("average_precision", {})
        lines.append(
            f"RM   pairwise accuracy {result['accuracy']:.3f} on {result['pairs']} held-out devtest pairs, "
            f"mean detection AP {sum(ap.values()) / max(1, len(ap)):.3f} ({run / 'rm_eval' / 'eval.md'})"
        )
    rl = _rows(run / "rl" / "metrics.jsonl")
    if rl:
        first, last = rl[0], rl[-1]
        cfg = run / "rl" / "config.yaml"
        loss = yaml.safe_load(cfg.read_text())["rl"]["loss"]["name"] if cfg.is_file() else "RL"
        lines.append(f"RL   {len(rl)} steps of {loss}")
        for key, label in [("reward/total", "raw reward"), ("reward/mt", "R_mt (chrF++/100)"),
                           ("rollout/entropy", "entropy"), ("rollout/len_mean", "response length"),
                           ("rl/kl_k3", "KL k3 to reference")]:  # fmt: skip
            if key in first:
                lines.append(f"     {label:22s} {first[key]:8.4f} -> {last[key]:8.4f}")
        passes = [k for k in last if k.startswith("constraint/")]
        lines.append("     constraint pass rates (last step): "
                     + ", ".join(f"{k.split('/')[1]} {100 * last[k]:.0f}%" for k in sorted(passes)))  # fmt: skip
    before, after = _scores(run, "eval_sft"), _scores(run, "eval_rl")
    if before and after:
        lines.append("FLORES devtest subset, Avg over directions (before RL = SFT model, after = RL model):")
        for metric in ("bleu", "chrf", "chrf++"):
            b, a = before["groups"]["avg"].get(metric), after["groups"]["avg"].get(metric)
            if b is not None and a is not None:
                lines.append(f"     {metric:7s} {b:6.2f} -> {a:6.2f}")
        cons = after.get("constraints", {}).get("overall", {})
        for system, row in cons.items():
            lines.append(f"     constraints {system}: lang {row['lang']:.0f}% length {row['length']:.0f}% "
                         f"mixing {row['mixing']:.0f}% overall {row['overall']:.0f}%")  # fmt: skip
    plots = sorted(str(p) for p in run.rglob("*.png"))
    lines.append("plots:")
    lines += [f"     {p}" for p in plots] or ["     (none)"]
    lines.append("=" * 72)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
