"""Held-out evaluation of a policy, sentence by sentence: does it stop, does it meet the constraints,
how good is it (chrF++), and is one policy better than another with a 95% interval.

    records = heldout_records(engine, tokenizer, "en-th,th-en", n=50, max_new_tokens=96)
    summary = summarize(records)          # stop_rate, lang_pass, length_pass, ... in percent, chrf
                                          # chrf_source, same_opening
    by_direction(records)                 # {"en-th/overall_pass": ..., "en-th/chrf": ...}
    deltas = paired_deltas(sft_records, rl_records)   # metric -> (lo, hi) of mean(rl - sft)

A record is one devtest sentence under greedy decoding: direction, index, source, reference,
hypothesis, response_tokens, stop (ended with a stop token before the cap), lang / length /
format / mixing / overall (the RLVR verifiers of vepo_mcore/rewards, as tools/verify_constraints.py
computes them) and chrf (sacreBLEU sentence chrF++, 0-100). Records are plain dicts, written as
jsonl, so two runs can be compared later without the models.

Two measures say whether a policy translates or writes text that ignores its source, which a
chrF++ reward can push a small policy toward: ``chrf_source``, the chrF++ a hypothesis earns above
the same hypothesis scored against the reference of another sentence of its direction
(:func:`mismatched_chrf`), and ``same_opening``, the share of hypotheses that begin like their
direction's most common opening (:func:`same_opening_share`). ``copy_rate`` is the share of the
source's numbers and Latin-script names kept by the reference that the hypothesis keeps too
(:func:`carried_share`); ``numbers_kept`` and ``names_kept`` count the two kinds apart.

With ``bitext=DIR`` the test sentences are the in-domain held-out pairs DIR/<lang>/heldout.jsonl
written by tools/build_parallel_corpus.py (English on one side of every direction) instead of FLORES.
The model side (checkpoints, the rollout engine, megatron.core) is imported inside the functions that
translate: reading and summarising records (the recipes' reports) never loads it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from vepo_mcore.eval.bootstrap import paired_mean_diff_ci
from vepo_mcore.eval.systems import write_hypotheses
from vepo_mcore.languages import load_flores, sentence_range
from vepo_mcore.rewards.constraints import check_samples
from vepo_mcore.rewards.mt import chrf_score
from vepo_mcore.translation.carried import carried_items, is_number
from vepo_mcore.translation.directions import parse_directions
from vepo_mcore.translation.prompts import clean_hypothesis, prompt_samples

# Imported where used: vepo_mcore.rollout.base (pulls torch: reading and summarising records never loads it).

METRICS = {
    "stop_rate": "stop",
    "lang_pass": "lang",
    "length_pass": "length",
    "mixing_pass": "mixing",
    "overall_pass": "overall",
    "chrf": "chrf",
    "chrf_source": "chrf",
}
"""Summary name -> record field. Pass rates are in percent, chrf on sacreBLEU's 0-100 scale;
chrf_source is chrf minus :func:`mismatched_chrf` (chrF++ points that depend on the source)."""
LABELS = {"stop_rate": "stop", "lang_pass": "lang", "length_pass": "length", "mixing_pass": "mixing",
          "overall_pass": "overall", "chrf": "chrF++", "chrf_source": "chrF++ from src",
          "same_opening": "same opening", "copy_rate": "names/numbers kept"}  # fmt: skip
"""Column label of each summary value (METRICS, same_opening and copy_rate)."""
OPENING_CHARS = 20
"""Characters of a hypothesis that make its opening (same_opening_share)."""


def heldout_records(
    engine,
    tokenizer,
    directions: str,
    n: int,
    max_new_tokens: int,
    split: str = "devtest",
    batch_size: int = 64,
    sentences: str | None = None,
    shard: tuple[int, int] = (0, 1),
    bitext: str | Path | None = None,
) -> list[dict]:
    """Greedy translations of the first `n` `split` sentences of each direction (or of the START:STOP
    range `sentences`, n then unused), checked and scored. shard (k, m): the k-th of every m
    prompts, so m data-parallel ranks share the work. bitext: a folder of held-out pairs to use
    instead of FLORES (the module docstring)."""
    from vepo_mcore.rollout.base import SamplingParams

    sampling = SamplingParams(
        temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=tokenizer.stop_ids
    )
    rows = sentence_range(sentences) if sentences is not None else slice(n)
    samples = []
    for direction in parse_directions(directions):
        sources, references = test_sentences(direction.src, direction.tgt, split, bitext)
        indices = range(len(sources))[rows][shard[0] :: shard[1]]
        prompts = prompt_samples(direction, sources, tokenizer, references, indices=indices)
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


def test_sentences(src: str, tgt: str, split: str, bitext: str | Path | None) -> tuple[list[str], list[str]]:
    """(sources, references) of one direction: FLORES `split`, or the held-out pairs of a bitext folder."""
    if bitext is None:
        return load_flores(src, split), load_flores(tgt, split)
    if "en" not in (src, tgt) or src == tgt:
        raise ValueError(f"bitext test pairs are English <-> X; direction {src}-{tgt} has no English side")
    lang = tgt if src == "en" else src
    path = Path(bitext) / lang / "heldout.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no held-out pairs for {lang} (tools/build_parallel_corpus.py writes them)"
        )
    rows = read_records(path)
    english, other = [r["en"] for r in rows], [r["text"] for r in rows]
    return (english, other) if src == "en" else (other, english)


CARRIED_KINDS = ("all", "numbers", "names")
"""What carried_share counts: every carried item, only the numbers, or only the names."""


def carried_share(records: Sequence[dict], kind: str = "all") -> float:
    """Percent of the sources' numbers and names (`kind`: both, only numbers, only names) that their
    references keep as written (carried_items found in the reference: a capitalised word that only
    opens a sentence is no name) and that their hypotheses keep too; nan when no reference keeps any."""
    if kind not in CARRIED_KINDS:
        raise ValueError(f"carried_share: kind {kind!r} is not one of {CARRIED_KINDS}")
    found = total = 0
    for r in records:
        items = [item for item in carried_items(r["source"]) if item in r["reference"]]
        if kind != "all":
            items = [item for item in items if is_number(item) == (kind == "numbers")]
        total += len(items)
        found += sum(item in r["hypothesis"] for item in items)
    return 100.0 * found / total if total else float("nan")


def _by_direction(records: Sequence[dict]) -> dict[str, list[int]]:
    """direction -> positions of its records in `records`, in sentence-index order."""
    groups: dict[str, list[int]] = {}
    for position, record in enumerate(records):
        groups.setdefault(record["direction"], []).append(position)
    return {d: sorted(members, key=lambda i: records[i]["index"]) for d, members in groups.items()}


def mismatched_chrf(records: Sequence[dict]) -> list[float]:
    """[N] sentence chrF++ (0-100) of each hypothesis against the reference of the next sentence of
    its direction in `records` (by index, the last one against the first): what a policy scores
    with text that does not depend on the source. A direction with one sentence has no other
    reference; its record is scored against its own (chrf_source 0)."""
    out = [0.0] * len(records)
    for members in _by_direction(records).values():
        for k, position in enumerate(members):
            other = records[members[(k + 1) % len(members)]]
            out[position] = 100.0 * chrf_score(records[position]["hypothesis"], other["reference"])
    return out


def same_opening_share(records: Sequence[dict], chars: int = OPENING_CHARS) -> float:
    """Percent of hypotheses whose first `chars` characters are their direction's most common
    opening: near 100 when a policy answers every prompt of a direction alike."""
    if not records:
        raise ValueError("no held-out records")
    top = 0
    for members in _by_direction(records).values():
        openings = Counter(records[i]["hypothesis"][:chars] for i in members)
        top += openings.most_common(1)[0][1]
    return 100.0 * top / len(records)


def metric_values(records: Sequence[dict], name: str) -> list[float]:
    """[N] per-sentence values of METRICS[name]: pass rates as 0 / 100, chrF++ points."""
    field = METRICS[name]
    if name == "chrf_source":
        return [float(r[field]) - m for r, m in zip(records, mismatched_chrf(records))]
    scale = 1.0 if name == "chrf" else 100.0
    return [scale * float(r[field]) for r in records]


def summarize(records: Sequence[dict]) -> dict[str, float]:
    """Mean of each METRICS value (pass rates in percent), same_opening, copy_rate, numbers_kept and
    names_kept (percent) and the mean response length in tokens."""
    if not records:
        raise ValueError("no held-out records to summarize")
    n = len(records)
    out = {name: sum(metric_values(records, name)) / n for name in METRICS}
    out["same_opening"] = same_opening_share(records)
    out["copy_rate"] = carried_share(records)
    for kind in ("numbers", "names"):
        out[f"{kind}_kept"] = carried_share(records, kind)
    out["response_tokens"] = sum(r["response_tokens"] for r in records) / n
    out["n"] = n
    return out


def by_direction(
    records: Sequence[dict], names: Sequence[str] = ("overall_pass", "chrf")
) -> dict[str, float]:
    """'<direction>/<name>' -> the mean of each METRICS `name` over that direction's records, so that a
    direction that breaks shows where the overall mean would average it away."""
    directions = sorted({r["direction"] for r in records})
    out = {}
    for direction in directions:
        mine = [r for r in records if r["direction"] == direction]
        out.update({f"{direction}/{name}": sum(metric_values(mine, name)) / len(mine) for name in names})
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
    (pass rates in percentage points, chrf and chrf_source in chrF++ points)."""
    pairs = _aligned(base, system)
    before, after = [b for b, _ in pairs], [s for _, s in pairs]
    return {
        name: list(paired_mean_diff_ci(metric_values(before, name), metric_values(after, name), seed=seed))
        for name in METRICS
    }


def write_records(records: Sequence[dict], path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


def write_hypothesis_dir(records: Sequence[dict], hyp_dir: str | Path) -> Path:
    """DIR/{src}-{tgt}.txt, one hypothesis per line in sentence order (tools/evaluate.py --eval.system.hyp_dir)."""
    out = Path(hyp_dir)
    out.mkdir(parents=True, exist_ok=True)
    for direction, members in _by_direction(records).items():
        write_hypotheses(out / f"{direction}.txt", [records[i]["hypothesis"] for i in members])
    return out


def read_records(path: str | Path) -> list[dict]:
    records = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not a JSON record ({error})") from None
    return records
