"""What RL's reward pays for inside a group: each term's within-group correlation with how much an
answer depends on its source (and with its length).

    rows = sample_rows("runs/toy/seed0/sft", per_direction=40, group_size=8)
    table = alignment(rows)        # {measure: {term: {"r", "low", "high", "groups"}}}

    python -m recipes.toy.reward_alignment runs/toy/seed0/sft --out /tmp/alignment.json

The policy samples G answers to each of N RL prompts per direction (FLORES dev 800-946, the toy's
directions) at the recipe's tau (configs/rl.yaml). Each answer gets the recipe's reward terms as they
enter its total (weighted, clipped) and three measures: `src_chrf`, its sentence chrF++ against its
own reference minus against the reference of the next sampled prompt of its direction (the per-answer
form of the report's chrf_source); `carried`, the share of the source's names and numbers that its
reference keeps and it keeps too (None where the reference keeps none); `chars`, its length. A
group's advantages are its totals minus their mean (every RL loss here), so a term whose rewards rise
with a measure inside groups pushes the policy toward it. Printed per measure and term: the mean
Pearson r over the groups where both vary, with a bootstrap 95% interval over those groups.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from copy import deepcopy
from pathlib import Path

import numpy as np

from recipes.toy.recipe import CONFIGS
from vepo_mcore.eval.bootstrap import mean_value_ci
from vepo_mcore.rewards.mt import chrf_score
from vepo_mcore.rewards.rlvr import active_terms, clip, rlvr_reward
from vepo_mcore.translation.carried import carried_items
from vepo_mcore.translation.sample import Sample

MEASURES = ("src_chrf", "carried", "chars")
PROMPT_SENTENCES = range(800, 947)
"""The toy's RL prompt sentences (FLORES dev; 947-996 validate, devtest is never read here)."""


def answer_rows(samples: list[Sample], rewards_cfg) -> list[dict]:
    """Finished samples (source, reference, response; group_id per prompt) -> one row per answer:
    group, direction, the weighted clipped reward terms ("term/<name>", "total") and MEASURES."""
    cfg = deepcopy(rewards_cfg)
    cfg.normalize = False  # the terms as they enter the total; the advantage subtracts the mean anyway
    rlvr_reward(samples, cfg)
    weights = dict(active_terms(cfg))
    references: dict[str, list[str]] = {}
    for s in samples:
        refs = references.setdefault(s.direction, [])
        if s.reference not in refs:
            refs.append(s.reference)
    rows = []
    for s in samples:
        refs = references[s.direction]
        if len(refs) < 2:
            raise ValueError(f"direction {s.direction} has one prompt: src_chrf needs another reference")
        other = refs[(refs.index(s.reference) + 1) % len(refs)]
        kept = [item for item in carried_items(s.source) if item in s.reference]
        terms = {f"term/{name}": w * clip(s.reward_terms[name], cfg.clip) for name, w in weights.items()}
        rows.append({
            "group": s.group_id, "direction": s.direction, **terms, "total": sum(terms.values()),
            "src_chrf": 100.0 * (chrf_score(s.response, s.reference) - chrf_score(s.response, other)),
            "carried": sum(item in s.response for item in kept) / len(kept) if kept else None,
            "chars": len(s.response),
        })  # fmt: skip
    return rows


def within_group_r(rows: list[dict], measure: str, key: str) -> dict:
    """Mean over groups of Pearson r(rows[key], rows[measure]) inside each group where both vary (rows
    whose measure is None left out), with a bootstrap 95% interval over those groups."""
    groups: dict[int, list[dict]] = {}
    for row in rows:
        if row[measure] is not None:
            groups.setdefault(row["group"], []).append(row)
    rs = []
    for members in groups.values():
        x = np.array([m[key] for m in members], dtype=float)
        y = np.array([m[measure] for m in members], dtype=float)
        if len(members) > 1 and x.std() > 0 and y.std() > 0:
            rs.append(float(np.corrcoef(x, y)[0, 1]))
    if not rs:
        return {"r": None, "low": None, "high": None, "groups": 0}
    low, high = mean_value_ci(rs)
    return {"r": float(np.mean(rs)), "low": low, "high": high, "groups": len(rs)}


def alignment(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """{measure: {term or "total": within_group_r}} over every term of the rows."""
    keys = [k for k in rows[0] if k.startswith("term/")] + ["total"]
    return {measure: {key: within_group_r(rows, measure, key) for key in keys} for measure in MEASURES}


def sample_rows(
    checkpoint: str | Path, per_direction: int = 40, group_size: int = 8, seed: int = 0
) -> list[dict]:
    """The checkpoint's policy answers `per_direction` RL prompts of each toy direction `group_size`
    times at the recipe's sampling settings; -> answer_rows with the recipe's rewards."""
    from vepo_mcore.config.base import load_config
    from vepo_mcore.config.job import JobConfig
    from vepo_mcore.eval.translate_checkpoint import load_policy_engine
    from vepo_mcore.rl.prompts import TranslationPrompts

    recipe = load_config(JobConfig, CONFIGS / "rl.yaml").rl
    _, tokenizer, engine = load_policy_engine(checkpoint)
    prompts = TranslationPrompts(tokenizer, directions=recipe.directions, split="dev")
    pick = random.Random(seed)
    chosen = [(d, i) for d in prompts.directions for i in pick.sample(PROMPT_SENTENCES, per_direction)]
    batch = [prompts.sample(d, i, group) for group, (d, i) in enumerate(chosen) for _ in range(group_size)]
    samples = engine.generate(batch, recipe.rollout.sampling.with_stops(tokenizer.stop_ids, seed=seed))
    return answer_rows(samples, recipe.rewards)


def markdown(table: dict[str, dict[str, dict]]) -> str:
    lines = ["| measure | " + " | ".join(next(iter(table.values()))) + " |"]
    lines.append("|---" * (1 + len(next(iter(table.values())))) + "|")
    for measure, cells in table.items():
        row = [f"{c['r']:+.2f} [{c['low']:+.2f}, {c['high']:+.2f}] ({c['groups']})" if c["r"] is not None else "-"
               for c in cells.values()]  # fmt: skip
        lines.append(f"| {measure} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a toy checkpoint (SFT or RL)")
    p.add_argument("--out", required=True, help="JSON: the table and every answer's row")
    p.add_argument("--per-direction", type=int, default=40, help="RL prompts per direction")
    p.add_argument("--group-size", type=int, default=8, help="answers per prompt")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = sample_rows(args.checkpoint, args.per_direction, args.group_size, args.seed)
    table = alignment(rows)
    Path(args.out).write_text(
        json.dumps({"checkpoint": args.checkpoint, "table": table, "rows": rows}) + "\n"
    )
    print(markdown(table))
    return 0


if __name__ == "__main__":
    from vepo_mcore.config.cli import run_cli

    sys.exit(run_cli(main))
