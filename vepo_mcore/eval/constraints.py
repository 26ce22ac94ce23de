"""The constraint table (Lang / Length / Format / Mixing / Overall pass rates) of an evaluated system.

The checks are the RL reward verifiers (vepo_mcore.rewards.constraints); this module runs
them one direction at a time (so the metric processes can do it in parallel) and merges the
per-direction rates into the overall row, weighting each rate by the samples it is over
(Format only by samples whose source has structure). The references' own pass rates are shown
beside the system's: a correct human translation can fail LID (SPEC section 5), so the Lang
column is read against the reference row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vepo_mcore.eval.baselines import PAPER_CONSTRAINTS
from vepo_mcore.translation.directions import Direction
from vepo_mcore.translation.sample import Sample

# Imported where used: vepo_mcore.rewards.constraints (optional here: eval.runner probes it and evaluates
# without the constraint table when it does not import).

RATE_COLUMNS = ("lang", "length", "mixing", "overall")


def direction_rates(
    direction: Direction, sources: Sequence[str], hypotheses: Sequence[str]
) -> dict[str, object]:
    """Pass rates (%) of one direction: {n, lang, length, format, format_n, mixing, overall, ms_id_swapped}."""
    from vepo_mcore.rewards.constraints import constraint_table

    samples = [
        Sample(source=s, response=h, src_lang=direction.src, tgt_lang=direction.tgt, group_id=i)
        for i, (s, h) in enumerate(zip(sources, hypotheses))
    ]
    return dict(constraint_table(samples)["directions"][str(direction)])


def merge_rates(per_direction: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """Overall rates from per-direction rates, as if computed over all samples at once."""
    n = sum(int(r["n"]) for r in per_direction)
    out: dict[str, object] = {"n": n}
    for column in RATE_COLUMNS:
        out[column] = sum(float(r[column]) * int(r["n"]) for r in per_direction) / n if n else None
    format_n = sum(int(r["format_n"]) for r in per_direction)
    out["format"] = (
        sum(float(r["format"]) * int(r["format_n"]) for r in per_direction if r["format_n"]) / format_n
        if format_n
        else None
    )
    out["format_n"] = format_n
    out["ms_id_swapped"] = sum(int(r["ms_id_swapped"]) for r in per_direction)
    return out


def _cell(value: object) -> str:
    return "n/a" if value is None else f"{float(value):.1f}"


def constraint_markdown(
    rows: Mapping[str, Mapping[str, object]],
    per_direction: Mapping[str, Mapping[str, Mapping[str, object]]] | None = None,
) -> str:
    """Table 2 layout: one row per system (then the paper's rows), then per-direction rows per system.

    rows: system name -> merged rates; per_direction: system name -> direction -> rates.
    """
    header = "| Model | N | Lang. | Length | Format (N) | Mixing | Overall | ms/id swapped |"
    rule = "|:--|--:|--:|--:|--:|--:|--:|--:|"

    def line(name: str, r: Mapping[str, object]) -> str:
        return (
            f"| {name} | {r['n']} | {_cell(r['lang'])} | {_cell(r['length'])} | {_cell(r['format'])} ({r['format_n']}) "
            f"| {_cell(r['mixing'])} | {_cell(r['overall'])} | {r['ms_id_swapped']} |"
        )

    lines = ["Constraint verification (% pass), checks = the RL reward verifiers.", "", header, rule]
    lines.extend(line(name, r) for name, r in rows.items())
    for name, (lang, length, fmt, mixing, overall) in PAPER_CONSTRAINTS.items():
        lines.append(f"| {name} (paper) | | {lang} | {length} | {fmt} | {mixing} | {overall} | |")
    for name, directions in (per_direction or {}).items():
        lines += ["", f"Per direction: {name}", "", header, rule]
        lines.extend(line(d, r) for d, r in directions.items())
    return "\n".join(lines) + "\n"
