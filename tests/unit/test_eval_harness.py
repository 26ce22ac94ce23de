"""General-benchmark adapter: the multiple-choice scorer on the tiny local set, lm-eval plumbing."""

from __future__ import annotations

import importlib.util
import json
import math
from collections import Counter

import pytest

from tests.support.lm_eval_harness import (
    TINY_MC,
    extract_scores,
    load_mc_jsonl,
    make_lm_eval_model,
    run_lm_eval,
    score_multiple_choice,
)
from vepo_mcore.languages import load_flores


def char_bigram_loglikelihood():
    """A real (tiny) language model: add-one char bigrams estimated on FLORES English dev."""
    text = "\n".join(load_flores("en", "dev"))
    pairs, singles = Counter(zip(text, text[1:])), Counter(text)
    vocab = len(singles) + 1

    def ll(requests):
        out = []
        for context, continuation in requests:
            prev, total = (context[-1:] or "\n"), 0.0
            for ch in continuation:
                total += math.log((pairs[(prev, ch)] + 1) / (singles[prev] + vocab))
                prev = ch
            out.append((total, False))
        return out

    return ll


def test_tiny_set_loads():
    items = load_mc_jsonl()
    assert len(items) == 8 and all(0 <= it.label < len(it.choices) for it in items)


def test_scorer_equals_naive_argmax_with_a_char_bigram_model():
    items, ll = load_mc_jsonl(), char_bigram_loglikelihood()
    acc = acc_norm = 0
    for it in items:  # naive reference: one request per choice
        scores = [ll([(it.context, " " + c)])[0][0] for c in it.choices]
        acc += scores.index(max(scores)) == it.label
        norm = [s / len((" " + c).encode()) for s, c in zip(scores, it.choices)]
        acc_norm += norm.index(max(norm)) == it.label
    result = score_multiple_choice(items, ll)
    assert result == {"acc": acc / len(items), "acc_norm": acc_norm / len(items), "n": 8.0}
    assert result["acc"] != result["acc_norm"]  # length normalisation changes this model's picks


def test_oracle_and_batched_requests():
    items = load_mc_jsonl()
    answers = {(it.context, " " + it.choices[it.label]) for it in items}
    seen = []

    def oracle(requests):
        seen.append(len(requests))
        return [(0.0 if r in answers else -5.0, True) for r in requests]

    assert score_multiple_choice(items, oracle)["acc"] == 1.0
    assert seen == [sum(len(it.choices) for it in items)]  # one batched call


def test_bad_items_and_results(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": "q", "choices": ["a"], "label": 3}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: label 3"):
        load_mc_jsonl(bad)
    bad.write_text(json.dumps({"context": "q"}) + "\n")
    with pytest.raises(ValueError, match="missing keys \\['choices', 'label'\\]"):
        load_mc_jsonl(bad)
    with pytest.raises(ValueError, match="returned 1 results"):
        score_multiple_choice(load_mc_jsonl(TINY_MC), lambda reqs: [(0.0, False)])


def test_extract_scores_from_lm_eval_results():
    results = {"mmlu": {"acc,none": 0.485, "acc_stderr,none": 0.01}, "hellaswag": {"acc,none": 0.6, "acc_norm,none": 0.852},
               "bbh": {"exact_match,get-answer": 0.609}, "cmmlu": {"acc,none": 0.632}}  # fmt: skip
    scores = extract_scores(results, ["bbh", "cmmlu", "hellaswag", "mmlu"])
    assert scores == pytest.approx({"bbh": 60.9, "cmmlu": 63.2, "hellaswag": 85.2, "mmlu": 48.5})
    with pytest.raises(ValueError, match="no task 'mmlu'"):
        extract_scores({}, ["mmlu"])
    with pytest.raises(ValueError, match="unknown benchmarks \\['arc'\\]"):
        run_lm_eval(lambda r: [], benchmarks=["arc"])


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is not None, reason="lm-eval is installed here")
def test_lm_eval_missing_gives_install_hint():
    with pytest.raises(ImportError, match="pip install lm-eval"):
        make_lm_eval_model(lambda r: [])
    with pytest.raises(ImportError, match="pip install lm-eval"):
        run_lm_eval(lambda r: [], benchmarks=["mmlu"])
