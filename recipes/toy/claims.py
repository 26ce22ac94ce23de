"""A verdict on each of the paper's claims from the toy's measurements (reports/toy/claims.json).

Each verdict is one of "reproduced", "not reproduced", "partly reproduced" (C6: one estimator
reproduced, the other not), "inconclusive" (the data sit between the rule's two ends, or are
missing) or "untested" (the claim's premise does not hold in the data: a claim about collapse where
the baseline does not collapse; its measured premise is in the evidence). The rule written beside
each verdict was fixed before the grid ran; the evidence holds the numbers it read. Measures:
  entropy ratio  entropy_last / entropy_first of a run (grid.py's 10% windows); a collapse is a
                 ratio below COLLAPSE (the entropy falls below half its start)
  length drift   length_last / length_first - 1; compared as |drift| for every algorithm
  roughness      std of a series' step-to-step changes / mean of its absolute values (oscillation)
Algorithm claims read the full runs (variant "full"); each VEPO ablation gets a verdict on the claim
the paper ties its part to (ABLATION_CLAIMS) and the paired moves of every claim's measure; an
entropy-tied one also says whether the entropy leaves VEPO's band (BAND_RULE). An ablation is read
at ABLATION_SEEDS seeds. "kl_arm" asks why VEPO with k3 gains less than GRPO with k3 (KL_ARM_RULE).
"""

from __future__ import annotations

import math
import statistics

from vepo_mcore.eval.bootstrap import mean_value_ci, paired_mean_diff_ci

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
PARTLY, UNTESTED = "partly reproduced", "untested"
COLLAPSE = 0.5
"""An entropy ratio below this is a collapse (the entropy fell below half its start)."""
BAND = (COLLAPSE, 1.5)
"""VEPO's entropy band: neither collapsed nor blown up."""
STABLE = 0.1
"""A length drift within +-10% is stable."""
SMOOTHER_SHARE = (0.5, 0.8)
"""C6: share of runs where an estimator is smoother than k1, at or below which the claim is not
reproduced, at or above which it is."""
PREMISE_TOP1 = 0.5
"""C7's premise: the SFT policy concentrates its mass, a mean top-1 probability over its held-out
answer positions of at least this (the paper's decision point has 0.85 on one token)."""
CORRELATED, UNCORRELATED = 0.3, 0.1
"""C8: a mean within-step Pearson r (response length vs mean token entropy) of at least CORRELATED
with its interval above 0 reproduces the correlation; an interval below UNCORRELATED does not."""
ABLATION_KL = "none"
KL_ARM = ("group_std", "k3")
"""grid.KL_ARM: the ablation that also runs with k3 in the loss, and its KL."""
ABLATION_CLAIMS = {
    "no_entropy_shaping": "C2",
    "no_entropy_bonus": "C2",
    "tau1_ratio": "C2",
    "symmetric_clip": "C2",
    "group_std": "C2",
    "seq_mean": "C4",
}
"""The claim the paper ties each VEPO part to: the entropy-shaped advantage, the entropy bonus,
temperature-consistent ratios ("neglecting this consistency leads to ... premature training
collapse"), clip-higher and the micro-batch std (stable clipping) keep the policy from collapsing
(C2); token-level normalisation suppresses the verbosity bias (C4)."""


def entropy_ratio(record: dict) -> float:
    return record["entropy_last"] / record["entropy_first"]


def length_drift(record: dict) -> float:
    return record["length_last"] / record["length_first"] - 1.0


def roughness(values: list[float]) -> float:
    if len(values) < 3:
        return 0.0
    diffs = [b - a for a, b in zip(values, values[1:])]
    scale = sum(abs(v) for v in values) / len(values)
    return statistics.pstdev(diffs) / scale if scale > 0 else 0.0


def _select(records: list[dict], algorithm: str, kl: str | None = None, variant: str = "full") -> list[dict]:
    return [r for r in records if r["algorithm"] == algorithm and (kl is None or r["kl"] == kl)
            and r.get("variant", "full") == variant]  # fmt: skip


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _round(x):
    return round(x, 4) if isinstance(x, float) else x


def _verdict(verdict: str, rule: str, **evidence) -> dict:
    return {"verdict": verdict, "rule": rule,
            "evidence": {k: ([_round(v) for v in x] if isinstance(x, list | tuple) else _round(x))
                         for k, x in evidence.items()}}  # fmt: skip


def claim_c1(toy_summary: dict | None) -> dict:
    rule = "RL - SFT overall pass rate: 95% interval above 0 on every seed"
    if not toy_summary:
        return _verdict(INCONCLUSIVE, rule, missing="reports/toy/summary.json")
    lows = [s["delta_ci95"]["overall_pass"][0] for s in toy_summary["per_seed"]]
    gain = toy_summary["rl"]["overall_pass"] - toy_summary["sft"]["overall_pass"]
    verdict = REPRODUCED if min(lows) > 0 else INCONCLUSIVE if gain > 0 else NOT_REPRODUCED
    return _verdict(verdict, rule, sft_overall=toy_summary["sft"]["overall_pass"],
                    rl_overall=toy_summary["rl"]["overall_pass"], paper_rl_overall=95.3,
                    interval_lower_ends=lows)  # fmt: skip


def _half_steps(records: list[dict], algorithm: str) -> list:
    """The step each run's entropy fell below half its start (grid.half_entropy_step; None: never)."""
    return [r.get("entropy_half_step") for r in _select(records, algorithm)]


def _diversity(records: list[dict]) -> dict:
    """Beside the entropy rule of C2 (no part of its verdict), per run ("vepo kl-none s0"): how much
    alike its G samples of one prompt grew (group chrF++ last - first) and how often its held-out
    answers open like their direction's most common opening."""
    evidence: dict[str, dict[str, float]] = {}
    for algorithm in ("vepo", "grpo"):
        runs = {f"{r['algorithm']} kl-{r['kl']} s{r['seed']}": r for r in _select(records, algorithm)}
        evidence[f"{algorithm}_group_chrf_change"] = {
            name: round(r["group_chrf_last"] - r["group_chrf_first"], 2) for name, r in runs.items()
            if r.get("group_chrf_last") is not None and r.get("group_chrf_first") is not None
        }  # fmt: skip
        evidence[f"{algorithm}_heldout_same_opening"] = {
            name: round(r["heldout_same_opening"], 1) for name, r in runs.items()
            if r.get("heldout_same_opening") is not None
        }  # fmt: skip
    return evidence


def claim_c2(records: list[dict]) -> dict:
    rule = (f"untested when GRPO's mean entropy ratio >= {COLLAPSE} (the baseline does not collapse); else "
            f"reproduced when every VEPO ratio is in {list(BAND)} and the paired-bootstrap 95% interval of "
            f"VEPO - GRPO over (seed, KL) pairs is above 0, not reproduced when VEPO's mean ratio < {COLLAPSE} "
            "(it collapses too) or the interval is below 0")  # fmt: skip
    pairs = [(entropy_ratio(v), entropy_ratio(g)) for v in _select(records, "vepo")
             for g in _select(records, "grpo", v["kl"]) if g["seed"] == v["seed"]]  # fmt: skip
    if not pairs:
        return _verdict(INCONCLUSIVE, rule, missing="VEPO and GRPO runs")
    vepo, grpo = [p[0] for p in pairs], [p[1] for p in pairs]
    if _mean(grpo) >= COLLAPSE:
        return _verdict(UNTESTED, rule, premise="GRPO collapses", grpo_mean_ratio=_mean(grpo),
                        grpo_ratio=grpo, vepo_ratio=vepo, grpo_half_entropy_steps=_half_steps(records, "grpo"),
                        **_diversity(records))  # fmt: skip
    lo, hi = paired_mean_diff_ci(grpo, vepo)
    if all(BAND[0] <= v <= BAND[1] for v in vepo) and lo > 0:
        verdict = REPRODUCED
    elif _mean(vepo) < COLLAPSE or hi < 0:
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return _verdict(verdict, rule, vepo_ratio=vepo, grpo_ratio=grpo, diff_ci95=[lo, hi],
                    grpo_half_entropy_steps=_half_steps(records, "grpo"), **_diversity(records))  # fmt: skip


def claim_c3(records: list[dict]) -> dict:
    rule = (
        f"KL none: untested when PPO's mean entropy ratio >= {COLLAPSE} (PPO does not collapse); else "
        "reproduced when PPO's ratio is below every VEPO seed's, not reproduced when it is above every one"
    )
    vepo = [entropy_ratio(r) for r in _select(records, "vepo", "none")]
    ppo = [entropy_ratio(r) for r in _select(records, "ppo", "none")]
    if not vepo or not ppo:
        return _verdict(INCONCLUSIVE, rule, missing="VEPO or PPO without KL")
    if _mean(ppo) >= COLLAPSE:
        return _verdict(UNTESTED, rule, premise="PPO collapses", ppo_ratio=ppo, vepo_ratio=vepo)
    verdict = REPRODUCED if max(ppo) < min(vepo) else NOT_REPRODUCED if min(ppo) > max(vepo) else INCONCLUSIVE
    return _verdict(verdict, rule, vepo_ratio=vepo, ppo_ratio=ppo)


def claim_c4(records: list[dict]) -> dict:
    rule = (
        f"mean |length drift| of each algorithm over the KL regimes all three ran: not reproduced when "
        f"VEPO's exceeds GRPO's or RLOO's; untested when neither GRPO nor RLOO drifts more than {STABLE}; "
        f"reproduced when VEPO's <= {STABLE} and both others' > {STABLE}"
    )
    kls = set.intersection(*({r["kl"] for r in _select(records, a)} for a in ("vepo", "grpo", "rloo")))
    drift = {a: [abs(length_drift(r)) for r in _select(records, a) if r["kl"] in kls]
             for a in ("vepo", "grpo", "rloo")}  # fmt: skip
    if not kls:
        return _verdict(INCONCLUSIVE, rule, missing="VEPO, GRPO and RLOO runs in a common KL regime")
    v, g, r = (_mean(drift[a]) for a in ("vepo", "grpo", "rloo"))
    if v > min(g, r):
        verdict = NOT_REPRODUCED
    elif max(g, r) <= STABLE:
        verdict = UNTESTED
    elif v <= STABLE and min(g, r) > STABLE:
        verdict = REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return _verdict(verdict, rule, kl=sorted(kls), vepo_abs_drift=v, grpo_abs_drift=g, rloo_abs_drift=r,
                    vepo_abs_drifts=drift["vepo"])  # fmt: skip


def claim_c5(off: list[dict] | None, on: list[dict] | None, records: list[dict]) -> dict:
    """off, on: the per-step rows of DAPO without and with the overlong penalty."""
    rule = (
        f"entropy roughness of DAPO with the overlong penalty >= 1.25x without it, and VEPO's mean "
        f"|length drift| <= {STABLE} (no penalty); not reproduced when the ratio <= 1 (one seed per arm)"
    )
    if not on or not off:
        return _verdict(INCONCLUSIVE, rule, missing="the DAPO overlong pair")
    rough_on = roughness([r["rollout/entropy"] for r in on])
    rough_off = roughness([r["rollout/entropy"] for r in off])
    ratio = rough_on / rough_off if rough_off > 0 else float("inf")
    vepo = _mean([abs(length_drift(r)) for r in _select(records, "vepo")])
    verdict = (
        REPRODUCED if ratio >= 1.25 and vepo <= STABLE else NOT_REPRODUCED if ratio <= 1.0 else INCONCLUSIVE
    )
    return _verdict(verdict, rule, roughness_overlong=rough_on, roughness_plain=rough_off,
                    ratio=ratio, vepo_abs_drift=vepo)  # fmt: skip


def _share_verdict(share: float) -> str:
    low, high = SMOOTHER_SHARE
    return REPRODUCED if share >= high else NOT_REPRODUCED if share <= low else INCONCLUSIVE


def claim_c6(histories: dict[str, list[dict]]) -> dict:
    rule = (
        f"judged for k2 and k3 separately: per run, is the measured series' roughness below k1's; in >= "
        f"{SMOOTHER_SHARE[1]:.0%} of runs reproduced, <= {SMOOTHER_SHARE[0]:.0%} not reproduced. Both the "
        "same: that verdict; one reproduced and one not: partly reproduced; else inconclusive"
    )
    smoother: dict[str, list[bool]] = {"k2": [], "k3": []}
    for rows in histories.values():
        series = {k: [r[f"rl/kl_{k}"] for r in rows if f"rl/kl_{k}" in r] for k in ("k1", "k2", "k3")}
        if min(len(s) for s in series.values()) >= 3:
            r1 = roughness(series["k1"])
            for k in smoother:
                smoother[k].append(roughness(series[k]) < r1)
    if not smoother["k2"]:
        return _verdict(INCONCLUSIVE, rule, missing="KL series")
    share = {k: sum(v) / len(v) for k, v in smoother.items()}
    each = {k: _share_verdict(s) for k, s in share.items()}
    if each["k2"] == each["k3"]:
        verdict = each["k2"]
    elif {each["k2"], each["k3"]} == {REPRODUCED, NOT_REPRODUCED}:
        verdict = PARTLY
    else:
        verdict = INCONCLUSIVE
    return _verdict(verdict, rule, runs=len(smoother["k2"]), share_k2_smoother=share["k2"],
                    share_k3_smoother=share["k3"], k2=each["k2"], k3=each["k3"])  # fmt: skip


def claim_c7(study: dict | None) -> dict:
    rule = (f"untested when the SFT policy's mean top-1 probability over its held-out answer positions is below "
            f"{PREMISE_TOP1} (it does not concentrate its mass); else mean answer entropy VEPO - SFT: paired "
            "95% interval above 0 reproduced, below 0 not reproduced")  # fmt: skip
    if not study:
        return _verdict(INCONCLUSIVE, rule, missing="the decision-point study")
    lo, hi = study["entropy_delta_ci95"]
    evidence = dict(top1_sft=study["top1_sft"], top1_vepo=study["top1_rl"], entropy_sft=study["entropy_sft"],
                    entropy_vepo=study["entropy_rl"], diff_ci95=[lo, hi])  # fmt: skip
    if study["top1_sft"] < PREMISE_TOP1:
        return _verdict(UNTESTED, rule, premise="the SFT policy concentrates its mass", **evidence)
    verdict = REPRODUCED if lo > 0 else NOT_REPRODUCED if hi < 0 else INCONCLUSIVE
    return _verdict(verdict, rule, **evidence)


def _pearson(x: list[float], y: list[float]) -> float:
    if len(x) < 3:
        return float("nan")
    mx, my = _mean(x), _mean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def claim_c8(records: list[dict], histories: dict[str, list[dict]] | None = None) -> dict:
    rule = (
        "per run, the mean over steps of the within-step Pearson r between a response's length and its mean "
        f"token entropy (rollout/entropy_len_corr); over the full runs, mean r >= {CORRELATED} with a 95% "
        f"interval above 0 reproduced, an interval below {UNCORRELATED} not reproduced"
    )
    values = [r["entropy_len_corr_mean"] for r in records
              if r.get("variant", "full") == "full" and r.get("entropy_len_corr_mean") is not None]  # fmt: skip
    if not values:
        return _verdict(INCONCLUSIVE, rule, missing="rollout/entropy_len_corr")
    lo, hi = mean_value_ci(values)
    mean = _mean(values)
    verdict = (
        REPRODUCED if mean >= CORRELATED and lo > 0 else NOT_REPRODUCED if hi < UNCORRELATED else INCONCLUSIVE
    )
    across = [_pearson([r["rollout/entropy"] for r in rows if "rollout/len_mean" in r],
                       [r["rollout/len_mean"] for r in rows if "rollout/len_mean" in r])
              for rows in (histories or {}).values()]  # fmt: skip
    across = [c for c in across if c == c]
    return _verdict(verdict, rule, runs=len(values), mean_r=mean, ci95=[lo, hi], min_r=min(values),
                    max_r=max(values), across_steps_mean_r=_mean(across) if across else None)  # fmt: skip


def _paired(records: list[dict], variant: str, measure) -> tuple[list[float], list[float]]:
    """(full, ablated) values of `measure` on the seeds both ran at ABLATION_KL."""
    full = {r["seed"]: r for r in _select(records, "vepo", ABLATION_KL)}
    ablated = {r["seed"]: r for r in _select(records, "vepo", ABLATION_KL, variant)}
    seeds = sorted(s for s in full.keys() & ablated.keys()
                   if measure(full[s]) is not None and measure(ablated[s]) is not None)  # fmt: skip
    return [measure(full[s]) for s in seeds], [measure(ablated[s]) for s in seeds]


MEASURES = {
    "C2": ("entropy_ratio", entropy_ratio),
    "C4": ("abs_length_drift", lambda r: abs(length_drift(r))),
    "C8": ("entropy_len_corr", lambda r: r.get("entropy_len_corr_mean")),
    "quality": ("heldout_chrf", lambda r: r.get("heldout_chrf")),
    "diversity": ("group_chrf_last", lambda r: r.get("group_chrf_last")),
}
"""What each claim reads from a run; an ablation moves a claim when the paired 95% interval of
ablated - full excludes 0 (quality and diversity are reported beside the claims)."""
ABLATION_SEEDS = 3
"""Seeds an ablation's paired interval needs before it is read (the grid's plan): over fewer, its
moves are not listed, its band finding and any verdict but untested are inconclusive."""


BAND_RULE = (
    f"whatever GRPO does: removing the part takes the entropy out of VEPO's band {list(BAND)} when full "
    f"VEPO's mean ratio is inside it, the ablated mean ratio is outside it and the paired 95% interval of "
    f"ablated - full over seeds excludes 0 on that side; it stays in the band when the ablated mean ratio "
    f"is inside it"
)
"""The second question each entropy-tied ablation answers: does the part keep the entropy from blowing
up as well as from collapsing (the paper's "stable entropy")? Read even where the collapse verdict is
untested."""


def _band_finding(full_mean: float, ablated_mean: float, diff_ci95: list[float]) -> str:
    """BAND_RULE on the mean entropy ratios of full VEPO and the ablation over their seeds and the
    paired interval of ablated - full: one of "leaves the band upward", "leaves the band downward",
    "stays in the band", "inconclusive"."""
    lo, hi = diff_ci95
    if BAND[0] <= ablated_mean <= BAND[1]:
        return "stays in the band"
    if BAND[0] <= full_mean <= BAND[1] and ablated_mean > BAND[1] and lo > 0:
        return "leaves the band upward"
    if BAND[0] <= full_mean <= BAND[1] and ablated_mean < BAND[0] and hi < 0:
        return "leaves the band downward"
    return INCONCLUSIVE


def claim_ablation(records: list[dict], variant: str) -> dict:
    """The verdict on the claim ABLATION_CLAIMS ties `variant`'s part to, with every measure's move."""
    claim = ABLATION_CLAIMS[variant]
    if claim == "C2":
        rule = (f"removing the part brings the collapse back: untested when GRPO's mean entropy ratio >= "
                f"{COLLAPSE} or full VEPO's < {COLLAPSE}; reproduced when the ablated mean ratio < {COLLAPSE} and "
                f"the paired interval of full - ablated over seeds is above 0; not reproduced when the ablated "
                f"mean ratio >= {COLLAPSE}; evidence band: {BAND_RULE}")  # fmt: skip
    else:
        rule = (f"removing the part brings the length drift back: untested when GRPO's mean |drift| <= {STABLE} "
                f"or full VEPO's > {STABLE}; reproduced when the ablated mean |drift| > {STABLE} and the paired "
                f"interval of ablated - full over seeds is above 0; not reproduced when it is <= {STABLE}")  # fmt: skip
    rule += f"; an interval over fewer than {ABLATION_SEEDS} seeds is not read (inconclusive)"
    full, ablated = _paired(records, variant, MEASURES[claim][1])
    if not full:
        return _verdict(INCONCLUSIVE, rule, claim=claim, missing=f"VEPO full and {variant} on a common seed")
    moves, evidence = [], {"claim": claim, "seeds": len(full)}
    for name, (label, measure) in MEASURES.items():
        a, b = _paired(records, variant, measure)
        if a:
            lo, hi = paired_mean_diff_ci(a, b)
            evidence[f"{label}_full"], evidence[f"{label}_ablated"] = _mean(a), _mean(b)
            evidence[f"{label}_diff_ci95"] = [lo, hi]
            if name.startswith("C") and len(a) >= ABLATION_SEEDS and (lo > 0 or hi < 0):
                moves.append(name)
    evidence["moves"] = moves
    baseline = [MEASURES[claim][1](r) for r in _select(records, "grpo", ABLATION_KL)]
    evidence["grpo_mean"] = _mean(baseline) if baseline else None
    if claim == "C2":
        evidence["band"] = (
            _band_finding(_mean(full), _mean(ablated), evidence["entropy_ratio_diff_ci95"])
            if len(full) >= ABLATION_SEEDS else INCONCLUSIVE
        )  # fmt: skip
        lo, _ = paired_mean_diff_ci(ablated, full)  # full - ablated
        if not baseline or _mean(baseline) >= COLLAPSE or _mean(full) < COLLAPSE:
            verdict = UNTESTED
        elif _mean(ablated) < COLLAPSE and lo > 0:
            verdict = REPRODUCED
        else:
            verdict = NOT_REPRODUCED if _mean(ablated) >= COLLAPSE else INCONCLUSIVE
    else:
        lo, _ = paired_mean_diff_ci(full, ablated)  # ablated - full
        if not baseline or _mean(baseline) <= STABLE or _mean(full) > STABLE:
            verdict = UNTESTED
        elif _mean(ablated) > STABLE and lo > 0:
            verdict = REPRODUCED
        else:
            verdict = NOT_REPRODUCED if _mean(ablated) <= STABLE else INCONCLUSIVE
    if verdict != UNTESTED and len(full) < ABLATION_SEEDS:
        verdict = INCONCLUSIVE
    return _verdict(verdict, rule, **evidence)


KL_ARM_RULE = (
    "VEPO with k3 gains less devtest chrF++ than GRPO with k3 because its advantages, divided by the rollout "
    "batch's reward std, are smaller and so weigh the KL term more: untested unless the paired 95% interval of "
    "GRPO-k3 - VEPO-k3 over seeds is above 0 (a gap); explained when VEPO with the group std and k3 - VEPO-k3 has "
    "a paired interval above 0 and its mean closes at least half the gap; partly explained when the interval is "
    "above 0 and it closes less; not explained when the interval holds 0 or lies below it"
)


def claim_kl_arm(records: list[dict], variant: str, kl: str) -> dict:
    """KL_ARM_RULE on VEPO, GRPO and VEPO's ablation `variant`, each with `kl`, paired by seed."""
    rule = f"{KL_ARM_RULE}; an interval over fewer than {ABLATION_SEEDS} seeds is not read (inconclusive)"
    arms = {name: {r["seed"]: r for r in _select(records, algorithm, kl, v) if r.get("heldout_chrf") is not None}
            for name, algorithm, v in (("vepo", "vepo", "full"), ("grpo", "grpo", "full"), ("arm", "vepo", variant))}  # fmt: skip
    seeds = sorted(arms["vepo"].keys() & arms["grpo"].keys() & arms["arm"].keys())
    if not seeds:
        missing = f"VEPO, GRPO and VEPO-{variant} at KL {kl} on a common seed"
        return _verdict(INCONCLUSIVE, rule, missing=missing)
    evidence: dict = {"variant": variant, "kl": kl, "seeds": len(seeds)}
    for field in ("heldout_chrf", "kl_k3_last", "adv_std_mean"):
        for name, runs in arms.items():
            values = [runs[s].get(field) for s in seeds]
            evidence[f"{field}_{name}"] = _mean(values) if None not in values else None
    chrf = {name: [runs[s]["heldout_chrf"] for s in seeds] for name, runs in arms.items()}
    gap = paired_mean_diff_ci(chrf["vepo"], chrf["grpo"])
    closed = paired_mean_diff_ci(chrf["vepo"], chrf["arm"])
    evidence["gap_ci95"], evidence["arm_minus_vepo_ci95"] = list(gap), list(closed)
    mean = {name: evidence[f"heldout_chrf_{name}"] for name in arms}
    gap_mean = mean["grpo"] - mean["vepo"]
    evidence["gap_closed_share"] = (mean["arm"] - mean["vepo"]) / gap_mean if gap_mean else None
    if len(seeds) < ABLATION_SEEDS:
        verdict = INCONCLUSIVE
    elif gap[0] <= 0:
        verdict = UNTESTED
    elif closed[0] > 0:
        verdict = "explained" if evidence["gap_closed_share"] >= 0.5 else "partly explained"
    else:
        verdict = "not explained"
    return _verdict(verdict, rule, **evidence)


def all_claims(records: list[dict], histories: dict[str, list[dict]], overlong: tuple[list, list] | None,
               toy_summary: dict | None, study: dict | None) -> dict[str, dict]:  # fmt: skip
    """histories: run name -> per-step rows; overlong: DAPO's rows without and with the penalty.
    C1-C8, then "ablation/<variant>" for every ablation that ran, then "kl_arm" when its runs did."""
    claims = {
        "C1": claim_c1(toy_summary),
        "C2": claim_c2(records),
        "C3": claim_c3(records),
        "C4": claim_c4(records),
        "C5": claim_c5(*(overlong or (None, None)), records),
        "C6": claim_c6(histories),
        "C7": claim_c7(study),
        "C8": claim_c8(records, histories),
    }
    variants = {r.get("variant", "full") for r in records} - {"full"}
    for variant in ABLATION_CLAIMS:
        if variant in variants:
            claims[f"ablation/{variant}"] = claim_ablation(records, variant)
    if _select(records, "vepo", KL_ARM[1], KL_ARM[0]):
        claims["kl_arm"] = claim_kl_arm(records, *KL_ARM)
    return claims
