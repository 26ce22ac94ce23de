"""General benchmarks (BBH, CMMLU, HellaSwag, MMLU) through lm-evaluation-harness, an optional extra.
Kept with the tests: the training package does not call it; tests/unit/test_eval_harness.py checks
the multiple-choice protocol and the lm-eval wrapper.

Two pieces:
  * `score_multiple_choice(items, loglikelihood)`: the multiple-choice protocol lm-eval uses for
    MMLU/CMMLU/HellaSwag (pick the choice with the highest log-likelihood; acc_norm divides by
    the choice's length in bytes), over local JSONL items. It needs only a log-likelihood
    callable, so it runs here on the tiny set beside this file (tiny_mc.jsonl) and on any model.
  * `run_lm_eval(loglikelihood, generate, tasks)`: wraps the same callables as an
    `lm_eval.api.model.LM` and calls `lm_eval.simple_evaluate`. lm-eval is imported lazily and
    reads its datasets from the Hugging Face cache (set HF_DATASETS_OFFLINE=1 with a pre-filled
    cache on machines without internet).

A log-likelihood callable maps [(context, continuation), ...] -> [(logprob, is_greedy), ...],
the contract of lm-eval's `LM.loglikelihood`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

LoglikelihoodFn = Callable[[list[tuple[str, str]]], list[tuple[float, bool]]]
GenerateFn = Callable[[list[tuple[str, dict]]], list[str]]

TINY_MC = Path(__file__).resolve().parent / "tiny_mc.jsonl"
"""A few hand-written multiple-choice questions for tests and smoke runs."""

BENCHMARKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bbh": ("bbh", ("exact_match,get-answer", "exact_match,flexible-extract", "exact_match,none")),
    "cmmlu": ("cmmlu", ("acc,none",)),
    "hellaswag": ("hellaswag", ("acc_norm,none", "acc,none")),
    "mmlu": ("mmlu", ("acc,none",)),
}
"""Paper benchmark -> (lm-eval task name, metric keys to report, first present wins)."""

LM_EVAL_INSTALL_HINT = "general benchmarks need lm-evaluation-harness: pip install lm-eval"


@dataclass(frozen=True)
class MCItem:
    """One multiple-choice question: the model scores context + each choice."""

    context: str
    choices: tuple[str, ...]
    label: int
    """Index of the correct choice."""


def load_mc_jsonl(path: str | Path = TINY_MC) -> list[MCItem]:
    """JSONL lines {"context": str, "choices": [str, ...], "label": int} -> items."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"multiple-choice file {path} does not exist")
    items = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        missing = {"context", "choices", "label"} - set(record)
        if missing:
            raise ValueError(
                f"{path}:{lineno}: missing keys {sorted(missing)} (need context, choices, label)"
            )
        choices = tuple(record["choices"])
        label = record["label"]
        if not isinstance(label, int) or not 0 <= label < len(choices):
            raise ValueError(f"{path}:{lineno}: label {label!r} is not an index into {len(choices)} choices")
        items.append(MCItem(record["context"], choices, label))
    return items


def score_multiple_choice(items: Sequence[MCItem], loglikelihood: LoglikelihoodFn) -> dict[str, float]:
    """lm-eval's multiple-choice metrics over `items`: {'acc', 'acc_norm', 'n'}.

    Each choice is scored as the continuation " " + choice of the context (lm-eval's default
    target delimiter); acc_norm divides the log-likelihood by len(choice.encode()) bytes.
    All requests go to `loglikelihood` in one call so a model can batch them.
    """
    if not items:
        raise ValueError("no multiple-choice items to score")
    requests = [(item.context, " " + choice) for item in items for choice in item.choices]
    results = loglikelihood(requests)
    if len(results) != len(requests):
        raise ValueError(f"loglikelihood returned {len(results)} results for {len(requests)} requests")
    correct = correct_norm = 0
    start = 0
    for item in items:
        lls = [float(r[0]) for r in results[start : start + len(item.choices)]]
        start += len(item.choices)
        norm = [ll / len((" " + c).encode("utf-8")) for ll, c in zip(lls, item.choices)]
        correct += int(max(range(len(lls)), key=lls.__getitem__) == item.label)
        correct_norm += int(max(range(len(norm)), key=norm.__getitem__) == item.label)
    return {"acc": correct / len(items), "acc_norm": correct_norm / len(items), "n": float(len(items))}


def make_lm_eval_model(loglikelihood: LoglikelihoodFn, generate: GenerateFn | None = None):
    """An `lm_eval.api.model.LM` whose requests are answered by the given callables (lm-eval imported here)."""
    try:
        from lm_eval.api.model import LM
    except ImportError as exc:
        raise ImportError(f"{LM_EVAL_INSTALL_HINT} ({exc})") from exc

    class CallableLM(LM):
        """lm-eval model adapter over plain callables (loglikelihood / generate_until)."""

        def loglikelihood(self, requests):
            return [
                (float(ll), bool(greedy))
                for ll, greedy in loglikelihood([tuple(r.args[:2]) for r in requests])
            ]

        def loglikelihood_rolling(self, requests):
            # rolling log-likelihood of the whole text = continuation of an empty context
            return [float(ll) for ll, _ in loglikelihood([("", r.args[0]) for r in requests])]

        def generate_until(self, requests):
            if generate is None:
                raise ValueError("this benchmark generates text (e.g. BBH): pass a generate callable")
            return list(generate([(r.args[0], dict(r.args[1])) for r in requests]))

    return CallableLM()


def run_lm_eval(
    loglikelihood: LoglikelihoodFn,
    generate: GenerateFn | None = None,
    benchmarks: Sequence[str] = ("bbh", "cmmlu", "hellaswag", "mmlu"),
    *,
    num_fewshot: int | None = None,
    limit: int | float | None = None,
) -> dict[str, float]:
    """Run the paper's general benchmarks with lm-eval; returns benchmark -> score in percent."""
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmarks {unknown}; known: {', '.join(BENCHMARKS)}")
    try:
        import lm_eval
    except ImportError as exc:
        raise ImportError(f"{LM_EVAL_INSTALL_HINT} ({exc})") from exc
    model = make_lm_eval_model(loglikelihood, generate)
    tasks = [BENCHMARKS[b][0] for b in benchmarks]
    output = lm_eval.simple_evaluate(model=model, tasks=tasks, num_fewshot=num_fewshot, limit=limit)
    return extract_scores(output["results"], benchmarks)


def extract_scores(results: dict[str, dict[str, float]], benchmarks: Sequence[str]) -> dict[str, float]:
    """Pick each benchmark's metric from lm-eval's results dict ({task: {"acc,none": 0.61, ...}}), in %."""
    scores = {}
    for b in benchmarks:
        task, keys = BENCHMARKS[b]
        entry = results.get(task)
        if entry is None:
            raise ValueError(f"lm-eval results have no task {task!r}; got {sorted(results)}")
        key = next((k for k in keys if k in entry), None)
        if key is None:
            raise ValueError(f"lm-eval task {task!r} has none of the metrics {keys}; got {sorted(entry)}")
        scores[b] = 100.0 * float(entry[key])
    return scores
