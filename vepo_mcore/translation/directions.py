"""FLORES-200 translation directions: the 90 ordered pairs of the ten languages and their groups.

Groups follow the paper's Table 3: X->E (into English), E->X (out of English), X->X (neither
side English). "Avg" is the mean over all selected directions.

parse_directions("all")            # 90 directions in the paper's language order
parse_directions("en-th,th-en")    # explicit pairs
parse_directions("x2e,e2x")        # groups (18 directions)
"""

from __future__ import annotations

from dataclasses import dataclass

from vepo_mcore.languages import LANGS, language


@dataclass(frozen=True, order=True)
class Direction:
    """One ordered language pair, e.g. Direction("en", "th") written "en-th"."""

    src: str
    tgt: str

    def __str__(self) -> str:
        return f"{self.src}-{self.tgt}"

    @property
    def group(self) -> str:
        """'x2e', 'e2x' or 'x2x'."""
        if self.tgt == "en":
            return "x2e"
        if self.src == "en":
            return "e2x"
        return "x2x"

    @classmethod
    def parse(cls, text: str) -> Direction:
        """'en-th' -> Direction('en', 'th'); raises ValueError naming the bad part."""
        parts = text.strip().split("-")
        if len(parts) != 2:
            raise ValueError(f"direction {text!r} must look like 'src-tgt' (e.g. en-th)")
        src, tgt = (language(p).code for p in parts)
        if src == tgt:
            raise ValueError(f"direction {text!r} translates a language into itself")
        return cls(src, tgt)


ALL_DIRECTIONS: tuple[Direction, ...] = tuple(Direction(s, t) for s in LANGS for t in LANGS if s != t)
"""All 90 ordered pairs, source-major in the paper's language order."""

GROUPS: dict[str, str] = {"x2e": "X->E", "e2x": "E->X", "x2x": "X->X"}
"""Group key -> the paper's column name."""


def parse_directions(spec: str) -> list[Direction]:
    """Comma list of 'src-tgt' pairs and/or group names (x2e, e2x, x2x, all) -> directions.

    The result keeps the canonical order of ALL_DIRECTIONS and has no duplicates.
    """
    chosen: set[Direction] = set()
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if item == "all":
            chosen.update(ALL_DIRECTIONS)
        elif item in GROUPS:
            chosen.update(d for d in ALL_DIRECTIONS if d.group == item)
        elif "-" in item:
            chosen.add(Direction.parse(item))
        else:
            raise ValueError(
                f"unknown direction or group {item!r} in {spec!r}; use src-tgt pairs "
                f"(languages: {', '.join(LANGS)}) or groups: all, {', '.join(GROUPS)}"
            )
    if not chosen:
        raise ValueError(f"direction list {spec!r} selects nothing")
    return [d for d in ALL_DIRECTIONS if d in chosen]


def group_members(directions: list[Direction]) -> dict[str, list[Direction]]:
    """{'x2e': [...], 'e2x': [...], 'x2x': [...], 'avg': all} restricted to `directions` (empty groups dropped)."""
    groups = {key: [d for d in directions if d.group == key] for key in GROUPS}
    groups = {key: members for key, members in groups.items() if members}
    groups["avg"] = list(directions)
    return groups
