"""The quickstart's summary: each stage's loss, the reward model's accuracy, the RL run, and on
held-out FLORES devtest prompts each stage's change with its 95% paired-bootstrap interval
(before SFT -> SFT, SFT -> RL), the FLORES scores and the plots. tools/quickstart_summary.py prints it."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from vepo_mcore.eval.heldout import (
    LABELS,
    METRICS,
    paired_deltas,
    read_records,
    same_opening_share,
    summarize,
)
from vepo_mcore.training.logging import read_metrics


def _change(before: list[dict], after: list[dict], names: list[str], label: str) -> list[str]:
    """One line per metric: before -> after, [lo, hi] of the paired difference, and what it means."""
    a, b, ci = summarize(before), summarize(after), paired_deltas(before, after)
    lines = [
        f"{label} (held-out devtest, {len(after)} prompts; 95% paired-bootstrap interval of the change):"
    ]
    for name in names:
        lo, hi = ci[name]
        verdict = (
            "includes 0: no change shown at this size" if lo <= 0 <= hi else ("up" if lo > 0 else "down")
        )
        unit = "" if name.startswith("chrf") else "%"
        lines.append(f"     {LABELS[name]:15s} {a[name]:6.1f}{unit} -> {b[name]:6.1f}{unit}   "
                     f"[{lo:+6.1f}, {hi:+6.1f}]  {verdict}")  # fmt: skip
    return lines


def quickstart_summary(run: Path) -> str:
    """The summary of the quickstart's output directory `run` (what `make quickstart` prints)."""
    seed = run / "toy" / "seed0"
    lines = ["", "=" * 76, f"vepo_mcore quickstart summary ({run})", "=" * 76]
    manifest = run / "toy" / "shared" / "tokenizer" / "toy" / "trim_manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        lines.append(f"TOK  expanded Qwen2.5 trimmed to the toy's data: {m['vocab_size']:,} ids "
                     f"({m['prefix_size']:,} of the base vocabulary + {m['vocab_size'] - m['prefix_size']:,} new)")  # fmt: skip
    for stage, folder in (("base", run / "toy" / "shared"), ("cpt", seed), ("sft", seed)):
        rows = [r for r in read_metrics(folder / stage / "metrics.jsonl") if "train/loss" in r]
        if rows:
            lines.append(f"{stage.upper():4s} loss {rows[0]['train/loss']:.3f} -> {rows[-1]['train/loss']:.3f} "
                         f"(logged at steps {rows[0]['step']}..{rows[-1]['step']})")  # fmt: skip
    rm = run / "rm_eval" / "eval.json"
    if rm.is_file():
        result = json.loads(rm.read_text())
        ap = result.get("average_precision", {})
        lines.append(
            f"RM   pairwise accuracy {result['accuracy']:.3f} on {result['pairs']} held-out devtest pairs, "
            f"mean detection AP {sum(ap.values()) / max(1, len(ap)):.3f} ({run / 'rm_eval' / 'eval.md'})"
        )
    rl = read_metrics(seed / "rl" / "metrics.jsonl")
    if rl:
        first, last = rl[0], rl[-1]
        cfg = seed / "rl" / "config.yaml"
        loss = yaml.safe_load(cfg.read_text())["rl"]["loss"]["name"] if cfg.is_file() else "RL"
        lines.append(f"RL   {len(rl)} steps of {loss} (first -> last step, sampled rollouts)")
        for key, label in [("reward/mt", "R_mt (chrF++/100)"), ("rollout/entropy", "entropy"),
                           ("rollout/len_mean", "response length"), ("constraint/overall", "constraint pass")]:  # fmt: skip
            if key in first:
                lines.append(f"     {label:22s} {first[key]:8.4f} -> {last[key]:8.4f}")
    held = {name: seed / f"heldout_{name}.jsonl" for name in ("cpt", "sft", "rl")}
    if all(path.is_file() for path in held.values()):
        records = {name: read_records(path) for name, path in held.items()}
        lines += _change(records["cpt"], records["sft"], ["stop_rate", "lang_pass"], "before SFT -> SFT")
        lines += _change(records["sft"], records["rl"], list(METRICS), "SFT -> RL")
        same = {name: same_opening_share(records[name]) for name in ("sft", "rl")}
        lines.append(f"     {LABELS['same_opening']:15s} {same['sft']:6.1f}% -> {same['rl']:6.1f}%   "
                     "(answers that open like their direction's most common opening)")  # fmt: skip
        lines.append("     (a short run: where an interval includes 0, the toy recipe shows the full result:")
        lines.append("      python tools/run_toy.py --seeds 0 1 2, reports/toy/README.md)")
    scores = run / "eval_rl" / "scores.json"
    if scores.is_file():
        avg = json.loads(scores.read_text())["groups"]["avg"]
        lines.append("FLORES devtest subset, RL policy, Avg over directions: "
                     + ", ".join(f"{m} {avg[m]:.2f}" for m in ("bleu", "chrf", "chrf++") if m in avg)
                     + f" (paired bootstrap vs SFT: {run / 'eval_rl' / 'bootstrap.md'})")  # fmt: skip
    plots = sorted(str(p) for p in run.rglob("*.png"))
    lines.append("plots:")
    lines += [f"     {p}" for p in plots] or ["     (none)"]
    lines.append("=" * 76)
    return "\n".join(lines)
