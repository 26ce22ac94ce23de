"""RLVR candidate filtering (SPEC section 4) and DAPO dynamic sampling.

Per prompt (samples sharing ``group_id``): K >= G scored candidates -> drop the non-compliant
ones (``Sample.compliant`` False: wrong language, length out of range, broken format, code-mixed)
-> keep the top G by reward. When fewer than G are compliant, the group is filled with the best
non-compliant candidates and the fill is logged. Metrics (namespaced for the logger):

    filter/compliance_rate   compliant candidates / all candidates
    filter/fill_rate         non-compliant samples kept / samples kept
    filter/groups_filled     groups that needed at least one non-compliant sample
    filter/filtered_share    candidates the filter removed / all candidates ((K - G) / K when it is
                             on; 0 when off, where the first G are kept unread, or when K = G)
    filter/noncompliant_removed  non-compliant candidates the filter removed / all candidates
"""

from __future__ import annotations

from collections import OrderedDict

from vepo_mcore.translation.sample import Sample


def group_by_prompt(samples: list[Sample]) -> OrderedDict[int, list[Sample]]:
    """{group_id: samples of that prompt}, in first-seen order."""
    groups: OrderedDict[int, list[Sample]] = OrderedDict()
    for sample in samples:
        groups.setdefault(sample.group_id, []).append(sample)
    return groups


def select_group(candidates: list[Sample], group_size: int) -> tuple[list[Sample], int]:
    """(top-``group_size`` compliant candidates by reward, filled with the best non-compliant ones;
    number of fills). Ties keep the candidates' original order (sorting is stable)."""
    if len(candidates) < group_size:
        raise ValueError(
            f"prompt group {candidates[0].group_id if candidates else '?'} has {len(candidates)} candidates, "
            f"fewer than rl.filtering.group_size = {group_size}"
        )
    ranked = sorted(candidates, key=lambda s: s.reward, reverse=True)
    compliant = [s for s in ranked if s.compliant]
    kept = compliant[:group_size]
    fills = group_size - len(kept)
    if fills:
        kept += [s for s in ranked if not s.compliant][:fills]
    return kept, fills


def filter_candidates(
    samples: list[Sample], group_size: int, enabled: bool = True
) -> tuple[list[Sample], dict[str, float]]:
    """Apply RLVR filtering to all prompt groups; returns (kept samples grouped by prompt, metrics).

    With ``enabled`` False the first ``group_size`` candidates of each group are kept (no filtering),
    and the compliance rate is still measured.
    """
    kept: list[Sample] = []
    fills = groups_filled = 0
    for candidates in group_by_prompt(samples).values():
        if enabled:
            chosen, group_fills = select_group(candidates, group_size)
        else:
            chosen, group_fills = candidates[:group_size], 0
        kept += chosen
        fills += group_fills
        groups_filled += group_fills > 0
    n = len(samples)
    metrics = {
        "filter/compliance_rate": sum(s.compliant for s in samples) / n if n else 1.0,
        "filter/fill_rate": fills / len(kept) if kept else 0.0,
        "filter/groups_filled": float(groups_filled),
        "filter/candidates": float(n),
        "filter/kept": float(len(kept)),
        "filter/filtered_share": (n - len(kept)) / n if n and enabled else 0.0,
        "filter/noncompliant_removed": _removed_noncompliant(samples, kept) / n if n and enabled else 0.0,
    }
    return kept, metrics


def _removed_noncompliant(samples: list[Sample], kept: list[Sample]) -> int:
    kept_ids = {id(s) for s in kept}
    return sum(not s.compliant and id(s) not in kept_ids for s in samples)


def dynamic_sampling(samples: list[Sample], tol: float = 1e-8) -> tuple[list[Sample], dict[str, float]]:
    """DAPO dynamic sampling: drop prompt groups whose rewards are all equal (within ``tol``): their
    group-relative advantages are zero and carry no gradient. Returns (kept samples, metrics); the
    caller samples more prompts until the batch is full."""
    kept: list[Sample] = []
    dropped = 0
    groups = group_by_prompt(samples)
    for members in groups.values():
        rewards = [s.reward for s in members]
        if max(rewards) - min(rewards) <= tol:
            dropped += 1
        else:
            kept += members
    metrics = {
        "filter/groups_dropped_constant": float(dropped),
        "filter/groups_kept": float(len(groups) - dropped),
    }
    return kept, metrics
