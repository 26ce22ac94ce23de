"""The constraint verification table (the paper's Lang / Length / Format / Mixing / Overall pass
rates), overall and per direction, computed by the same reward terms RL uses.

    table = constraint_table(samples)          # samples: Sample with source, response, src/tgt_lang
    print(constraint_table_markdown(table))

Rates are percentages. Format is rated only over samples whose source has structure (``format_n``
of them; None when there are none); in Overall a sample without source structure passes Format.
ms/id outputs that LID labels as the other language pass Lang (SPEC) and are counted in
``ms_id_swapped``.
"""

from __future__ import annotations

from collections import defaultdict

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS, load_flores
from vepo_mcore.rewards.lid import CONFUSABLE, predict
from vepo_mcore.rewards.registry import run_reward
from vepo_mcore.translation.sample import Sample

COLUMNS = ("lang", "length", "format", "mixing", "overall")
TERMS = {"lang": "lid", "length": "length", "format": "format", "mixing": "mixing"}
"""Table column -> reward term that verifies it."""
PAPER_VEPO_7B = {"lang": 97.8, "length": 99.2, "format": 92.15, "mixing": 92.3, "overall": 95.3}
"""The paper's constraint table row for VEPO-7B (SPEC section 5), for comparison."""


def check_samples(samples: list[Sample], cfg: RewardsConfig | None = None) -> list[dict[str, object]]:
    """Per-sample checks (bools): lang, length, format, mixing, overall, format_applicable, ms_id_swapped."""
    cfg = cfg or RewardsConfig()
    results = {column: run_reward(term, samples, cfg) for column, term in TERMS.items()}
    applicable = results["format"].applicable or [True] * len(samples)
    rows = []
    for i, sample in enumerate(samples):
        row: dict[str, object] = {column: bool(results[column].passed[i]) for column in TERMS}
        row["format_applicable"] = bool(applicable[i])
        row["overall"] = all(row[column] for column in TERMS)
        row["ms_id_swapped"] = _swapped(sample) if row["lang"] and sample.tgt_lang in CONFUSABLE else False
        rows.append(row)
    return rows


def _swapped(sample: Sample) -> bool:
    other = CONFUSABLE[sample.tgt_lang][1]
    ranked = predict(sample.response, k=1)
    return bool(ranked) and ranked[0][0] == other


def _rates(rows: list[dict[str, object]]) -> dict[str, object]:
    n = len(rows)
    out: dict[str, object] = {"n": n}
    for column in ("lang", "length", "mixing", "overall"):
        out[column] = 100.0 * sum(bool(r[column]) for r in rows) / n if n else None
    formatted = [r for r in rows if r["format_applicable"]]
    out["format"] = 100.0 * sum(bool(r["format"]) for r in formatted) / len(formatted) if formatted else None
    out["format_n"] = len(formatted)
    out["ms_id_swapped"] = sum(bool(r["ms_id_swapped"]) for r in rows)
    return out


def constraint_table(samples: list[Sample], cfg: RewardsConfig | None = None) -> dict[str, object]:
    """{"overall": rates, "directions": {"src-tgt": rates}} with rates as in the module docstring."""
    rows = check_samples(samples, cfg)
    by_direction: dict[str, list[dict[str, object]]] = defaultdict(list)
    for sample, row in zip(samples, rows):
        by_direction[sample.direction].append(row)
    return {
        "overall": _rates(rows),
        "directions": {direction: _rates(by_direction[direction]) for direction in sorted(by_direction)},
    }


def _cell(value: object) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def constraint_table_markdown(table: dict[str, object], title: str = "Constraint verification") -> str:
    """Markdown: the overall row, the paper's VEPO-7B row for reference, then one row per direction."""
    header = "| direction | N | Lang | Length | Format (N) | Mixing | Overall | ms/id swapped |"
    lines = [f"## {title}", "", header, "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def row(name: str, rates: dict) -> str:
        fmt = f"{_cell(rates['format'])} ({rates['format_n']})"
        cells = [
            _cell(rates["lang"]),
            _cell(rates["length"]),
            fmt,
            _cell(rates["mixing"]),
            _cell(rates["overall"]),
        ]
        return f"| {name} | {rates['n']} | " + " | ".join(cells) + f" | {rates['ms_id_swapped']} |"

    lines.append(row("**all**", table["overall"]))
    paper = PAPER_VEPO_7B
    lines.append(
        f"| paper VEPO-7B | | {paper['lang']} | {paper['length']} | {paper['format']} | "
        f"{paper['mixing']} | {paper['overall']} | |"
    )
    for direction, rates in table["directions"].items():
        lines.append(row(direction, rates))
    return "\n".join(lines) + "\n"


# ---- FLORES reference and corrupted-hypothesis sets, to show each check fires -----------------

MARKUP_TEMPLATES = (
    "<b>{}</b>",
    "**{}**",
    "{{0}}: {}",
    "<p>{}</p>",
    "[{}](https://example.org/doc)",
    "# {}",
    "- {}\n- `vepo --help`",
    "{} (%s)",
    "{} https://example.org/page?id=7",
    "<ul><li>{}</li></ul>",
)
"""Language-neutral markup wrapped around FLORES lines (template i % 10 on line i) to give the
Format check something to verify."""
NON_LATIN_TARGETS = ("zh", "th", "km", "lo", "my")


def _mix_in(hypothesis: str, foreign: str, tgt: str) -> str:
    """Code-mix ``hypothesis`` with lower-cased words of ``foreign`` (another language's line)."""
    words = [w.lower() for w in foreign.split() if len(w) > 2] or ["the"]
    if tgt in NON_LATIN_TARGETS:
        half = len(hypothesis) // 2
        return f"{hypothesis[:half]} {' '.join(words[: max(len(words) // 2, 1)])} {hypothesis[half:]}"
    tokens = hypothesis.split()
    for i in range(0, len(tokens), 3):  # every third word
        tokens[i] = words[i % len(words)]
    return " ".join(tokens)


CORRUPTIONS = ("wrong_lang", "double", "triple", "strip_markup", "mix_en")
"""wrong_lang: the English line (the source line for X->en); double / triple: the reference two /
three times (rho ~ 2 sits on the edge of the accepted [0.5, 2.0], so about half of the doubled
lines still pass: that is SPEC's interval, not a miss);
strip_markup: marked-up source, plain reference; mix_en: every third word English (Indonesian for
en targets; for non-Latin targets English words inserted mid-sentence)."""


def flores_samples(
    split: str = "devtest", max_lines: int | None = None, corrupt: str | None = None, markup: bool = False
) -> list[Sample]:
    """Samples for all 90 directions with the FLORES reference as the response, optionally marked up
    (``markup``) and/or corrupted (one of CORRUPTIONS)."""
    if corrupt is not None and corrupt not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corrupt!r}; known: {', '.join(CORRUPTIONS)}")
    text = {code: load_flores(code, split)[:max_lines] for code in LANGS}
    samples = []
    for src in LANGS:
        for tgt in LANGS:
            if src == tgt:
                continue
            for i, (source, reference) in enumerate(zip(text[src], text[tgt])):
                hypothesis = reference
                if corrupt == "wrong_lang":
                    hypothesis = text["en"][i] if tgt != "en" else source
                elif corrupt in ("double", "triple"):
                    hypothesis = " ".join([reference.strip()] * (2 if corrupt == "double" else 3))
                elif corrupt == "mix_en":
                    hypothesis = _mix_in(reference, text["id" if tgt == "en" else "en"][i], tgt)
                if markup or corrupt == "strip_markup":
                    template = MARKUP_TEMPLATES[i % len(MARKUP_TEMPLATES)]
                    source = template.format(source.strip())
                    if corrupt != "strip_markup":
                        hypothesis = template.format(hypothesis.strip())
                samples.append(
                    Sample(
                        source=source, response=hypothesis, reference=reference, src_lang=src, tgt_lang=tgt
                    )
                )
    return samples
