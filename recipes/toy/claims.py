"""A verdict on each of the paper's claims from the toy's measurements (reports/toy/claims.json).

Each verdict is one of "reproduced", "not reproduced", "inconclusive", decided by the rule written
beside it (fixed before the grid ran), with the numbers it read as evidence. Measures:
  entropy ratio  entropy_last / entropy_first of a run (grid.py's 10% windows)
  length drift   length_last / length_first - 1
  roughness      std of a series' step-to-step changes / mean of its absolute values (oscillation)
"""

from __future__ import annotations

import statistics

from vepo_mcore.eval.bootstrap import paired_mean_diff_ci

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
COLLAPSE = 0.7
"""An entropy ratio below this is a collapse; VEPO's band is [COLLAPSE, 1.5]."""
BAND = (COLLAPSE, 1.5)
STABLE = 0.1
"""A length drift within +-10% is stable."""


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


def _select(records: list[dict], algorithm: str, kl: str | None = None) -> list[dict]:
    return [r for r in records if r["algorithm"] == algorithm and (kl is None or r["kl"] == kl)]


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


def claim_c2(records: list[dict]) -> dict:
    rule = (f"GRPO's mean entropy ratio < {COLLAPSE} (collapse), every VEPO ratio in {list(BAND)}, and the "
            "paired-bootstrap 95% interval of VEPO - GRPO ratio over (seed, KL) pairs above 0; not reproduced when GRPO's "
            "mean ratio >= 0.85 or the interval is below 0")  # fmt: skip
    pairs = [(entropy_ratio(v), entropy_ratio(g)) for v in _select(records, "vepo")
             for g in _select(records, "grpo", v["kl"]) if g["seed"] == v["seed"]]  # fmt: skip
    if not pairs:
        return _verdict(INCONCLUSIVE, rule, missing="VEPO and GRPO runs")
    vepo, grpo = [p[0] for p in pairs], [p[1] for p in pairs]
    lo, hi = paired_mean_diff_ci(grpo, vepo)
    if _mean(grpo) < COLLAPSE and all(BAND[0] <= v <= BAND[1] for v in vepo) and lo > 0:
        verdict = REPRODUCED
    elif _mean(grpo) >= 0.85 or hi < 0:
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return _verdict(verdict, rule, vepo_ratio=vepo, grpo_ratio=grpo, diff_ci95=[lo, hi])


def claim_c3(records: list[dict]) -> dict:
    rule = (
        "KL none: PPO's entropy ratio below every VEPO seed's (reproduced) or above every one "
        "(not reproduced)"
    )
    vepo = [entropy_ratio(r) for r in _select(records, "vepo", "none")]
    ppo = [entropy_ratio(r) for r in _select(records, "ppo", "none")]
    if not vepo or not ppo:
        return _verdict(INCONCLUSIVE, rule, missing="VEPO or PPO without KL")
    verdict = REPRODUCED if max(ppo) < min(vepo) else NOT_REPRODUCED if min(ppo) > max(vepo) else INCONCLUSIVE
    return _verdict(verdict, rule, vepo_ratio=vepo, ppo_ratio=ppo)


def claim_c4(records: list[dict]) -> dict:
    rule = (
        f"VEPO's mean |length drift| <= {STABLE} while GRPO's and RLOO's mean drift > {STABLE}; not "
        "reproduced when VEPO drifts more than GRPO or RLOO"
    )
    drift = {a: [length_drift(r) for r in _select(records, a)] for a in ("vepo", "grpo", "rloo")}
    if not all(drift.values()):
        return _verdict(INCONCLUSIVE, rule, missing="VEPO, GRPO or RLOO runs")
    v = _mean([abs(d) for d in drift["vepo"]])
    others = [_mean(drift["grpo"]), _mean(drift["rloo"])]
    if v <= STABLE and min(others) > STABLE:
        verdict = REPRODUCED
    elif v > min(abs(o) for o in others):
        verdict = NOT_REPRODUCED
    else:
        verdict = INCONCLUSIVE
    return _verdict(verdict, rule, vepo_abs_drift=v, grpo_drift=others[0], rloo_drift=others[1],
                    vepo_drifts=drift["vepo"])  # fmt: skip


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


def claim_c6(histories: dict[str, list[dict]]) -> dict:
    rule = (
        "per run, the roughness of the measured k2 and k3 series each below k1's: in >= 80% of runs "
        "reproduced, <= 50% not reproduced (the grid optimises k2/k3, not k1: this compares the estimators)"
    )
    smoother = []
    for rows in histories.values():
        series = {k: [r[f"rl/kl_{k}"] for r in rows if f"rl/kl_{k}" in r] for k in ("k1", "k2", "k3")}
        if min(len(s) for s in series.values()) >= 3:
            r1 = roughness(series["k1"])
            smoother.append(roughness(series["k2"]) < r1 and roughness(series["k3"]) < r1)
    if not smoother:
        return _verdict(INCONCLUSIVE, rule, missing="KL series")
    share = sum(smoother) / len(smoother)
    verdict = REPRODUCED if share >= 0.8 else NOT_REPRODUCED if share <= 0.5 else INCONCLUSIVE
    return _verdict(verdict, rule, runs=len(smoother), share_smoother=share)


def claim_c7(study: dict | None) -> dict:
    rule = "mean answer entropy VEPO - SFT on the SFT policy's held-out answers: paired 95% interval above 0"
    if not study:
        return _verdict(INCONCLUSIVE, rule, missing="the decision-point study")
    lo, hi = study["entropy_delta_ci95"]
    verdict = REPRODUCED if lo > 0 else NOT_REPRODUCED if hi < 0 else INCONCLUSIVE
    return _verdict(verdict, rule, entropy_sft=study["entropy_sft"], entropy_vepo=study["entropy_rl"],
                    diff_ci95=[lo, hi], top1_sft=study["top1_sft"], top1_vepo=study["top1_rl"])  # fmt: skip


def all_claims(records: list[dict], histories: dict[str, list[dict]], overlong: tuple[list, list] | None,
               toy_summary: dict | None, study: dict | None) -> dict[str, dict]:  # fmt: skip
    """histories: run name -> per-step rows; overlong: DAPO's rows without and with the penalty."""
    return {
        "C1": claim_c1(toy_summary),
        "C2": claim_c2(records),
        "C3": claim_c3(records),
        "C4": claim_c4(records),
        "C5": claim_c5(*(overlong or (None, None)), records),
        "C6": claim_c6(histories),
        "C7": claim_c7(study),
    }
