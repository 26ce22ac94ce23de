"""Held-out evaluation of a policy, sentence by sentence: does it stop, does it meet the constraints,
how good is it (chrF++), and is one policy better than another with a 95% interval.

    records = heldout_records(engine, tokenizer, "en-th,th-en", n=50, max_new_tokens=96)
    summary = summarize(records)          # stop_rate, lang_pass, length_pass, ... in percent, chrf
    deltas = paired_deltas(sft_records, rl_records)   # metric -> (lo, hi) of mean(rl - sft)

A record is one devtest sentence under greedy decoding: direction, index, source, reference,
hypothesis, response_tokens, stop (ended with a stop token before the cap), lang / length /
format / mixing / overall (the RLVR verifiers of vepo_mcore/rewards, as tools/verify_constraints.py
computes them) and chrf (sacreBLEU sentence chrF++, 0-100). Records are plain dicts, written as
jsonl, so two runs can be compared later without the models.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from vepo_mcore.eval.bootstrap import paired_mean_diff_ci
from vepo_mcore.eval.translate import write_hypotheses
from vepo_mcore.languages import load_flores
from vepo_mcore.translation.directions import parse_directions
from vepo_mcore.translation.prompts import clean_hypothesis, prompt_samples

METRICS = {
    "stop_rate": "stop",
    "lang_pass": "lang",
    "length_pass": "length",
    "mixing_pass": "mixing",
    "overall_pass": "overall",
    "chrf": "chrf",
}
"""Summary name -> record field. Pass rates are in percent, chrf on sacreBLEU's 0-100 scale."""


def heldout_records(
    engine,
    tokenizer,
    directions: str,
    n: int,
    max_new_tokens: int,
    split: str = "devtest",
    batch_size: int = 64,
) -> list[dict]:
    """Greedy translations of the first `n` `split` sentences of each direction, checked and scored."""
    from vepo_mcore.rewards.constraints import check_samples
    from vepo_mcore.rewards.mt import chrf_score
    from vepo_mcore.rollout.base import SamplingParams

    sampling = SamplingParams(
        temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=tokenizer.stop_ids
    )
    samples = []
    for direction in parse_directions(directions):
        sources, references = load_flores(direction.src, split)[:n], load_flores(direction.tgt, split)[:n]
        prompts = prompt_samples(direction, sources, tokenizer, references)
        for start in range(0, len(prompts), batch_size):
            samples += engine.generate(prompts[start : start + batch_size], sampling)
    for s in samples:
        s.response = clean_hypothesis(s.response)
    checks = check_samples(samples)
    return [
        {
            "direction": s.direction,
            "index": s.metadata["index"],
            "source": s.source,
            "reference": s.reference,
            "hypothesis": s.response,
            "response_tokens": len(s.response_ids),
            "stop": s.finish_reason == "stop",
            **{k: bool(check[k]) for k in ("lang", "length", "format", "mixing", "overall")},
            "chrf": 100.0 * chrf_score(s.response, s.reference),
        }
        for s, check in zip(samples, checks)
    ]


def summarize(records: Sequence[dict]) -> dict[str, float]:
    """Mean of each METRICS field (pass rates in percent) and the mean response length in tokens."""
    if not records:
        raise ValueError("no held-out records to summarize")
    n = len(records)
    out = {name: sum(float(r[field]) for r in records) / n for name, field in METRICS.items()}
    for name in METRICS:
        if name != "chrf":
            out[name] *= 100.0
    out["response_tokens"] = sum(r["response_tokens"] for r in records) / n
    out["n"] = n
    return out


def _aligned(base: Sequence[dict], system: Sequence[dict]) -> list[tuple[dict, dict]]:
    key = {(r["direction"], r["index"]): r for r in base}
    pairs = [(key.get((r["direction"], r["index"])), r) for r in system]
    missing = [(r["direction"], r["index"]) for b, r in pairs if b is None]
    if missing or len(base) != len(system):
        raise ValueError(f"the two record sets cover different sentences (e.g. {missing[:3]})")
    return pairs


def paired_deltas(base: Sequence[dict], system: Sequence[dict], seed: int = 12345) -> dict[str, list[float]]:
    """metric -> [lo, hi], the 95% paired-bootstrap interval of mean(system - base) per sentence
    (pass rates in percentage points, chrf in chrF++ points)."""
    pairs = _aligned(base, system)
    out = {}
    for name, field in METRICS.items():
        scale = 1.0 if name == "chrf" else 100.0
        a = [scale * float(b[field]) for b, _ in pairs]
        b = [scale * float(s[field]) for _, s in pairs]
        out[name] = list(paired_mean_diff_ci(a, b, seed=seed))
    return out


def write_records(records: Sequence[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def write_hypothesis_dir(records: Sequence[dict], hyp_dir: str | Path) -> Path:
    """DIR/{src}-{tgt}.txt, one hypothesis per line in sentence order (tools/evaluate.py --hyp-dir)."""
    out = Path(hyp_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_direction: dict[str, list[dict]] = {}
    for r in records:
        by_direction.setdefault(r["direction"], []).append(r)
    for direction, rows in by_direction.items():
        write_hypotheses(
            out / f"{direction}.txt", [r["hypothesis"] for r in sorted(rows, key=lambda r: r["index"])]
        )
    return out


def read_records(path: str | Path) -> list[dict]:
    records = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON record ({error})") from None
    return records
