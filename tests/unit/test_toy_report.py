"""The toy report's headline numbers come from the anchor's comparison set (the first 50 devtest
sentences of each direction) even when the evaluation covered more; the larger set is reported
beside them, never mixed in. The recipe's wall time comes only from a seed that timed every stage."""

from __future__ import annotations

import json

from recipes.toy.report import COMPARE_SENTENCES, SEED_STAGES, one_seed_wall, results_markdown, seed_result
from vepo_mcore.eval.heldout import write_records


def _records(n: int, passes) -> list[dict]:
    out = []
    for direction in ("en-th", "th-en"):
        for i in range(n):
            ok = passes(i)
            out.append({"direction": direction, "index": i, "source": "s", "reference": "r", "hypothesis": "h",
                        "response_tokens": 10, "stop": True, "lang": True, "length": ok,
                        "format": True, "mixing": True, "overall": ok, "chrf": 20.0 if ok else 10.0})  # fmt: skip
    return out


def test_headline_uses_the_comparison_set_and_the_rest_is_reported_apart(tmp_path):
    root = tmp_path / "seed3"
    root.mkdir()
    n = 3 * COMPARE_SENTENCES
    # SFT passes the first 50 sentences and fails the rest; RL passes everything.
    write_records(_records(n, lambda i: i < COMPARE_SENTENCES), root / "heldout_sft.jsonl")
    write_records(_records(n, lambda i: True), root / "heldout_rl.jsonl")
    (root / "timings.json").write_text(json.dumps({"sft": 1.0, "rl": 2.0}))

    result = seed_result(root)
    assert result["seed"] == 3
    assert result["sft"]["n"] == result["rl"]["n"] == 2 * COMPARE_SENTENCES
    assert result["sft"]["overall_pass"] == 100.0  # the failures past sentence 50 are not in the headline
    assert result["delta_ci95"]["overall_pass"] == [0.0, 0.0]
    assert result["all"]["sft"]["n"] == 2 * n
    assert abs(result["all"]["sft"]["overall_pass"] - 100.0 / 3) < 1e-9
    lo, hi = result["all"]["delta_ci95"]["overall_pass"]
    assert 0 < lo <= 200 / 3 <= hi


def test_no_extra_block_when_only_the_comparison_set_was_evaluated(tmp_path):
    root = tmp_path / "seed0"
    root.mkdir()
    write_records(_records(COMPARE_SENTENCES, lambda i: i % 2 == 0), root / "heldout_sft.jsonl")
    write_records(_records(COMPARE_SENTENCES, lambda i: True), root / "heldout_rl.jsonl")
    (root / "timings.json").write_text("{}")
    result = seed_result(root)
    assert "all" not in result and "rl_step" not in result
    assert result["sft"]["overall_pass"] == 50.0
    assert "| RL, seed 0 |" in _markdown(result)
    # run_toy --rl-validation: the report names the checkpoint validation chose
    (root / "rl_selected.json").write_text(json.dumps({"step": 80, "score": 110.0}))
    result = seed_result(root)
    assert result["rl_step"] == 80 and "| RL (step 80, chosen by validation), seed 0 |" in _markdown(result)


def _markdown(seed: dict) -> str:
    row = {"lang": 1.0, "length": 1.0, "format": None, "format_n": 0, "mixing": 1.0, "overall": 1.0}
    seed = {**seed, "constraint_table": {"sft": row, "rl": row}}
    summary = {"seeds": [seed["seed"]], "wall_s_one_seed": None, "per_seed": [seed],
               "sft": seed["sft"], "rl": seed["rl"], "stage_wall_s": {"sft": 1.0}}  # fmt: skip
    return results_markdown(summary)


def test_one_seed_wall_takes_the_fastest_complete_seed_and_skips_copied_stages():
    full = {stage: 100.0 for stage in SEED_STAGES}
    slow = {stage: 300.0 for stage in SEED_STAGES}
    copied = {"sft": 50.0, "rl": 60.0, "eval_sft": 1.0, "eval_rl": 1.0}  # base/resize/cpt copied in
    shared = {"tokenizer_expand": 40.0, "data_and_trim": 5.0}
    wall, index = one_seed_wall(shared, [slow, copied, full])
    assert index == 2 and wall == 45.0 + 100.0 * len(SEED_STAGES)
    assert one_seed_wall(shared, [copied]) == (None, None)


def _translations(n: int, good: bool) -> list[dict]:
    """Records whose hypothesis is its own reference (good) or one fixed sentence (not), scored as
    eval_heldout scores them."""
    from vepo_mcore.rewards.mt import chrf_score

    refs = [
        f"sentence number {i} says {w}"
        for i, w in enumerate(["rain", "sun", "wind", "snow", "fog", "hail"] * n)
    ]
    rows = [{"direction": "en-th", "index": i, "source": f"item {i}", "reference": refs[i],
             "hypothesis": refs[i] if good else "sentence number says", "response_tokens": 5, "stop": True,
             "lang": True, "length": True, "format": True, "mixing": True, "overall": True}
            for i in range(n)]  # fmt: skip
    for r in rows:
        r["chrf"] = 100.0 * chrf_score(r["hypothesis"], r["reference"])
    return rows


def test_sft_curve_reads_every_kept_checkpoint_in_step_order_and_ends_at_the_last(tmp_path):
    from recipes.toy.recipe import curve_record
    from recipes.toy.report import plot_sft_curve, sft_curve

    root = tmp_path / "seed1"
    for step in (1500, 300, 600):
        (root / "sft" / f"iter_{step:07d}").mkdir(parents=True)
    (root / "sft" / "latest_checkpointed_iteration.txt").write_text("1500")
    assert sft_curve(tmp_path / "nothing") == []
    for step, good in ((300, False), (600, True)):
        for indomain in (False, True):
            write_records(_translations(12, good), curve_record(root, step, indomain))
    write_records(_translations(12, True), root / "heldout_sft.jsonl")
    write_records(_translations(12, False), root / "heldout_sft_indomain.jsonl")

    points = sft_curve(root)
    assert [p["step"] for p in points] == [300, 600, 1500]
    assert abs(points[0]["chrf_source"]) < 1e-9  # one answer for every source: nothing from the source
    assert points[1]["chrf_source"] > 30 and points[1]["chrf_source_indomain"] > 30
    assert points[2]["chrf_source"] > 30 and abs(points[2]["chrf_source_indomain"]) < 1e-9
    # the source's number, kept by its reference, is kept by the good answers only
    assert points[2]["copy_rate"] == 100.0 and points[2]["copy_rate_indomain"] == 0.0
    assert points[2]["numbers_kept"] == 100.0
    assert points[2]["names_kept"] != points[2]["names_kept"]  # nan: the sources hold no name
    png = plot_sft_curve({"seed1": points}, tmp_path / "curve.png")
    assert png.stat().st_size > 10_000
