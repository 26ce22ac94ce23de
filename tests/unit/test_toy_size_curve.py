"""The model-size curve (recipes/toy/size_curve.py): each size's parameters from its SFT checkpoint's
config, its summaries on both test sets (the first 50 sentences per direction), and intervals of the
change against the recipe's own run (size, learning rate and SFT steps)."""

from __future__ import annotations

import pytest

from recipes.toy.recipe import CONFIGS
from recipes.toy.size_curve import RECIPE_SIZE, plot_size_curve, size_curve, size_table
from vepo_mcore.config.base import load_config, save_config
from vepo_mcore.config.job import JobConfig
from vepo_mcore.eval.heldout import write_records

RECIPE = load_config(JobConfig, CONFIGS / "sft.yaml").training
RECIPE_LR, RECIPE_ITERS = RECIPE.optimizer.lr, RECIPE.train_iters


def _records(n: int, chrf: float) -> list[dict]:
    # chrf_source is the chrF++ against the own reference above the chrF++ against the next one's
    refs = [f"reference number {i} " + "abcdefghij"[i % 10] * 6 for i in range(n)]
    return [{"direction": "en-th", "index": i, "source": f"s{i}", "reference": refs[i],
             "hypothesis": refs[i] if chrf > 50 else "something else entirely", "response_tokens": 5,
             "stop": True, "lang": True, "length": True, "format": True, "mixing": True, "overall": True,
             "chrf": chrf} for i in range(n)]  # fmt: skip


def _size(
    out,
    layers: int,
    hidden: int,
    chrf: float,
    lr: float = RECIPE_LR,
    indomain: bool = True,
    iters: int = RECIPE_ITERS,
    sentences: int = 20,
) -> None:
    sft = out / f"L{layers}_h{hidden}" / "seed0" / "sft"
    sft.mkdir(parents=True)
    cfg = JobConfig()
    cfg.model.num_layers, cfg.model.hidden_size, cfg.model.ffn_hidden_size = layers, hidden, 3 * hidden
    cfg.model.num_attention_heads, cfg.model.num_query_groups, cfg.model.vocab_size = 4, 2, 1000
    cfg.model.tie_word_embeddings, cfg.training.optimizer.lr, cfg.training.train_iters = True, lr, iters
    save_config(cfg, sft / "config.yaml")
    for name in ("heldout_sft.jsonl", "heldout_sft_indomain.jsonl")[: 2 if indomain else 1]:
        write_records(_records(sentences, chrf), sft.parent / name)


def test_runs_are_ordered_by_rate_and_size_and_compared_with_the_recipe(tmp_path):
    _size(tmp_path / "a", 8, 512, 90.0)
    _size(tmp_path / "a", 4, 256, 10.0)
    (tmp_path / "a" / "L6_h384" / "seed0").mkdir(parents=True)  # unfinished: no evaluation yet
    _size(tmp_path / "b", 4, 256, 90.0, lr=RECIPE_LR / 4, indomain=False)  # scored on devtest only
    records = size_curve([tmp_path / "a", tmp_path / "b"])
    assert [r["run"] for r in records] == ["a/" + RECIPE_SIZE, "a/L8_h512", "b/" + RECIPE_SIZE]
    recipe, big, slow = records
    # 4 x 256: 1,024-row tied embedding + 4 layers of (q 256x256, k/v 256x128 each, o, qkv bias, SwiGLU, norms)
    per_layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + (256 + 2 * 128) + 3 * 256 * 768 + 2 * 256
    assert recipe["parameters"] == slow["parameters"] == 1024 * 256 + 4 * per_layer + 256
    assert big["parameters"] > recipe["parameters"] and slow["lr"] == RECIPE_LR / 4
    assert "delta_ci95" not in recipe["devtest"] and "indomain" not in slow
    low, high = big["indomain"]["delta_ci95"]["chrf_source"]
    assert 0 < low <= high  # the big model copies its references, the recipe's does not
    assert slow["devtest"]["delta_ci95"]["chrf_source"][0] > 0
    table = size_table(records)
    assert (
        f"| 4 x 256 | {RECIPE_LR:g} | {RECIPE_ITERS:,} |" in table[2]
        and "the recipe / the recipe" in table[2]
    )
    assert "| - | - |" in table[4]  # no in-domain scores
    assert plot_size_curve(records, tmp_path / "curve.png").stat().st_size > 0


def test_the_recipe_itself_is_required(tmp_path):
    _size(tmp_path, 8, 512, 90.0)
    _size(tmp_path, 4, 256, 90.0, lr=RECIPE_LR * 4)
    with pytest.raises(FileNotFoundError, match="no L4_h256 run at the recipe's SFT learning rate"):
        size_curve([tmp_path])


def test_the_recipe_is_its_steps_too_and_runs_compare_on_the_same_sentences(tmp_path):
    _size(tmp_path / "short", 4, 256, 90.0, iters=RECIPE_ITERS // 2, sentences=50)
    with pytest.raises(FileNotFoundError, match=f"and steps \\({RECIPE_ITERS}\\)"):
        size_curve([tmp_path / "short"])
    _size(tmp_path / "recipe", 4, 256, 10.0, sentences=100)  # scored on more sentences than the rest
    recipe, short = size_curve([tmp_path / "recipe", tmp_path / "short"])
    assert recipe["recipe"] and recipe["devtest"]["n"] == short["devtest"]["n"] == 50
    assert short["sft_iters"] == RECIPE_ITERS // 2 and short["devtest"]["delta_ci95"]["chrf_source"][0] > 0
    assert f"| {RECIPE_ITERS // 2:,} |" in size_table([recipe, short])[3]


def test_a_test_set_the_recipe_was_not_scored_on_has_no_interval(tmp_path):
    _size(tmp_path, 4, 256, 10.0, indomain=False)
    _size(tmp_path, 8, 512, 90.0)
    recipe, big = size_curve([tmp_path])
    assert "indomain" not in recipe and "delta_ci95" not in big["indomain"]
    assert big["devtest"]["delta_ci95"]["chrf_source"][0] > 0
    table = size_table([recipe, big])
    assert table[2].endswith("| the recipe / - |")
    assert table[3].endswith(" / - |") and "the recipe" not in table[3]
